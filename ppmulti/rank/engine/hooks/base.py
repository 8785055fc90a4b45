"""The hook contract: the fixed table of hook points, the Hook base class and a step's outputs."""

from __future__ import annotations

from typing import Any

# The only names the Trainer calls, in the order a run meets them (``Trainer.call`` refuses others, so a
# misspelt override is not silently never called). Every point gets the trainer first.
#
# point        arguments                                     when
# before_train (trainer)                                     once, before the first epoch
# before_epoch (trainer, epoch)                              each epoch, before its first step
# before_step  (trainer, epoch, step)                        each step, before the forward pass
# after_step   (trainer, epoch, step, outputs, lr, data_time) after the optimizer and lr step
# after_epoch  (trainer, stats)                              an epoch that ran to its end (EpochStats)
# after_train  (trainer)                                     after the last epoch, an early stop or a stop
#                                                            on a signal (then ``trainer.interrupted`` is set)
# close        (trainer)                                     always last, also when training raised
HOOK_POINTS = ("before_train", "before_epoch", "before_step", "after_step", "after_epoch", "after_train", "close")


class Hook:
    """Called by the Trainer at the points of ``HOOK_POINTS``; override what you need.

    Hooks run in ascending ``priority`` at every point (registration order among equals), so an order such
    as "EMA update right after the optimizer step, evaluate before checkpointing" is stated by the hooks
    themselves, not by where they were registered. A hook with state for resume names itself with
    ``name`` and returns that state from ``state_dict()`` (plain values and tensors: the file must not
    depend on where our classes live). The checkpoint hook writes an epoch's ``weights/`` files while the next
    epoch trains; before a hook's ``after_epoch`` the trainer finishes that write, unless the hook says it reads
    no weights files (``reads_weights = False``).
    """

    priority: int = 95        # user hooks: after the built-in reporting hooks, before the stop-on-signal vote
    name: str | None = None   # key of this hook's state in a checkpoint; None: the hook keeps none
    reads_weights: bool = True   # its after_epoch may read weights/ files: the trainer waits for their write first

    def before_train(self, trainer) -> None: ...

    def before_epoch(self, trainer, epoch: int) -> None: ...

    def before_step(self, trainer, epoch: int, step: int) -> None: ...

    def after_step(self, trainer, epoch: int, step: int, outputs: dict, lr: float, data_time: float) -> None: ...

    def after_epoch(self, trainer, stats) -> None: ...

    def after_train(self, trainer) -> None: ...

    def close(self, trainer) -> None:
        """Always last, after ``after_train`` or when training raised: give back what ``before_train`` took."""

    def state_dict(self) -> dict[str, Any] | None:
        """What this hook needs to continue after a resume; None: nothing."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what ``state_dict`` returned (read from a checkpoint)."""


class StepOutputs(dict):
    """One step's outputs (loss tensors by name); ``losses()`` copies the losses to the host once per step,
    whichever hook asks first (the console and VisualDL log at the same steps)."""

    _host: dict[str, float] | None = None

    def losses(self) -> dict[str, float]:
        if self._host is None:
            self._host = {k: float(v.numpy().reshape(-1)[0]) for k, v in self.items() if k.startswith("loss")}
        return self._host


def host_losses(outputs: dict) -> dict[str, float]:
    """The loss values of ``outputs`` as floats (a plain dict, as tests pass, is copied each time)."""
    return (outputs if isinstance(outputs, StepOutputs) else StepOutputs(outputs)).losses()
