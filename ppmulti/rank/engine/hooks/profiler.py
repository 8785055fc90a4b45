"""PaddleDetection's ``--profiler_options``: Paddle's profiler over a range of steps, a trace file and a summary."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ppmulti.common.errors import UserError
from ppmulti.rank.engine.hooks.base import Hook

log = logging.getLogger("ppmulti")

# PaddleDetection's option string (ppdet/utils/profiler.py): "key=value;key=value"; its keys and defaults. Its
# profiler calls paddle.utils.profiler, which neither Paddle 2.6 nor 3.3 has: the same options drive paddle.profiler.
SORTED_KEYS = {"total": "Total", "ave": "Avg", "max": "Max", "min": "Min"}
STATES = ("CPU", "GPU", "All")
TRACERS = ("Default", "OpDetail", "AllOpDetail")


@dataclass(frozen=True)
class ProfilerOptions:
    batch_range: tuple[int, int] = (10, 20)   # steps [start, end) are recorded, counted over the whole run
    state: str = "All"                        # CPU, GPU or All (GPU only where the run is on a GPU)
    sorted_key: str = "total"                 # the summary's order: total, ave, max, min
    tracer_option: str = "Default"            # OpDetail / AllOpDetail: the summary lists every operator's parts
    profile_path: str | None = None           # the Chrome trace (JSON); None: RUN_DIR/profile.json
    exit_on_finished: bool = True             # stop training after the recorded steps (PaddleDetection exits)


def parse_options(text: str) -> ProfilerOptions:
    """``"batch_range=[10,20];profile_path=p.json"`` -> ProfilerOptions; a bad key or value is one UserError."""
    values: dict = {}
    for item in str(text).replace(" ", "").split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        where = f"--profiler_options: {item!r}"
        if not sep:
            raise UserError(f"{where}: expected key=value pairs separated by ';', e.g. \"batch_range=[10,20]\"")
        if key == "batch_range":
            try:
                start, end = (int(v) for v in value.strip("[]()").split(","))
            except ValueError:
                raise UserError(f"{where}: expected batch_range=[START,END], e.g. [10,20]") from None
            if not 0 <= start < end:
                raise UserError(f"{where}: need 0 <= START < END")
            values[key] = (start, end)
        elif key == "exit_on_finished":
            values[key] = value.lower() in ("yes", "true", "t", "1")
        elif key == "state" and value in STATES or key == "tracer_option" and value in TRACERS:
            values[key] = value
        elif key == "sorted_key" and value in SORTED_KEYS:
            values[key] = value
        elif key == "sorted_key" and value == "calls":
            raise UserError(f"{where}: Paddle's profiler sorts its summary by time only; use total, ave, max or min")
        elif key == "profile_path" and value:
            values[key] = value
        elif key in ("state", "tracer_option", "sorted_key", "profile_path"):
            choices = {"state": STATES, "tracer_option": TRACERS, "sorted_key": tuple(SORTED_KEYS),
                       "profile_path": ("a file path",)}[key]
            raise UserError(f"{where}: use one of {', '.join(choices)}")
        else:
            raise UserError(f"{where}: unknown key {key!r}; the keys are batch_range, state, sorted_key, "
                            f"tracer_option, profile_path, exit_on_finished")
    return ProfilerOptions(**values)


def trace_path(options: ProfilerOptions, run_dir: Path | None, rank: int) -> Path:
    """Rank 0 writes PROFILE_PATH (default RUN_DIR/profile.json); rank r > 0 PROFILE_PATH with ``.rankR`` added."""
    path = Path(options.profile_path) if options.profile_path else Path(run_dir or ".") / "profile.json"
    return path if rank == 0 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


class ProfilerHook(Hook):
    """Records steps ``batch_range`` of the run with ``paddle.profiler``; each rank writes its Chrome trace, rank 0
    prints the summary table to the console; ``exit_on_finished`` ends the training after the last recorded step
    (as an early stop: what the run saved is kept)."""

    priority = 3   # before every other hook's step work, so the range covers the whole step

    def __init__(self, options: ProfilerOptions):
        self.options = options
        self._prof = None
        self._steps = 0

    def before_train(self, trainer) -> None:
        import paddle
        import paddle.profiler as profiler

        start, end = self.options.batch_range
        targets = [profiler.ProfilerTarget.CPU]
        on_gpu = paddle.is_compiled_with_cuda() and "gpu" in str(paddle.get_device())
        if on_gpu and self.options.state in ("GPU", "All"):
            targets.append(profiler.ProfilerTarget.GPU)
        self._path = trace_path(self.options, trainer.run_dir, trainer.rank)
        self._on_gpu = on_gpu and self.options.state != "CPU"
        self._prof = profiler.Profiler(targets=targets, scheduler=(start, end), on_trace_ready=self._export)
        self._prof.start()

    def _export(self, prof) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
        prof.export(path=str(tmp), format="json")
        os.replace(tmp, self._path)

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        if self._prof is None:
            return
        self._prof.step()
        self._steps += 1
        if self._steps >= self.options.batch_range[1]:
            self._finish(trainer)

    def _finish(self, trainer) -> None:
        import paddle.profiler as profiler

        prof, self._prof = self._prof, None
        prof.stop()
        if trainer.rank == 0:
            key = ("GPU" if self._on_gpu else "CPU") + SORTED_KEYS[self.options.sorted_key]
            with contextlib.redirect_stdout(sys.stderr):   # stdout carries the run's JSON summary
                prof.summary(sorted_by=getattr(profiler.SortedKeys, key),
                             op_detail=self.options.tracer_option != "Default", time_unit="ms")
            start, end = self.options.batch_range
            log.info("profiler: steps %d-%d recorded; rank 0's trace is %s", start, end - 1, self._path)
        if self.options.exit_on_finished:
            log.info("profiler: exit_on_finished: training stops here, as PaddleDetection's does")
            trainer.stop_training = True

    def close(self, trainer) -> None:
        if self._prof is not None:   # the run ended before the range did: nothing complete to report
            prof, self._prof = self._prof, None
            with contextlib.suppress(Exception):
                prof.stop()
