"""Global batch per rank and linear learning-rate scaling with a matching warmup."""

from __future__ import annotations

from dataclasses import dataclass

from ppmulti.common.errors import UserError


@dataclass(frozen=True)
class BatchPlan:
    global_batch: int
    per_rank: int
    world_size: int


def split_batch(global_batch: int, world_size: int) -> BatchPlan:
    """The user's batch is the global one; each rank takes an equal share."""
    if global_batch < 1:
        raise UserError(f"--batch {global_batch}: the global batch must be at least 1")
    if global_batch % world_size:
        raise UserError(
            f"--batch {global_batch} is not divisible by the world size {world_size}; "
            f"use a multiple of {world_size} (e.g. {max(world_size, global_batch // world_size * world_size)})")
    return BatchPlan(global_batch, global_batch // world_size, world_size)


@dataclass(frozen=True)
class LRPlan:
    base_lr: float          # the config's lr, for ref_batch
    lr: float               # the lr used, for global_batch
    ref_batch: int
    global_batch: int
    warmup_steps_ref: int   # warmup the config asks for, in steps at ref_batch
    warmup_steps: int       # warmup used, in steps at global_batch

    def describe(self) -> str:
        return (f"lr {self.lr:.6g} = base_lr {self.base_lr:g} x global batch {self.global_batch} / "
                f"ref_batch {self.ref_batch}; warmup {self.warmup_steps} steps "
                f"(config: {self.warmup_steps_ref} steps at batch {self.ref_batch})")


def scale_lr(base_lr: float, ref_batch: int, global_batch: int, dataset_size: int,
             warmup_steps: int | None = None, warmup_epochs: float | None = None,
             total_steps: int | None = None) -> LRPlan:
    """Linear scaling (Goyal et al. 2017): lr grows with the global batch.

    Warmup: the config's warmup is read at the reference batch. When the batch grows by
    k, the scaled lr is k times larger, so the warmup keeps its number of optimiser steps
    (k times more images, i.e. k times longer in epochs) instead of shrinking with the
    steps per epoch; when the batch shrinks, it keeps its length in images. It never
    takes more than a third of the run.
    """
    if ref_batch < 1:
        raise UserError(f"ref_batch {ref_batch}: must be a positive global batch size")
    k = global_batch / ref_batch
    steps_per_epoch_ref = max(1, dataset_size // ref_batch)
    if warmup_epochs is not None:
        ref_steps = int(round(warmup_epochs * steps_per_epoch_ref))
    else:
        ref_steps = int(warmup_steps or 0)
    if k >= 1:
        steps = ref_steps
    else:
        steps = int(round(ref_steps * ref_batch / global_batch))
    if total_steps is not None and ref_steps > 0:
        steps = min(steps, max(1, total_steps // 3))
    if ref_steps > 0:
        steps = max(steps, 1)
    return LRPlan(base_lr, base_lr * k, ref_batch, global_batch, ref_steps, steps)


class LinearDecay:
    """YOLOv5's default schedule for ppdet's ``LearningRate``: after the warmup the lr falls linearly from
    base_lr to base_lr x min_lr_ratio (YOLOv5's lrf) at the last step. ppdet 2.6 ships only cosine,
    piecewise and exponential decays; ``register_extensions`` makes this one available by name."""

    def __init__(self, max_epochs: int = 300, min_lr_ratio: float = 0.01, use_warmup: bool = True):
        self.max_epochs = max_epochs
        self.min_lr_ratio = min_lr_ratio
        self.use_warmup = use_warmup

    def lr_at(self, base_lr: float, step: int, start: int, total: int) -> float:
        """The lr of ``step``: base_lr at ``start`` (the end of the warmup), base_lr x min_lr_ratio at the last step."""
        floor = base_lr * self.min_lr_ratio
        return base_lr - (base_lr - floor) * (step - start) / max(1, total - 1 - start)

    def __call__(self, base_lr=None, boundary=None, value=None, step_per_epoch=None):
        from paddle.optimizer.lr import PiecewiseDecay

        total = int(self.max_epochs) * int(step_per_epoch)
        if boundary and value and self.use_warmup:
            # LinearWarmup's lists: values for steps 0..W, boundaries 1..W; the decay starts at W
            start = int(boundary[-1])
            boundary, value = list(boundary), list(value)
        else:
            start, boundary, value = 0, [], [self.lr_at(base_lr, 0, 0, total)]
        for step in range(start + 1, total):
            boundary.append(step)
            value.append(self.lr_at(base_lr, step, start, total))
        return PiecewiseDecay(boundary, value)
