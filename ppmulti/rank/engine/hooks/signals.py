"""Stop on a signal: Ctrl-C / SIGTERM finish the step on every rank, save, say how to resume, exit 128 + signum."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ppmulti.rank import dist
from ppmulti.rank.engine.hooks.base import Hook

log = logging.getLogger("ppmulti")


class Interrupted(SystemExit):
    """Training stopped on a signal after saving; exits with 128 + the signal number, as a shell would."""

    def __init__(self, signal_name: str, code: int):
        super().__init__(code)
        self.signal_name = signal_name


@dataclass
class Interruption:
    """Where a signal stopped the run; ``trainer.interrupted`` while the run winds down."""

    signum: int
    epoch: int                    # 0-based epoch it stopped in (or after)
    step: int | None              # 0-based last step done; None: stopped after the whole epoch
    checkpoint: Path | None = None   # the checkpoint hook's save, for the message


class StopOnSignalHook(Hook):
    """SIGINT/SIGTERM handlers that only take note; the ranks agree on stopping at a step boundary.

    Stopping where the signal lands would leave a rank inside an all-reduce its peers never join, so the ranks sum
    their flags (one all-reduce of two numbers: which signals came) after every step that stepped the optimizer
    and all stop at the same step: within a step of the signal, or within an accumulation's batches when several
    batches make one optimizer step. There the gradients' all-reduce has just brought the ranks together, so the
    vote makes none wait; a vote after each micro-step would hold every rank to the slowest one's pace at every
    batch, and a stop there would drop the accumulation's batches anyway (the resume redoes them). One process
    checks its own flag after every step. ``trainer.stop_training`` and ``trainer.interrupted`` are set, the loop
    ends, the checkpoint hook saves where the run stands (mid-epoch: ``step_in_epoch`` and the epoch's running
    losses), and ``after_train`` here raises ``Interrupted``. The loader workers never see the signal
    (``feed.shield_workers``), so only the ranks decide. A second Ctrl-C stops at once, without a checkpoint.
    The old handlers come back at the end."""

    priority = 100   # last: the vote comes after every other hook finished its step or epoch
    reads_weights = False   # names the weights files at most: the checkpoint's write goes on

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict = {}

    def before_train(self, trainer) -> None:
        self.signum = None
        trainer.interrupted = None
        if threading.current_thread() is threading.main_thread():   # signal.signal works only there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._note)

    def _note(self, signum, _frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def agreed(self) -> int | None:
        """The signal any rank got (SIGINT before SIGTERM when ranks differ), None: none. With more than one rank
        a collective: every rank asks at the same point (after every step, after every epoch)."""
        if dist.world_size() <= 1:
            return self.signum
        got = dist.all_reduce_sum([1.0 if self.signum == signal.SIGINT else 0.0,
                                   1.0 if self.signum == signal.SIGTERM else 0.0])
        if got[0] > 0:
            return int(signal.SIGINT)
        return int(signal.SIGTERM) if got[1] > 0 else None

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        if dist.world_size() > 1 and not getattr(trainer, "optimizer_stepped", True):
            return   # a micro-step: every rank votes after the accumulation's last batch instead
        signum = self.agreed()
        if signum is not None:
            self._stop(trainer, Interruption(signum, epoch, step))

    def after_epoch(self, trainer, stats) -> None:
        # an early stop ends the run anyway, and the last epoch needs no vote
        if trainer.stop_training or stats.epoch + 1 >= int(trainer.cfg["epoch"]):
            return
        signum = self.agreed()
        if signum is not None:
            self._stop(trainer, Interruption(signum, stats.epoch, None))

    @staticmethod
    def _stop(trainer, interruption: Interruption) -> None:
        trainer.interrupted = interruption
        trainer.stop_training = True

    def after_train(self, trainer) -> None:
        self._restore()
        stop = getattr(trainer, "interrupted", None)
        if stop is None:
            return
        self._exiting()
        name = launcher_signal() or signal.Signals(stop.signum).name
        if dist.is_main():
            report(stop, name, trainer.run_dir, trainer.steps_per_epoch)
        raise Interrupted(name, 128 + int(signal.Signals[name]))

    def close(self, trainer) -> None:
        self._restore()
        if getattr(trainer, "interrupted", None) is not None:
            self._exiting()

    @staticmethod
    def _exiting() -> None:
        """A rank of a launch that stops on a signal ignores further SIGTERMs while it reports and exits: Paddle's
        launcher sends its group SIGTERM three times, 0.2 s apart, and the handler restored here (worker.py's: die
        of it) would cut the report short (the launcher force-kills a rank still there 30 s later)."""
        from ppmulti.common.envvars import in_paddle_worker

        if in_paddle_worker() and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}


def launcher_signal() -> str | None:
    """Under ``ppmulti launch``: the signal the launcher got (``SIGINT`` for a Ctrl-C), which it notes in the launch
    directory before passing it on; Paddle's launcher then stops every rank with SIGTERM whatever it got."""
    from ppmulti.common.envvars import launch_record
    from ppmulti.common.rundir import SIGNALLED

    directory = launch_record().directory
    if not directory:
        return None
    try:
        name = Path(directory, SIGNALLED).read_text().strip()
    except OSError:
        return None
    return name if name in ("SIGINT", "SIGTERM", "SIGHUP") else None


def own_command(argv: list[str]) -> list[str] | None:
    """This process's command line as the user typed it (``python tools/train.py ...``); None when it was a ppmulti
    subcommand (``ppmulti demo``), which takes no ``--resume``."""
    prog = os.path.basename(argv[0]) if argv else ""
    if not prog.endswith(".py") or prog in ("cli.py", "__main__.py"):
        return None
    return ["python", *argv]


def report(stop: Interruption, name: str, run_dir: Path, steps_per_epoch: int) -> None:
    """Rank 0 says what was saved and how to resume: in train.log, and under ``ppmulti launch`` also in the launch
    directory (rundir.INTERRUPTED), from which the launcher tells the console with the launch's own command line
    (the ranks' console output stops when the launcher is signalled). One process: the resume command is its own."""
    from ppmulti.common.atomic import atomic_write_text
    from ppmulti.common.envvars import launch_record
    from ppmulti.common.rundir import INTERRUPTED, STATE, resume_command

    where = (f"after epoch {stop.epoch + 1}" if stop.step is None
             else f"in epoch {stop.epoch + 1} after step {stop.step + 1}/{steps_per_epoch}")
    checkpoint = f"{stop.checkpoint}{STATE}" if stop.checkpoint is not None else None
    launch_dir = launch_record().directory
    command = own_command(sys.argv)
    if launch_dir:
        record = {"signal": name, "where": where, "epoch": stop.epoch + 1, "step": stop.step,
                  "checkpoint": checkpoint, "run_dir": str(run_dir)}
        try:
            atomic_write_text(Path(launch_dir, INTERRUPTED), json.dumps(record) + "\n")
        except OSError:   # the launch directory went away: train.log still says it
            pass
        log.warning("%s: stopped %s; checkpoint %s saved, continue with --resume %s", name, where, checkpoint,
                    run_dir)
    elif command is not None:
        log.warning("%s: stopped %s; checkpoint %s saved; resume with: %s", name, where, checkpoint,
                    resume_command(command, run_dir))
    else:
        log.warning("%s: stopped %s; checkpoint %s saved, continue with --resume %s", name, where, checkpoint,
                    run_dir)
