"""The batch plan (global batch per rank, gradient accumulation and YOLOv5's warmup ramp of it, effective batch)
and linear learning-rate scaling from the effective batch with a matching warmup."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppmulti.common.errors import UserError

NOMINAL_BATCH = 64   # YOLOv5's nbs: its runs accumulate gradients up to this many images per optimizer step


@dataclass(frozen=True)
class BatchPlan:
    """How many images one optimizer step sees: ``per_rank`` on each of ``world_size`` ranks (the global
    batch), times ``accumulate`` micro-steps whose gradients add up before the step (the effective batch)."""

    global_batch: int
    per_rank: int
    world_size: int
    accumulate: int = 1
    source: str = ""    # why this accumulation (for the log): "--accumulate 4", "YOLOv5's nominal batch 64", ...

    @property
    def effective_batch(self) -> int:
        return self.global_batch * self.accumulate

    def describe(self) -> str:
        """E.g. "global batch 16 (8 per rank) x accumulate 4 = effective batch 64 (YOLOv5's nominal batch 64)"."""
        why = f" ({self.source})" if self.source else ""
        return (f"global batch {self.global_batch} ({self.per_rank} per rank) x accumulate {self.accumulate} = "
                f"effective batch {self.effective_batch}{why}")


def split_batch(global_batch: int, world_size: int, accumulate: int = 1, source: str = "") -> BatchPlan:
    """The user's batch is the global one; each rank takes an equal share."""
    if global_batch < 1:
        raise UserError(f"--batch {global_batch}: the global batch must be at least 1")
    if global_batch % world_size:
        raise UserError(
            f"--batch {global_batch} is not divisible by the world size {world_size}; "
            f"use a multiple of {world_size} (e.g. {max(world_size, global_batch // world_size * world_size)})")
    if accumulate < 1:
        raise UserError(f"--accumulate {accumulate}: give 1 (no accumulation) or more batches per optimizer step")
    return BatchPlan(global_batch, global_batch // world_size, world_size, int(accumulate), source)


def nominal_accumulate(global_batch: int, nominal: int = NOMINAL_BATCH) -> int:
    """YOLOv5's rule: ``max(round(nbs / batch), 1)`` batches per optimizer step (Python's round, as YOLOv5's)."""
    return max(round(nominal / global_batch), 1)


@dataclass(frozen=True)
class Trained:
    """What a resumed checkpoint was trained with (its TrainState's batch fields)."""

    global_batch: int
    world_size: int
    accumulate: int = 1

    @property
    def effective_batch(self) -> int:
        return self.global_batch * self.accumulate

    @property
    def per_rank(self) -> int:
        return max(1, self.global_batch // max(1, self.world_size))


def plan_batch(world: int, config_per_rank: int, batch: int | None = None, accumulate: int | None = None,
               nominal: int | None = None, trained: Trained | None = None) -> BatchPlan:
    """The batch plan of a run on ``world`` ranks (pure; golden cases in tests/test_batching.py).

    ``batch``: --batch (global); ``accumulate``: --accumulate (wins over every rule below); ``nominal``: the
    nominal batch of a YOLOv5 command line (64: accumulate ``max(round(64 / global), 1)``); ``trained``: the
    resumed checkpoint's plan. A resume keeps the trained effective batch: it keeps the trained per-rank batch
    (or a smaller one) and recomputes the accumulation, so a run moved to fewer ranks needs no more memory per
    rank; --batch on resume keeps it too when the new global batch divides it.
    """
    if accumulate is not None and accumulate < 1:
        raise UserError(f"--accumulate {accumulate}: give 1 (no accumulation) or more batches per optimizer step")
    if trained is not None and accumulate is None:
        eff = trained.effective_batch
        if batch is not None:
            plan = split_batch(int(batch), world)
            if eff % plan.global_batch:
                raise UserError(f"--resume with --batch {batch}: the run was trained with an effective batch of {eff} "
                                f"images per optimizer step, which {batch} does not divide; give a --batch that "
                                f"divides {eff}, or --accumulate N to change the effective batch (the lr rescales)")
            acc = eff // plan.global_batch
            return replace(plan, accumulate=acc, source=f"keeps the resumed effective batch {eff}")
        for acc in range(1, eff + 1):
            if eff % (world * acc) == 0 and eff // (world * acc) <= trained.per_rank:
                return split_batch(eff // acc, world, acc, f"keeps the resumed effective batch {eff}")
        raise UserError(f"--resume on {world} ranks: the run's effective batch {eff} (global {trained.global_batch} "
                        f"x accumulate {trained.accumulate} on {trained.world_size} ranks) cannot be split evenly "
                        f"over {world} ranks; resume on a number of ranks that divides {eff}, or give --batch B "
                        f"--accumulate N (the effective batch and lr change)")
    if batch is not None:
        plan = split_batch(int(batch), world)
    elif trained is not None:
        plan = split_batch(trained.per_rank * world, world)
    else:
        plan = split_batch(int(config_per_rank) * world, world)
    if accumulate is not None:
        return replace(plan, accumulate=int(accumulate), source=f"--accumulate {accumulate}")
    if nominal:
        return replace(plan, accumulate=nominal_accumulate(plan.global_batch, nominal),
                       source=f"YOLOv5's nominal batch {nominal}; --accumulate N overrides")
    return plan


def optimizer_steps(batches: int, accumulate: int) -> int:
    """Optimizer steps in an epoch of ``batches``: one per ``accumulate`` batches, the last group possibly short
    (an epoch never ends with gradients pending, so a checkpoint at its end holds none)."""
    return -(-batches // max(1, accumulate))


YOLOV5_WARMUP_FLOOR = 100   # batches: YOLOv5's warmup lasts max(round(warmup_epochs x batches per epoch), 100)


def yolov5_warmup_batches(warmup_epochs: float, batches_per_epoch: int, total_batches: int | None = None) -> int:
    """The length of YOLOv5's warmup in batches (train.py's ``nw``): never under 100, even with 0 epochs; and, as
    every warmup here (scale_lr), never more than a third of the run's ``total_batches``, where YOLOv5 would warm
    up a short run from its first batch to its last (its cap at half the run is commented out)."""
    batches = max(round(float(warmup_epochs) * int(batches_per_epoch)), YOLOV5_WARMUP_FLOOR)
    if total_batches is not None:
        batches = min(batches, max(1, int(total_batches) // 3))
    return batches


@dataclass(frozen=True)
class Accumulation:
    """Which batches end an optimizer step: groups of ``accumulate`` counted from each epoch's start, the last
    one possibly short (an epoch never ends with gradients pending, so a checkpoint at its end holds none).

    ``ramp`` > 0 is YOLOv5's warmup: at the run's batch ``ni <= ramp`` a group ends once it holds
    ``round(interp(ni, [0, ramp], [1, accumulate]))`` batches, so the first steps take one batch each and the
    groups grow to ``accumulate`` by the warmup's end, as YOLOv5's ``ni - last_opt_step >= accumulate``.
    The batches are global (the same index on every rank), so every rank steps on the same batch."""

    accumulate: int = 1
    batches_per_epoch: int = 1
    ramp: int = 0

    def group_at(self, ni: int) -> int:
        """Batches a group needs when it would end at the run's batch ``ni``."""
        if ni > self.ramp or self.ramp <= 0:
            return self.accumulate
        # np.interp's arithmetic, and round() halves to even as numpy's .round() does
        return max(1, round((self.accumulate - 1) / self.ramp * ni + 1))

    def step_flags(self, epoch: int) -> list[bool]:
        """For each batch of ``epoch``, whether the optimizer steps after it (pure; resume-safe)."""
        nb = max(1, int(self.batches_per_epoch))
        first = epoch * nb
        last_step = first - 1
        flags = []
        for step in range(nb):
            ni = first + step
            ends = ni - last_step >= self.group_at(ni) or step == nb - 1
            flags.append(ends)
            if ends:
                last_step = ni
        return flags

    def steps_in_epoch(self, epoch: int) -> int:
        return sum(self.step_flags(epoch))


def yolov5_weight_decay(weight_decay: float, ref_batch: int, nominal: int = NOMINAL_BATCH) -> float:
    """The decay coefficient that gives YOLOv5's weight decay per optimizer step.

    YOLOv5 keeps lr0 and scales the decay: ``wd x effective / nbs``, so each step shrinks the weights by
    ``lr0 x wd x effective / nbs``. Here the lr is already ``lr0 x effective / ref_batch`` (linear scaling),
    so the coefficient is ``wd x ref_batch / nbs``: the same shrink per step (equal to ``wd`` when
    ref_batch is YOLOv5's 64, as in the shipped YOLOv5 configs)."""
    return float(weight_decay) * int(ref_batch) / int(nominal)


@dataclass(frozen=True)
class LRPlan:
    base_lr: float          # the config's lr, for ref_batch
    lr: float               # the lr used, for effective_batch
    ref_batch: int
    effective_batch: int    # images per optimizer step (global batch x accumulate)
    warmup_steps_ref: int   # warmup the config asks for, in optimizer steps at ref_batch
    warmup_steps: int       # warmup used, in optimizer steps at effective_batch (or batches, below)
    yolov5_warmup: bool = False   # warmup_steps counts batches: YOLOv5's warmup (yolov5_warmup_batches)
    ref_source: str = ""    # where ref_batch came from (ref_batch.resolve), said after it

    def describe(self) -> str:
        why = f" ({self.ref_source})" if self.ref_source else ""
        scaled = (f"lr {self.lr:.6g} = base_lr {self.base_lr:g} x effective batch {self.effective_batch} / "
                  f"ref_batch {self.ref_batch}{why}")
        if self.yolov5_warmup:
            return (f"{scaled}; YOLOv5's warmup over the first {self.warmup_steps} batches "
                    f"(max(round(warmup epochs x batches per epoch), 100), at most a third of the run)")
        return (f"{scaled}; warmup {self.warmup_steps} optimizer steps "
                f"(config: {self.warmup_steps_ref} steps at batch {self.ref_batch})")


def scale_lr(base_lr: float, ref_batch: int, effective_batch: int, dataset_size: int,
             warmup_steps: int | None = None, warmup_epochs: float | None = None,
             total_steps: int | None = None) -> LRPlan:
    """Linear scaling (Goyal et al. 2017): lr grows with the effective batch (the images one optimizer step
    sees: global batch x accumulate); ``total_steps`` and the warmup count optimizer steps.

    Warmup: the config's warmup is read at the reference batch. When the batch grows by
    k, the scaled lr is k times larger, so the warmup keeps its number of optimiser steps
    (k times more images, i.e. k times longer in epochs) instead of shrinking with the
    steps per epoch; when the batch shrinks, it keeps its length in images. It never
    takes more than a third of the run.
    """
    if ref_batch < 1:
        raise UserError(f"ref_batch {ref_batch}: must be a positive global batch size")
    k = effective_batch / ref_batch
    steps_per_epoch_ref = max(1, dataset_size // ref_batch)
    if warmup_epochs is not None:
        ref_steps = int(round(warmup_epochs * steps_per_epoch_ref))
    else:
        ref_steps = int(warmup_steps or 0)
    if k >= 1:
        steps = ref_steps
    else:
        steps = int(round(ref_steps * ref_batch / effective_batch))
    if total_steps is not None and ref_steps > 0:
        steps = min(steps, max(1, total_steps // 3))
    if ref_steps > 0:
        steps = max(steps, 1)
    return LRPlan(base_lr, base_lr * k, ref_batch, effective_batch, ref_steps, steps)


def linear_warmup(schedulers: list) -> dict | None:
    """The schedule's LinearWarmup as ppdet's dict form (``name: LinearWarmup``), or None.

    PaddleDetection's own configs write it as a YAML-tagged object (``- !LinearWarmup {steps: 1000, ...}``),
    which ppdet's loader turns into an instance; ppmulti's configs write the dict. An instance is replaced in
    ``schedulers`` by the equivalent dict (ppdet's LearningRate builds either), so the warmup is read and
    scaled the same way whichever form the config used.
    """
    for i, sched in enumerate(schedulers):
        if isinstance(sched, dict):
            if sched.get("name") == "LinearWarmup":
                return sched
        elif type(sched).__name__ == "LinearWarmup":
            schedulers[i] = {"name": "LinearWarmup", "steps": sched.steps, "start_factor": sched.start_factor,
                             "epochs": sched.epochs}
            return schedulers[i]
    return None
