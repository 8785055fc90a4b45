"""YOLOv5's warmup of the bias lr and the momentum, batch by batch, on a YOLOv5 command line."""

from __future__ import annotations

from ppmulti.rank import compat
from ppmulti.rank.engine.hooks.base import Hook

# the floor of the weights' lr at the warmup's first batch, as a fraction of the lr: YOLOv5 starts it at 0,
# but the biases' lr is a factor on it here (Paddle's per-parameter learning_rate), so it may not be 0 exactly
START_FACTOR = 1e-6


def bias_parameters(model) -> list:
    """The parameters YOLOv5 puts in its bias group: every layer's own ``bias`` (convolutions, BatchNorm)."""
    found, seen = [], set()
    for layer in model.sublayers(include_self=True):
        for name, param in layer.named_parameters(include_sublayers=False):
            if name == "bias" and id(param) not in seen and not param.stop_gradient:
                seen.add(id(param))
                found.append(param)
    return found


class YOLOv5WarmupHook(Hook):
    """Over the warmup's ``batches`` (lr.yolov5_warmup_batches), as YOLOv5's train.py at its batch ``ni``:
    the biases' lr falls linearly from ``bias_lr`` (hyp warmup_bias_lr) to the lr while the other weights'
    rises from 0 (the schedule's LinearWarmup, counted in batches), and a Momentum optimizer's momentum
    rises from ``momentum_start`` (hyp warmup_momentum) to its own. The accumulation's ramp is
    ``trainer.accumulation``'s. Afterwards every parameter has its own lr factor back, and the optimizer its
    momentum. Nothing to keep in a checkpoint: each batch's values follow from its index."""

    priority = 5   # before_step: before the step's other hooks, so all of them see the batch's values

    def __init__(self, batches: int, bias_lr: float, momentum_start: float) -> None:
        self.batches = int(batches)
        self.bias_lr = float(bias_lr)
        self.momentum_start = float(momentum_start)
        self._biases: list = []
        self._factors: list[float] = []
        self._optimizer = None
        self._base_momentum: float | None = None   # the optimizer's own (None: not a Momentum optimizer)
        self._active = False
        self._bias_now: float | None = None   # the biases' lr of the last batch, while the warmup sets it

    def before_train(self, trainer) -> None:
        self._biases = bias_parameters(trainer.model)
        self._factors = [float(p.optimize_attr.get("learning_rate", 1.0)) for p in self._biases]
        self._optimizer = trainer.optimizer
        self._base_momentum = compat.optimizer_momentum(trainer.optimizer)

    def before_step(self, trainer, epoch, step) -> None:
        ni = epoch * trainer.steps_per_epoch + step
        if ni > self.batches:
            self._bias_now = None
            if self._active:
                self._restore()
            return
        self._active = True
        frac = ni / max(1, self.batches)
        lr = float(trainer.optimizer.get_lr())   # the weights' lr at this batch: lr_target x frac (> 0)
        target = float(trainer.lr_plan.lr) if trainer.lr_plan is not None else lr
        bias = self.bias_lr + (target - self.bias_lr) * frac
        for param, factor in zip(self._biases, self._factors):
            param.optimize_attr["learning_rate"] = factor * bias / lr if lr > 0 else factor
        self._bias_now = bias
        if self._base_momentum is not None:
            compat.set_optimizer_momentum(self._optimizer,
                                          self.momentum_start + (self._base_momentum - self.momentum_start) * frac)

    def after_epoch(self, trainer, stats) -> None:
        if self._bias_now is not None:   # results.csv's lr/pg2 on a `ppmulti yolo` run
            stats.bias_lr = self._bias_now

    def _restore(self) -> None:
        for param, factor in zip(self._biases, self._factors):
            param.optimize_attr["learning_rate"] = factor
        if self._base_momentum is not None:
            compat.set_optimizer_momentum(self._optimizer, self._base_momentum)
        self._active = False

    def close(self, trainer) -> None:
        if self._active:
            self._restore()
