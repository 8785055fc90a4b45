"""The Trainer: a short loop over its parts (model, loader, optimizer, lr); all else is a hook (engine.hooks)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ppmulti.common.errors import UserError
from ppmulti.rank import dist, heartbeat
from ppmulti.rank.data.device import input_norm, to_model_input
from ppmulti.rank.data.feed import Feed
from ppmulti.rank.engine import checkpoint as ckpt
from ppmulti.rank.engine.hooks import (HOOK_POINTS, CheckpointHook, ConsoleLogHook, Hook, PlotsHook, ResultsHook,
                                       StepOutputs, TrackersHook)
from ppmulti.rank.engine.hooks.amp import MixedPrecisionHook
from ppmulti.rank.engine.hooks.amp import request as amp_request
from ppmulti.rank.engine.lr import Accumulation, BatchPlan, LRPlan, optimizer_steps, split_batch
from ppmulti.rank.engine.optim_step import OptimStep, take_clip
from ppmulti.rank.plan import RunPlan

log = logging.getLogger("ppmulti")


@dataclass
class EpochStats:
    epoch: int
    losses: dict[str, float]
    lr: float
    images_per_s: float
    seconds: float
    metrics: dict | None = None   # filled by EvaluationHook on evaluated epochs
    per_rank_images_per_s: list[float] = field(default_factory=list)   # [hooks: VisualDL per-rank figure]
    pr_curve: object | None = None   # rank 0, evaluated epochs: engine.plots.PRCurve (PlotsHook)
    amp: dict | None = None          # float16 AMP: skipped_steps, loss_scale (MixedPrecisionHook)
    bias_lr: float | None = None     # the biases' lr at the epoch's last batch while a warmup gives them their own


@dataclass
class EpochMeter:
    """An epoch's running figures: loss sums stay on the device (read once, at the end), data wait, steps."""

    sums: dict = field(default_factory=dict)
    steps: int = 0
    data_time: float = 0.0
    started: float = field(default_factory=time.time)
    done_sums: dict = field(default_factory=dict)   # a resumed epoch: the sums of the steps done before the stop
    done_steps: int = 0
    marked: tuple = ({}, 0)   # (sums, steps) at the last optimizer step: a stop mid-accumulation goes back to it

    def mark(self) -> None:
        self.marked = (dict(self.sums), self.steps)

    def rollback(self) -> None:
        """Forget the batches since the last optimizer step (a resume redoes them)."""
        self.sums, self.steps = dict(self.marked[0]), self.marked[1]

    def add(self, outputs: dict) -> None:
        import paddle

        for key, value in outputs.items():
            if key.startswith("loss") and isinstance(value, paddle.Tensor):
                v = value.detach()
                self.sums[key] = v if key not in self.sums else self.sums[key] + v
        self.steps += 1

    def totals(self) -> dict[str, float]:
        """The epoch's loss sums so far, those of the steps done before a resume included (one device read)."""
        out = dict(self.done_sums)
        for key, value in self.sums.items():
            out[key] = out.get(key, 0.0) + float(value.numpy().reshape(-1)[0])
        return out

    def losses(self) -> dict[str, float]:
        steps = max(self.steps + self.done_steps, 1)
        return {k: v / steps for k, v in self.totals().items()}


class Trainer:
    """One training run on this rank, built from its parts and driven by ``train()``; every task besides
    forward, backward and the optimizer step is a hook, and the step (precision, accumulation, clipping) is
    its ``optim`` (engine.optim_step.OptimStep).

    ``engine.builder.build_trainer(opts)`` builds the parts from a config as ``ppmulti train`` does;
    a test or a script passes its own::

        trainer = Trainer(model, batches, paddle.optimizer.SGD(0.1, parameters=model.parameters()),
                          epochs=2, run_dir=tmp, hooks=[CheckpointHook()])
        trainer.train()

    The parts: ``model`` takes a batch dict and returns a dict with ``loss`` (and other ``loss*`` tensors);
    ``loader`` is re-iterable, yields batch dicts and has a ``len()``; ``optimizer`` is a Paddle optimizer;
    ``lr`` the schedule stepped after every optimizer step (None: a fixed lr); ``batch`` a BatchPlan (its
    ``accumulate``: batches whose gradients add up before each optimizer step); ``multi_scale`` a callable
    ``(data, epoch, step)`` that resizes a batch on the device (engine.multiscale). An optimizer built with
    ``grad_clip=paddle.nn.ClipGradByGlobalNorm(X)`` (ppdet's ``clip_grad_by_norm: X``) has it taken off by
    ``optim``, which clips once per step, after unscaling under float16. ``cfg`` the config keys the
    loop and hooks read (``epoch``, ``log_iter``, ``snapshot_epoch``, ``use_ema``, ...; ``epochs=`` sets
    ``epoch``); ``opts`` the run's RunPlan (hooks read ``validate``, ``nosave``, ``save_period``, ...).

    What hooks read besides: ``cfg``, ``opts``, ``world``, ``rank``, ``batch`` (BatchPlan), ``steps_per_epoch``
    (batches), ``optimizer_stepped`` (whether the step just done stepped the optimizer: False on the micro-steps
    of an accumulation), ``optim`` (its ``skipped``: the float16 step just done overflowed), ``state``
    (TrainState), ``run_dir``, ``model``, ``optimizer``, ``lr``, ``lr_plan`` (LRPlan or None), ``hooks``;
    what they set: ``stop_training``, ``interrupted``, ``last_metrics``, ``ema``.
    """

    def __init__(self, model, loader, optimizer, *, lr=None, epochs: int | None = None, cfg=None,
                 opts: RunPlan | None = None, run_dir: str | Path | None = None, hooks=(),
                 state: ckpt.TrainState | None = None, batch: BatchPlan | None = None, world: int | None = None,
                 rank: int | None = None, train_model=None, amp: MixedPrecisionHook | None = None,
                 dataset=None, lr_plan: LRPlan | None = None, report_by_default: bool = False,
                 multi_scale: Callable | None = None):
        self.cfg = {} if cfg is None else cfg
        self.input_norm = input_norm(self.cfg)   # how run_step turns the loader's batch into the model's input
        if epochs is not None:
            self.cfg["epoch"] = int(epochs)
        if "epoch" not in self.cfg:
            raise ValueError("Trainer: give epochs=N (or an 'epoch' key in cfg)")
        self.opts = opts if opts is not None else RunPlan(config="")
        self.world = dist.world_size() if world is None else int(world)
        self.rank = dist.rank() if rank is None else int(rank)
        self.model = model
        self.train_model = model if train_model is None else train_model   # the model wrapped for several ranks
        self.loader = loader
        # the epochs' batches: loader workers start once per run, each sample's augmentation seeded by --seed
        self.feed = Feed(loader, seed=int(self.opts.seed or 0))
        self.dataset = dataset   # its set_epoch(epoch), if it has one, is called before each epoch
        self.optimizer = optimizer
        self.lr = _FixedLR() if lr is None else lr
        self.lr_plan = lr_plan
        self.steps_per_epoch = len(loader)
        self.batch = batch if batch is not None else split_batch((getattr(loader, "batch_size", None) or 1)
                                                                 * self.world, self.world)
        self.state = state if state is not None else ckpt.TrainState(
            epoch=0, global_step=0, world_size=self.world, global_batch=self.batch.global_batch,
            accumulate=self.batch.accumulate)
        self.multi_scale = multi_scale
        # the step's precision; the builder registers it as a hook too, a trainer from parts trains in float32
        self.amp = amp if amp is not None else MixedPrecisionHook(amp_request(False, None, None, "cpu", False))
        clip_norm, clip = take_clip(optimizer)
        # which batches end an optimizer step; the builder sets YOLOv5's warmup ramp on a YOLOv5 command line
        self.optim = OptimStep(optimizer, model=self.train_model,
                               accumulation=Accumulation(self.batch.accumulate, self.steps_per_epoch),
                               scaler=self.amp.scaler, autocast=self.amp.autocast_args(), clip_norm=clip_norm,
                               clip=clip)
        self.lr_per_batch = False   # True: ``lr`` counts batches (YOLOv5's warmup), else optimizer steps
        self.optimizer_stepped = True   # False after a micro-step of an accumulation (EMA waits for the step)
        self.optimizer_steps = 0        # optimizer steps this process has taken (not restored on resume)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.device = self.threads = self.conv_kernel = None   # set by the builder: facts for the log
        self.plan_notes: list[str] = []   # set by the builder: lines logged after the plan
        self.meter: EpochMeter | None = None   # the running epoch's (a checkpoint mid-epoch keeps its loss sums)
        self.hooks: list[Hook] = []
        self._hooks_chosen = not report_by_default   # False: train() adds the reporting hooks unless registered
        self.stop_training = False   # set by hooks (early stop, a signal); the loop ends at the next step
        self.interrupted = None      # StopOnSignalHook's Interruption when a signal stopped the run
        self.last_metrics: dict | None = None   # the last evaluation's (EvaluationHook)
        self.class_maps: list[float] | None = None   # the last evaluation's mAP50-95 per class (EvaluationHook)
        self.ema = None              # EMAHook's ModelEMA when the config uses EMA
        self._ema_applied = None     # (that EMA, its step, its apply()): inference_weights' one apply a step
        self.checkpoints = ckpt.BackgroundWriter()   # the checkpoint hook's epoch saves, written while training goes on
        self._add(*hooks)

    @property
    def accumulation(self) -> Accumulation:
        """Which batches end an optimizer step (the step's; settable, as the builder sets YOLOv5's ramp)."""
        return self.optim.accumulation

    @accumulation.setter
    def accumulation(self, value: Accumulation) -> None:
        self.optim.accumulation = value

    # ----------------------------------------------------------------- hooks
    def register(self, *hooks: Hook) -> None:
        """Add hooks; they run by ``priority`` among the others. Registering any hook means the reporting
        hooks are yours to choose (``default_hooks()`` adds the usual ones)."""
        self._hooks_chosen = True
        self._add(*hooks)

    def _add(self, *hooks: Hook) -> None:
        self.hooks = sorted([*self.hooks, *hooks], key=lambda h: h.priority)   # stable: ties keep their order

    def default_hooks(self) -> None:
        """The reporting hooks: console and train.log, results.csv/metrics.json, plots, the trackers (--logger)."""
        self._hooks_chosen = True
        self._add(ConsoleLogHook(), ResultsHook(), TrackersHook())
        if not self.opts.noplots:
            self._add(PlotsHook())

    def call(self, point: str, *args) -> None:
        """Call ``point`` (one of HOOK_POINTS) on every hook, in priority order."""
        assert point in HOOK_POINTS, point
        for hook in self.hooks:
            if point == "after_epoch" and hook.reads_weights:
                self.wait_for_checkpoints()   # the epoch's files, being written since the checkpoint hook's turn
            getattr(hook, point)(self, *args)

    # ----------------------------------------------------------------- loop
    def train(self) -> dict:
        """Run every remaining epoch; return the final metrics (as written to metrics.json)."""
        if not self._hooks_chosen:
            self.default_hooks()
        self._log_plan()
        try:
            self.call("before_train")
            for epoch in range(self.state.epoch, int(self.cfg["epoch"])):
                self.call("before_epoch", epoch)
                stats = self.run_epoch(epoch)
                if stats is not None:   # None: a hook stopped the epoch part-way
                    self.call("after_epoch", stats)
                if self.stop_training:
                    break
            self.call("after_train")
        finally:
            self.feed.close()
            try:
                self.wait_for_checkpoints()   # however the run ends, the last checkpoint begun is finished
            finally:
                self.call("close")
        return self.final_metrics

    def run_epoch(self, epoch: int) -> EpochStats | None:
        """The epoch's steps (a resumed epoch skips those done); None if a hook stopped it part-way."""
        meter = self.meter = EpochMeter()
        if self.state.step_in_epoch and self.state.loss_sums:   # resumed mid-epoch: its first steps' losses count
            meter.done_sums = {k: float(v) for k, v in self.state.loss_sums.items()}
            meter.done_steps = self.state.step_in_epoch
        # groups from the epoch's start (lr.Accumulation); the last may be short, so an epoch never ends with
        # gradients pending (a resumed epoch starts at a group boundary, see _drop_pending)
        flags = self.optim.step_flags(epoch)
        self._note_buffers()   # an epoch starts at a group boundary
        for step, data in self._batches(epoch, meter):
            self.call("before_step", epoch, step)
            outputs, lr = self.run_step(data, epoch, step_optimizer=flags[step])
            meter.add(outputs)
            if flags[step]:
                meter.mark()
                self._note_buffers()
            self.state.global_step += 1
            self.state.step_in_epoch = step + 1
            self.call("after_step", epoch, step, StepOutputs(outputs), lr, meter.data_time)
            if self.stop_training:
                self._drop_pending(flags, step)
                return None
        self.state.epoch, self.state.step_in_epoch, self.state.loss_sums = epoch + 1, 0, {}
        return self._epoch_stats(epoch, meter)

    def run_step(self, data: dict, epoch: int, step_optimizer: bool = True) -> tuple[dict, float]:
        """Forward and backward; with ``step_optimizer`` also the optimizer and lr step (else the gradients add
        up for the next one, not all-reduced across ranks): (the model's outputs, the lr the step used)."""
        data["epoch_id"] = epoch
        data = to_model_input(data, self.input_norm)   # a uint8 batch becomes the float input here
        if self.multi_scale is not None:
            self.multi_scale(data, epoch, self.state.global_step)
        heartbeat.beat("forward", self.state.global_step)
        # the micro-steps of an accumulation keep their gradients local; the stepping one all-reduces the sum
        with self.optim.context(step_optimizer):
            with self.optim.autocast():
                outputs = self.train_model(data)
            heartbeat.beat("backward")   # the gradient all-reduce runs inside (Paddle's DataParallel)
            self.optim.backward(outputs["loss"])
        lr = self.optimizer.get_lr()
        self.optimizer_stepped = step_optimizer
        if step_optimizer:
            self.optim.step()   # clips, steps (or skips an overflow), zeroes the gradients
            self.optimizer_steps += 1
        if step_optimizer or self.lr_per_batch:
            self.lr.step()
        return outputs, lr

    def _drop_pending(self, flags: list[bool], step: int) -> None:
        """Stopped in the middle of an accumulation: forget its batches (their gradients are not in the
        weights), so a checkpoint's ``step_in_epoch`` is a group boundary and a resume redoes them (and an lr
        that counts batches goes back with them)."""
        if self.optimizer_stepped:
            return
        group_start = max((i + 1 for i in range(step) if flags[i]), default=0)
        pending = step + 1 - group_start
        if self.meter is not None:
            self.meter.rollback()
        self.state.step_in_epoch -= pending
        self.state.global_step -= pending
        self.optim.zero_grad()
        self._restore_buffers()
        if self.lr_per_batch:
            self.lr.step(self.lr.last_epoch - pending)
        self.optimizer_stepped = True

    def _note_buffers(self) -> None:
        """Accumulating: keep the model's buffers (BatchNorm's running statistics) as they stand at an optimizer
        step. A stop mid-accumulation drops the batches since then and a resume redoes them; their forward passes
        have moved the running statistics already, which would count them twice."""
        if self.batch.accumulate > 1:   # Paddle keeps BatchNorm's _mean/_variance as parameters without gradients
            self._buffers = {name: t.clone() for name, t in self.model.state_dict().items()
                             if getattr(t, "stop_gradient", True)}

    def _restore_buffers(self) -> None:
        saved = getattr(self, "_buffers", None)
        if not saved:
            return
        for name, t in self.model.state_dict().items():
            if name in saved:
                t.set_value(saved[name])

    def _batches(self, epoch: int, meter: EpochMeter) -> Iterator[tuple[int, dict]]:
        """(step, batch) of this epoch's shuffle after the steps already done; the wait counts as data time."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)   # this process's copy; the feed tells the loader workers'
        self.train_model.train()
        skip = self.state.step_in_epoch   # resuming an interrupted epoch: the same shuffle, minus its done steps
        t_data = time.time()
        heartbeat.beat("data", self.state.global_step)
        for step, data in self.feed.epoch(epoch, skip, int(self.cfg["epoch"])):   # drawn by its own set_epoch
            meter.data_time += time.time() - t_data
            yield step, data
            heartbeat.beat("data", self.state.global_step)
            t_data = time.time()

    def _epoch_stats(self, epoch: int, meter: EpochMeter) -> EpochStats:
        seconds = time.time() - meter.started
        # one gather per epoch: every rank's (images, seconds) -> the total, the slowest and per-rank figures
        done = dist.all_gather_object((meter.steps * self.batch.per_rank, seconds))
        images = sum(i for i, _ in done)
        slowest = max(s for _, s in done)
        return EpochStats(epoch=epoch, losses=meter.losses(), lr=float(self.optimizer.get_lr()),
                          images_per_s=images / slowest if slowest > 0 else 0.0, seconds=slowest,
                          per_rank_images_per_s=[i / s if s > 0 else 0.0 for i, s in done])

    def _log_plan(self) -> None:
        """The log's first line: world, effective batch and accumulation, steps, the lr scaled from the
        effective batch."""
        acc, ramp = self.batch.accumulate, self.accumulation.ramp
        n = optimizer_steps(self.steps_per_epoch, acc)
        after = " after the warmup" if ramp and acc > 1 else ""
        steps = (f"{self.steps_per_epoch} steps per epoch" if acc == 1 else
                 f"{self.steps_per_epoch} batches ({n} optimizer step{'s' if n != 1 else ''}{after}) per epoch")
        log.info("world size %d, %s, %s; %s", self.world, self.batch.describe(), steps,
                 self.lr_plan.describe() if self.lr_plan is not None else f"lr {self.optimizer.get_lr():.6g}")
        for note in self.plan_notes:
            log.info("%s", note)
        if self.optim.clip_norm is not None:
            log.info("%s", self.optim.describe())
        if self.conv_kernel:
            log.info("CPU convolutions: %s", self.conv_kernel)
        if self.threads:
            log.info("CPU threads per rank: %d (PPMULTI_CPU_THREADS sets them)", self.threads)

    # ----------------------------------------------------------------- weights
    def inference_weights(self) -> dict:
        """The weights to evaluate and ship: EMA's when EMA is on, ppdet's ``ModelEMA.apply()`` taken once per
        optimizer step (an epoch's evaluation and checkpoint share it; ppdet's ``cycle_epoch`` counts one apply
        per epoch, as its trainer applies once per snapshot epoch, not one per caller)."""
        if self.ema is None:
            return self.model.state_dict()
        applied = self._ema_applied
        if applied is None or applied[0] is not self.ema or applied[1] != self.ema.step:
            weights = self.ema.apply()   # may restart the average (cycle_epoch): the step is noted after it
            applied = self._ema_applied = (self.ema, self.ema.step, weights)
        return applied[2]

    def checkpoint_snapshot(self, name: str = "last") -> ckpt.Snapshot:
        """``weights/<name>`` as it would be written now, in host memory (``Snapshot.write`` writes it): the
        inference weights, and the loop's and every hook's state for resume."""
        if self.run_dir is None:
            raise ValueError("Trainer.save_checkpoint: this trainer has no run_dir")
        heartbeat.beat("checkpoint")
        hooks = {h.name: state for h in self.hooks if h.name and (state := h.state_dict()) is not None}
        if self.state.step_in_epoch and self.meter is not None:   # mid-epoch (a stop): the steps' losses so far
            self.state.loss_sums = self.meter.totals()
        return ckpt.snapshot(self.run_dir / "weights" / name, self.model, self.inference_weights(), self.optimizer,
                             self.lr, self.state, hooks)

    def save_checkpoint(self, name: str = "last") -> Path:
        """Write ``weights/<name>`` now, after any checkpoint still being written in the background."""
        self.wait_for_checkpoints()
        snap = self.checkpoint_snapshot(name)
        snap.write()
        return Path(snap.stem)

    def wait_for_checkpoints(self) -> None:
        """Return once the checkpoint written in the background (``self.checkpoints``) is on disk; raise its
        error if writing it failed."""
        self.checkpoints.wait()

    @property
    def best_map(self) -> float:
        """mAP50-95 of ``weights/best`` (-1: none yet), as the checkpoint hook keeps it."""
        return max((h.best_map for h in self.hooks if isinstance(h, CheckpointHook)), default=-1.0)

    @property
    def final_metrics(self) -> dict:
        out = dict(self.last_metrics or {})
        out.update({"epochs": self.state.epoch, "world_size": self.world,
                    "global_batch": self.batch.global_batch, "accumulate": self.batch.accumulate,
                    "effective_batch": self.batch.effective_batch,
                    "run_dir": None if self.run_dir is None else str(self.run_dir)})
        return out


def freeze_backbone(model, freeze: list[int]) -> list[str]:
    """Stop gradients in backbone layers: ``[N]`` freezes the first N (YOLOv5's ``--freeze 10`` is its
    whole backbone), several numbers freeze those layer indices. Returns the frozen layers' names."""
    children = list(model.backbone.named_children())
    if len(freeze) == 1:
        wanted = set(range(freeze[0]))
    else:
        wanted = set(freeze)
    bad = sorted(i for i in wanted if i < 0 or i >= len(children))
    if bad:
        raise UserError(f"--freeze {' '.join(map(str, freeze))}: the backbone has layers 0..{len(children) - 1} "
                        f"({', '.join(n for n, _ in children[:4])}, ...)")
    names = []
    for index, (name, layer) in enumerate(children):
        if index in wanted:
            for param in layer.parameters():
                param.stop_gradient = True
            names.append(name)
    log.info("frozen backbone layers: %s", ", ".join(names))
    return names


class _FixedLR:
    """The lr schedule of a trainer given none: the optimizer's lr stays as it is."""

    def step(self) -> None: ...
