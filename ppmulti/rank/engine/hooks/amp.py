"""Mixed precision (--amp, ppdet's amp/amp_level): what it means on this device, its log line, its state."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from ppmulti.common.errors import UserError
from ppmulti.rank.engine.hooks.base import Hook

log = logging.getLogger("ppmulti")

LEVELS = ("O1", "O2")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class AmpRequest:
    """What the user asked for, before the device has its say."""

    on: bool
    level: str     # "O1": autocast by Paddle's op lists; "O2": float16 model, float32 master weights
    source: str    # which flag or key decided, for the start-up line


def request(flag: bool | None, cfg_amp: Any, cfg_level: Any, device: str, yolo_default: bool) -> AmpRequest:
    """``--amp``/``--no-amp`` (flag), else the config's ``amp`` (``-o amp=true``), else on for YOLOv5-style
    runs on GPUs, as YOLOv5 does; ``amp_level`` as in ppdet. Pure: the table in tests/test_amp.py."""
    level = "O1" if cfg_level in (None, "") else str(cfg_level).upper()
    if level not in LEVELS:
        raise UserError(f"amp_level {cfg_level!r} is not O1 or O2; use -o amp_level=O1 (Paddle's autocast lists) "
                        f"or amp_level=O2 (a float16 model with float32 master weights)")
    if cfg_amp is not None and not isinstance(cfg_amp, bool):
        raise UserError(f"amp: {cfg_amp!r} is not true or false; use -o amp=true (or --amp)")
    if flag is not None:
        return AmpRequest(flag, level, "--amp" if flag else "--no-amp")
    if cfg_amp is not None:
        return AmpRequest(cfg_amp, level, f"amp: {str(cfg_amp).lower()} in the config")
    if yolo_default and device == "gpu":
        return AmpRequest(True, level, "the default of YOLOv5-style runs on GPUs; --no-amp turns it off")
    return AmpRequest(False, level, "")


@dataclass(frozen=True)
class AmpPlan:
    """What a run does: ``mode`` "off", "float16" (GPU: autocast + dynamic loss scaling) or "bfloat16" (CPU:
    ppmulti's oneDNN convolutions in bf16 with float32 accumulation; every other op stays float32)."""

    mode: str
    level: str
    note: str      # one line for the log ("" when AMP was never asked for)


def plan(req: AmpRequest, device: str, cpu_bf16_problem: Callable[[], str | None]) -> AmpPlan:
    """The request on this device; on CPU ``cpu_bf16_problem()`` says why bf16 cannot run (None: it can)."""
    if not req.on:
        return AmpPlan("off", req.level, f"AMP off ({req.source})" if req.source else "")
    if device != "cpu":
        return AmpPlan("float16", req.level,
                       f"AMP {req.level}: float16 autocast, dynamic loss scaling, float32 master weights and EMA "
                       f"({req.source})")
    problem = cpu_bf16_problem()
    if problem:
        return AmpPlan("off", req.level, f"{req.source} has no effect here: {problem}; training in float32")
    extra = "; amp_level O2 applies to GPUs only" if req.level == "O2" else ""
    return AmpPlan("bfloat16", req.level, f"AMP on CPU: convolutions in bfloat16 (oneDNN, float32 accumulation, "
                                          f"float32 weights), every other op float32 ({req.source}{extra})")


def cpu_bf16_problem(flags: frozenset[str] | None = None) -> str | None:
    """Why bf16 convolutions cannot run on this CPU, or None: the CPU must list AVX512-BF16 or AMX, ppmulti's
    oneDNN op must be in use, and oneDNN must dispatch bf16 to those instructions (not emulate them)."""
    from ppmulti.common.cpus import cpu_flags
    from ppmulti.common.envvars import PPMULTI_CPU_CONV
    from ppmulti.rank.ops import conv

    flags = cpu_flags() if flags is None else flags
    if not any(f in flags for f in BF16_CPU_FLAGS):
        return "this CPU has no AVX512-BF16 or AMX (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo)"
    if conv.choice() == "paddle":
        return f"{PPMULTI_CPU_CONV}=paddle (bfloat16 runs in ppmulti's oneDNN convolution op)"
    try:
        native, optimized = conv.bf16_support()
    except conv.OpUnavailable as exc:
        return f"ppmulti's oneDNN convolution op is unavailable ({exc})"
    if not (native and optimized):
        return "oneDNN does not run bfloat16 convolutions on AVX512-BF16/AMX here"
    return None


def o1_float16_ops(model, custom_white_list=None, custom_black_list=None) -> dict[str, str]:
    """Layers whose op Paddle's O1 autocast computes in float16, as {layer name: op}: the op must be on
    Paddle's float16 white list (plus ``custom_white_list``) and not on the black list (plus
    ``custom_black_list``); every other op keeps the dtype of its inputs or float32. Logged at start on GPUs."""
    import paddle
    from paddle.amp import amp_lists

    white = set(amp_lists.white_list()["float16"]["O1"]) | set(custom_white_list or [])
    black = (set(amp_lists.black_list()["float16"]["O1"]) | set(custom_black_list or [])) - set(custom_white_list or [])
    ops = {paddle.nn.Conv2D: "conv2d", paddle.nn.Conv2DTranspose: "conv2d_transpose", paddle.nn.Linear: "matmul_v2"}
    out = {}
    for name, layer in model.named_sublayers(include_self=True):
        op = ops.get(type(layer))
        if op is not None and op in white and op not in black:
            out[name] = op
    return out


class MixedPrecisionHook(Hook):
    """Decides the run's precision and keeps its state; the step itself is engine.optim_step.OptimStep's.
    ``setup`` settles the plan on the device and, for float16, makes Paddle's GradScaler (and O2's float16 model)
    that the Trainer hands to its OptimStep with ``autocast_args()``. A step whose gradients overflowed is
    skipped by the step and counted here (``stats.amp`` per epoch, read by the console and VisualDL hooks).
    Its state in a checkpoint: the scaler's (scale, good/bad step counters) and the skipped steps, the same on
    every rank (gradients are all-reduced before the check), so it resumes on any number of ranks."""

    priority = 12   # after_epoch: stats.amp is set before the console (50) and VisualDL (90) read it
    name = "amp"

    def __init__(self, req: AmpRequest) -> None:
        self.req = req
        self.plan = AmpPlan("off", req.level, "")
        self.scaler = None
        self.white = self.black = None
        self.skipped_total = 0
        self.skipped_epoch = 0
        self._carried: dict | None = None   # a loaded scaler state this run cannot use: kept for the next

    @property
    def mode(self) -> str:
        return self.plan.mode

    def setup(self, trainer) -> None:
        """Decide the mode on the trainer's device (before the model is wrapped for several ranks); O2
        casts the model to float16 with float32 master weights, and its state dicts stay float32."""
        import paddle

        cfg = trainer.cfg
        self.plan = plan(self.req, trainer.device, cpu_bf16_problem)
        if self.plan.mode != "float16":
            return
        self.white, self.black = cfg.get("custom_white_list"), cfg.get("custom_black_list")
        self.scaler = paddle.amp.GradScaler(init_loss_scaling=float(cfg.get("init_loss_scaling", 1024)))
        if self.plan.level == "O2":
            trainer.model, trainer.optimizer = paddle.amp.decorate(
                models=trainer.model, optimizers=trainer.optimizer, level="O2", master_weight=True,
                save_dtype="float32")

    def autocast_args(self):
        """The float16 autocast the step runs the forward pass in (None: none)."""
        from ppmulti.rank.engine.optim_step import Autocast

        if self.plan.mode != "float16":
            return None
        return Autocast(self.plan.level, self.white, self.black)

    def before_train(self, trainer) -> None:
        note = self.plan.note
        if self.plan.mode == "float16" and self.plan.level == "O1":
            note += f"; {len(o1_float16_ops(trainer.model, self.white, self.black))} conv/linear layers in float16"
        if note:   # a warning when --amp was asked for and does nothing here
            (log.warning if self.req.on and self.plan.mode == "off" else log.info)("%s", note)

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        optim = getattr(trainer, "optim", None)
        if trainer.optimizer_stepped and optim is not None and optim.skipped:
            self.count_skipped()

    def count_skipped(self) -> None:
        """One step skipped (inf/nan gradients)."""
        self.skipped_epoch += 1
        self.skipped_total += 1

    def loss_scale(self) -> float | None:
        if self.scaler is None:
            return None
        import numpy as np

        return float(np.asarray(self.scaler.state_dict()["scale"]).reshape(-1)[0])

    def before_epoch(self, trainer, epoch) -> None:
        self.skipped_epoch = 0

    def after_epoch(self, trainer, stats) -> None:
        if self.scaler is not None:
            stats.amp = {"skipped_steps": self.skipped_epoch, "loss_scale": self.loss_scale()}
            if self.skipped_epoch:
                log.info("AMP: %d steps of epoch %d skipped (inf/nan gradients); loss scale now %g",
                         self.skipped_epoch, stats.epoch + 1, self.loss_scale())

    def state_dict(self) -> dict[str, Any] | None:
        if self.scaler is None:
            return self._carried
        return {"scaler": dict(self.scaler.state_dict()), "skipped_steps": self.skipped_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is None:
            self._carried = state
            return
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_total = int(state.get("skipped_steps", 0))
