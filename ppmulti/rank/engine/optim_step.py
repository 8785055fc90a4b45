"""One optimizer step: autocast, loss scaling, backward, accumulation and its no_sync, clipping, the step, zeroing."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

from ppmulti.common.errors import UserError
from ppmulti.rank import compat
from ppmulti.rank.engine.lr import Accumulation


@dataclass(frozen=True)
class Autocast:
    """Paddle's float16 autocast as the AMP plan sets it (hooks.amp): level O1 or O2 and the custom op lists."""

    level: str = "O1"
    white: Any = None
    black: Any = None


class OptimStep:
    """The optimizer step of the training loop, in the manner of mmengine's OptimWrapper: the trainer asks it
    for the context of a batch's forward and backward, hands it the loss, and steps it on the batches that end
    an accumulation group::

        with optim.context(stepping):     # no_sync on the other batches of a group (several ranks)
            with optim.autocast():        # float16 (GPUs, --amp); nothing otherwise
                loss = model(batch)["loss"]
            optim.backward(loss)          # / accumulate, times the loss scale under float16
        if stepping:
            optim.step()                  # unscale, clip, step (skipped on inf/nan), update the scale, zero

    ``accumulation`` says which batches step (lr.Accumulation); ``scaler`` is float16's GradScaler (None:
    float32 or CPU bfloat16, whose convolutions need no loss scaling); ``clip_norm`` clips the gradients'
    global norm before each step, after unscaling (None: no clipping). ``skipped`` is True after a step whose
    gradients overflowed (the scaler skipped the update); ``skipped_steps`` counts them."""

    def __init__(self, optimizer, *, model=None, accumulation: Accumulation | None = None, scaler=None,
                 autocast: Autocast | None = None, clip_norm: float | None = None, clip=None) -> None:
        self.optimizer = optimizer
        self.model = model   # the model as trained (wrapped for several ranks): its no_sync
        self.accumulation = accumulation if accumulation is not None else Accumulation()
        self.scaler = scaler
        self.autocast_args = autocast
        self.clip_norm = check_clip_norm(clip_norm)
        self._clip = clip   # a ClipGradByGlobalNorm taken from the optimizer (its arithmetic kept), or built
        self.skipped = False
        self.skipped_steps = 0

    # ----------------------------------------------------------------- a batch
    def step_flags(self, epoch: int) -> list[bool]:
        """For each batch of ``epoch``, whether the optimizer steps after it (lr.Accumulation)."""
        return self.accumulation.step_flags(epoch)

    def context(self, stepping: bool) -> ContextManager:
        """Around a batch's forward and backward: a batch that does not step keeps its gradients on this rank
        (``no_sync``); the stepping one all-reduces the group's sum."""
        if stepping or self.model is None:
            return contextlib.nullcontext()
        return compat.no_grad_sync(self.model)

    def autocast(self) -> ContextManager:
        """Around the forward pass: float16 autocast when the AMP plan says so."""
        if self.autocast_args is None:
            return contextlib.nullcontext()
        import paddle

        a = self.autocast_args
        return paddle.amp.auto_cast(enable=True, custom_white_list=a.white, custom_black_list=a.black,
                                    level=a.level, dtype="float16")

    def backward(self, loss) -> None:
        """Backward of the loss over the group's batches (the mean: a step's gradients keep the scale of one
        batch; a shorter group, as in YOLOv5's warmup ramp, sums fewer, as YOLOv5's loss sums its images); under
        float16 of the scaled loss. Gradients add up until ``step``."""
        accumulate = self.accumulation.accumulate
        if accumulate > 1:
            loss = loss / accumulate
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()

    # ----------------------------------------------------------------- the step
    def step(self) -> bool:
        """The optimizer step on the gradients summed since the last one, then zero them. float16: unscaled,
        clipped, skipped (and counted) when they overflowed, the loss scale updated. Returns whether the
        weights changed (False: skipped)."""
        if self.scaler is None:
            self._clip_grads()
            self.optimizer.step()
            self.skipped = False
        else:
            if self.clip_norm is not None:   # clip what the step will use: the unscaled gradients
                self.scaler.unscale_(self.optimizer)
                self._clip_grads()
            self.scaler.step(self.optimizer)
            self.skipped = compat.scaler_found_inf(self.scaler)
            compat.scaler_update(self.scaler)
            self.skipped_steps += int(self.skipped)
        self.zero_grad()
        return not self.skipped

    def zero_grad(self) -> None:
        """Forget the gradients (after a step, or the pending ones of a group a stop cut short)."""
        self.optimizer.clear_grad()

    def _clip_grads(self) -> None:
        """Scale every gradient by clip_norm / max(global norm, clip_norm), in place, with Paddle's
        ClipGradByGlobalNorm (ppdet's ``clip_grad_by_norm``): the arithmetic of the optimizer's own clip, which
        takes the norm over each parameter group (one group unless the config has ``param_groups``)."""
        if self.clip_norm is None:
            return
        import paddle

        if self._clip is None:
            self._clip = paddle.nn.ClipGradByGlobalNorm(clip_norm=self.clip_norm)
        for group in compat.optimizer_param_groups(self.optimizer):
            # one norm per parameter group, as Paddle's optimizer clips (ppdet's param_groups configs)
            pairs = [(p, p.grad) for p in group if not p.stop_gradient and p.grad is not None]
            if not pairs:
                continue
            for (_, grad), (_, clipped) in zip(pairs, self._clip(pairs)):
                if clipped is not grad:
                    paddle.assign(clipped, output=grad)

    def describe(self) -> str:
        """The log line of its clipping ("" without)."""
        if self.clip_norm is None:
            return ""
        return f"gradients clipped to a global norm of {self.clip_norm:g} before each optimizer step" + (
            " (after unscaling)" if self.scaler is not None else "")


def check_clip_norm(value: Any) -> float | None:
    """``clip_grad_by_norm`` as a positive float, None for none; anything else: one line naming the key."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UserError(f"OptimizerBuilder.clip_grad_by_norm: {value!r} is not a positive number; give the largest "
                        f"global gradient norm (e.g. -o OptimizerBuilder.clip_grad_by_norm=10.0) or remove the key")
    return float(value)


def take_clip(optimizer) -> tuple[float | None, Any]:
    """The global-norm clipping ppdet's OptimizerBuilder put on ``optimizer`` (its ``clip_grad_by_norm``), taken
    off it so that the step clips once, after unscaling: (clip_norm, the ClipGradByGlobalNorm), or (None, None).
    A by-value clip (``clip_grad_by_value``) stays with the optimizer, which applies it inside its step, after
    the scaler has unscaled the gradients."""
    clip = compat.take_global_norm_clip(optimizer)
    if clip is None:
        return None, None
    return check_clip_norm(clip.clip_norm), clip
