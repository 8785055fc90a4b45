"""A loss that goes non-finite or explodes is said at once: one WARNING line per loss component, the first time."""

from __future__ import annotations

import logging
import math

from ppmulti.rank.engine.hooks.base import Hook, host_losses

log = logging.getLogger("ppmulti")

JUMP = 1e3          # a component this many times its running value has exploded (three orders of magnitude)
ABSURD = 1e8        # ... and a value this large has, whatever came before (detection losses are normalised)
SETTLE_STEPS = 3    # finite steps a component needs before its running value is trusted
DECAY = 0.9         # the running value: an exponential mean of the finite magnitudes


class LossWatchHook(Hook):
    """After every step, each ``loss*`` component on the host (the same copy the console takes, ``StepOutputs``):
    NaN or infinity, or a value ``JUMP`` times its running value (or above ``ABSURD``), gets one WARNING line in
    this rank's log (rank 0's is the console) naming the component, the step and what to try. Each component is
    said once per kind (non-finite, exploded) per run: a diverged run does not fill the console. No state."""

    priority = 45   # before the console's step line, which then shows the value the warning named

    def __init__(self) -> None:
        self.running: dict[str, float] = {}
        self.seen: dict[str, int] = {}
        self.said: set[tuple[str, str]] = set()

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        for key, value in host_losses(outputs).items():
            where = f"epoch {epoch + 1} step {step + 1}"
            if not math.isfinite(value):
                self._say(key, "nonfinite", f"{key} is {value} at {where}: the training has diverged (its weights "
                                            f"are no longer finite from here); lower the learning rate (base_lr, "
                                            f"--hyp lr0), lengthen the warmup or check the labels for broken boxes")
                continue
            magnitude = abs(value)
            running = self.running.get(key)
            settled = self.seen.get(key, 0) >= SETTLE_STEPS
            if magnitude > ABSURD or (settled and running is not None and magnitude > JUMP * max(running, 1e-12)):
                before = f"{running:.4g}" if running is not None else "none yet"
                self._say(key, "exploded", f"{key}={value:.4g} at {where} has exploded (its running value: "
                                           f"{before}); the training is diverging: lower the learning rate "
                                           f"(base_lr, --hyp lr0), lengthen the warmup or check the labels")
                continue   # an outlier stays out of the running value
            self.running[key] = magnitude if running is None else DECAY * running + (1 - DECAY) * magnitude
            self.seen[key] = self.seen.get(key, 0) + 1

    def _say(self, key: str, kind: str, message: str) -> None:
        if (key, kind) not in self.said:
            self.said.add((key, kind))
            log.warning("%s", message)
