"""The Trainer: builds the run from a config, then one short loop; every other task is a hook (engine.hooks)."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ppmulti.rank import compat
from ppmulti.rank import config as config_mod
from ppmulti.rank import dist, heartbeat
from ppmulti.rank.engine import checkpoint as ckpt
from ppmulti.rank.engine.hooks import (HOOK_POINTS, CheckpointHook, ConsoleLogHook, EarlyStopHook, EMAHook,
                                       EvaluationHook, Hook, PlotsHook, ResultsHook, ResumeHook,
                                       StepOutputs, StopOnSignalHook, VisualDLHook)
from ppmulti.rank.engine.hooks.amp import MixedPrecisionHook
from ppmulti.rank.engine.hooks.amp import request as amp_request
from ppmulti.rank.engine.hooks.resume import record_run_dir
from ppmulti.rank.engine.lr import BatchPlan, LRPlan, scale_lr, split_batch
from ppmulti.common.rundir import new_run_dir
from ppmulti.common.errors import UserError, first_line

log = logging.getLogger("ppmulti")


@dataclass
class TrainOptions:
    """What one training run is asked to do (the CLI flags, as data)."""

    config: str
    overrides: list[str] = field(default_factory=list)
    validate: bool = False          # evaluate every snapshot epoch (a final evaluation always runs)
    resume: str | None = None
    batch: int | None = None        # global batch; default: TrainReader.batch_size x world size
    epochs: int | None = None
    output: str | None = None       # run directory; default: save_dir/<config name>[N]
    exist_ok: bool = False
    sync_bn: bool = False
    seed: int = 0
    workers: int | None = None      # data loader workers per rank
    weights: str | None = None      # initial weights (.pdparams)
    config_edit: Callable | None = None   # cfg -> notes; applied after loading (YOLOv5 flags use it)
    nosave: bool = False            # checkpoint only after the last epoch (and on an interrupt)
    save_period: int = -1           # also keep weights/epochN every N epochs
    patience: int | None = None     # stop after N validated epochs without a better fitness
    freeze: list[int] | None = None  # backbone layers to freeze: [N] = the first N, else indices
    noplots: bool = False           # no results.png / PR_curve.png (YOLOv5's --noplots; evolution candidates)
    amp: bool | None = None         # --amp / --no-amp; None: the config's amp key, else amp_default
    amp_default: bool = False       # YOLOv5-style runs: AMP on GPUs unless --no-amp or amp: false


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


@dataclass
class EpochMeter:
    """An epoch's running figures: loss sums stay on the device (read once, at the end), data wait, steps."""

    sums: dict = field(default_factory=dict)
    steps: int = 0
    data_time: float = 0.0
    started: float = field(default_factory=time.time)

    def add(self, outputs: dict) -> None:
        import paddle

        for key, value in outputs.items():
            if key.startswith("loss") and isinstance(value, paddle.Tensor):
                v = value.detach()
                self.sums[key] = v if key not in self.sums else self.sums[key] + v
        self.steps += 1

    def losses(self) -> dict[str, float]:
        return {k: float(v.numpy().reshape(-1)[0]) / max(self.steps, 1) for k, v in self.sums.items()}


class Trainer:
    """One training run on this rank: built from a config, driven by ``train()``."""

    def __init__(self, opts: TrainOptions):
        self.opts = opts
        self.hooks: list[Hook] = []
        self._hooks_chosen = False   # register()/default_hooks() called: train() adds no reporting hooks
        self.stop_training = False   # set by hooks (early stop, a signal); the loop ends at the next step
        self.interrupted = None      # StopOnSignalHook's Interruption when a signal stopped the run
        self.last_metrics: dict | None = None   # the last evaluation's (EvaluationHook)
        self.ema = None              # EMAHook's ModelEMA when the config uses EMA
        self.world = dist.init()
        self.rank = dist.rank()
        self.cfg = config_mod.load(opts.config, opts.overrides)
        notes = list(opts.config_edit(self.cfg) or []) if opts.config_edit else []
        from ppmulti.rank.ppdet_bridge import select_device

        self.device = select_device(self.cfg)
        if self.device == "cpu":
            self.threads = dist.set_cpu_threads()
        self._seed(opts.seed)
        if opts.epochs is not None:
            self.cfg["epoch"] = int(opts.epochs)
            _stretch_decay(self.cfg, int(opts.epochs))
        if opts.workers is not None:
            self.cfg["worker_num"] = int(opts.workers)
        config_mod.check_dataset(self.cfg, "TrainDataset")
        config_mod.check_dataset(self.cfg, "EvalDataset")
        self.amp = MixedPrecisionHook(amp_request(opts.amp, self.cfg.get("amp"), self.cfg.get("amp_level"),
                                                  self.device, opts.amp_default))
        # read before the batch plan and the run directory: a resumed run keeps both
        self.resume = ResumeHook(opts)
        self.batch = self._batch_plan()
        self.cfg.TrainReader["batch_size"] = self.batch.per_rank
        self.run_dir = self._make_run_dir()
        record_run_dir(self.run_dir)
        self._setup_logging()
        if self.resume.restart_note:
            log.warning("%s", self.resume.restart_note)
        for note in notes:
            log.warning("%s", note)
        if dist.is_main():
            config_mod.dump(self.cfg, self.run_dir / "config.yml")
        self.state = ckpt.TrainState(epoch=0, global_step=0, world_size=self.world,
                                     global_batch=self.batch.global_batch)
        self._build()
        self._add(EMAHook(), self.amp, self.resume, EvaluationHook(), EarlyStopHook(opts.patience),
                  CheckpointHook(), StopOnSignalHook())

    # ----------------------------------------------------------------- setup
    def _seed(self, seed: int) -> None:
        import numpy as np
        import paddle

        # ranks differ in augmentation randomness but start from the same weights (see _build)
        random.seed(seed + self.rank)
        np.random.seed(seed + self.rank)
        paddle.seed(seed + self.rank)

    def _batch_plan(self) -> BatchPlan:
        if self.opts.batch is not None:
            return split_batch(int(self.opts.batch), self.world)
        trained = self.resume.trained_global_batch
        if trained is not None:
            if trained % self.world == 0:
                return split_batch(trained, self.world)
            # not divisible: the config's per-rank batch on this world; ResumeHook rescales the LR and says so
        per_rank = int(self.cfg.TrainReader["batch_size"])
        return split_batch(per_rank * self.world, self.world)

    def _make_run_dir(self) -> Path:

        path = None
        if dist.is_main():
            if self.resume.run_dir is not None:
                path = str(self.resume.run_dir)
            elif self.opts.output:
                path = str(new_run_dir(Path(self.opts.output).parent, Path(self.opts.output).name,
                                       exist_ok=True if self.opts.exist_ok else False))
            else:
                path = str(new_run_dir(Path(self.cfg.get("save_dir", "output")), self.cfg["filename"],
                                       exist_ok=self.opts.exist_ok))
        path = dist.all_gather_object(path)[0]
        run_dir = Path(path)
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        return run_dir

    def _setup_logging(self) -> None:
        from ppmulti.rank.ranklog import setup_rank_logging

        setup_rank_logging(self.run_dir, self.rank)

    def _build(self) -> None:
        import paddle
        from paddle.distributed import fleet
        from ppdet.core.workspace import create

        from ppmulti.rank.ranklog import prints_to_log

        cfg = self.cfg
        self.dataset = create("TrainDataset")()
        with prints_to_log():   # pycocotools' notices while the annotations load
            self.loader = create("TrainReader")(self.dataset, cfg.get("worker_num", 0))
        self.steps_per_epoch = len(self.loader)
        if self.steps_per_epoch < 1:
            raise UserError(f"the training set has {len(self.dataset.roidbs)} images, fewer than the per-rank "
                            f"batch {self.batch.per_rank}; lower --batch")
        self.lr_plan = self._scale_lr(len(self.dataset.roidbs))

        paddle.seed(self.opts.seed)  # identical initial weights on every rank
        self.model = create(cfg.architecture)
        self.model.load_meanstd(cfg["TestReader"]["sample_transforms"])
        self._load_initial_weights()
        if self.opts.freeze:
            freeze_backbone(self.model, self.opts.freeze)
        self._maybe_sync_bn()
        self.lr = create("LearningRate")(self.steps_per_epoch)
        self.optimizer = create("OptimizerBuilder")(self.lr, self.model)
        self.amp.setup(self)   # may cast the model (O2): before it is wrapped for several ranks
        self.conv_kernel = None
        if self.device == "cpu":
            from ppmulti.rank.ops.conv import setup_cpu_convs

            self.conv_kernel = setup_cpu_convs(self.model, bf16=self.amp.mode == "bfloat16")
        self.train_model = self.model
        if self.world > 1:
            self.train_model = fleet.distributed_model(self.model)
            self.optimizer = fleet.distributed_optimizer(self.optimizer)

    def _scale_lr(self, dataset_size: int) -> LRPlan:
        lr_cfg = self.cfg["LearningRate"]
        base_lr = float(lr_cfg["base_lr"])
        ref_batch = int(self.cfg.get("ref_batch") or self.batch.global_batch)
        warmup = None
        for sched in lr_cfg.get("schedulers", []) or []:
            if isinstance(sched, dict) and sched.get("name") == "LinearWarmup":
                warmup = sched
        plan = scale_lr(base_lr, ref_batch, self.batch.global_batch, dataset_size,
                        warmup_steps=None if warmup is None else warmup.get("steps", 500),
                        warmup_epochs=None if warmup is None else warmup.get("epochs"),
                        total_steps=self.steps_per_epoch * int(self.cfg["epoch"]))
        lr_cfg["base_lr"] = plan.lr
        if warmup is not None:
            warmup["steps"] = plan.warmup_steps
            warmup["epochs"] = None
        return plan

    def _load_initial_weights(self) -> None:
        from ppdet.utils.checkpoint import load_pretrain_weight

        if self.resume.path is not None:
            return
        if self.opts.weights:
            missing, unexpected = ckpt.load_weights(self.model, self.opts.weights)
            self._report_keys(self.opts.weights, missing, unexpected)
            return
        pretrain = self.cfg.get("pretrain_weights")
        if pretrain:
            try:
                load_pretrain_weight(self.model, pretrain)
            except Exception as exc:  # no network, bad path
                raise UserError(f"pretrain_weights {pretrain} could not be loaded ({type(exc).__name__}: "
                                f"{first_line(exc)[:160]}); download it by hand and pass its path, "
                                f"or train from scratch with -o pretrain_weights=''") from None

    @staticmethod
    def _report_keys(source, missing, unexpected) -> None:
        if missing:
            log.warning("%s: %d model parameters not in the file (kept initialised), e.g. %s",
                        source, len(missing), ", ".join(missing[:3]))
        if unexpected:
            log.warning("%s: %d parameters in the file not used by the model, e.g. %s",
                        source, len(unexpected), ", ".join(unexpected[:3]))

    def _maybe_sync_bn(self) -> None:
        import paddle

        wanted = self.opts.sync_bn or (self.cfg.get("norm_type") == "sync_bn" and self.device != "cpu")
        if not wanted or self.world <= 1:
            if self.opts.sync_bn and self.world <= 1:
                log.info("--sync-bn with one rank: nothing to synchronise, plain BatchNorm")
            return
        if self.device == "cpu":
            raise UserError("--sync-bn: Paddle has no CPU kernel for sync_batch_norm, so BatchNorm "
                            "cannot be synchronised across CPU ranks; drop --sync-bn or train on GPUs")
        self.model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        log.info("BatchNorm layers converted to SyncBatchNorm across %d ranks", self.world)

    # ----------------------------------------------------------------- hooks
    def register(self, *hooks: Hook) -> None:
        """Add hooks; they run by ``priority`` among the others. Registering any hook means the reporting
        hooks are yours to choose (``default_hooks()`` adds the usual ones)."""
        self._hooks_chosen = True
        self._add(*hooks)

    def _add(self, *hooks: Hook) -> None:
        self.hooks = sorted([*self.hooks, *hooks], key=lambda h: h.priority)   # stable: ties keep their order

    def default_hooks(self) -> None:
        """The reporting hooks: console and train.log, results.csv/metrics.json, plots, VisualDL."""
        self._hooks_chosen = True
        self._add(ConsoleLogHook(), ResultsHook(), VisualDLHook())
        if not self.opts.noplots:
            self._add(PlotsHook())

    def call(self, point: str, *args) -> None:
        """Call ``point`` (one of HOOK_POINTS) on every hook, in priority order."""
        assert point in HOOK_POINTS, point
        for hook in self.hooks:
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
            self.call("close")
        return self.final_metrics

    def run_epoch(self, epoch: int) -> EpochStats | None:
        """The epoch's steps (a resumed epoch skips those done); None if a hook stopped it part-way."""
        meter = EpochMeter()
        for step, data in self._batches(epoch, meter):
            self.call("before_step", epoch, step)
            outputs, lr = self.run_step(data, epoch)
            meter.add(outputs)
            self.state.global_step += 1
            self.state.step_in_epoch = step + 1
            self.call("after_step", epoch, step, StepOutputs(outputs), lr, meter.data_time)
            if self.stop_training:
                return None
        self.state.epoch, self.state.step_in_epoch = epoch + 1, 0
        return self._epoch_stats(epoch, meter)

    def run_step(self, data: dict, epoch: int) -> tuple[dict, float]:
        """Forward, backward, optimizer and lr step: (the model's outputs, the lr the step used)."""
        data["epoch_id"] = epoch
        heartbeat.beat("forward", self.state.global_step)
        with self.amp.autocast():
            outputs = self.train_model(data)
        heartbeat.beat("backward")   # the gradient all-reduce runs inside (Paddle's DataParallel)
        self.amp.backward_step(outputs["loss"], self.optimizer)
        lr = self.optimizer.get_lr()
        self.lr.step()
        self.optimizer.clear_grad()
        return outputs, lr

    def _batches(self, epoch: int, meter: EpochMeter) -> Iterator[tuple[int, dict]]:
        """(step, batch) of this epoch's shuffle after the steps already done; the wait counts as data time."""
        self.dataset.set_epoch(epoch)
        sampler = compat.batch_sampler(self.loader)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)   # a new shuffle every epoch, identical across ranks
        self.train_model.train()
        skip = self.state.step_in_epoch   # resuming an interrupted epoch: the same shuffle, minus its done steps
        t_data = time.time()
        heartbeat.beat("data", self.state.global_step)
        for step, data in enumerate(self.loader):
            if step >= skip:
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
        log.info("world size %d, global batch %d (%d per rank), %d steps per epoch; %s",
                 self.world, self.batch.global_batch, self.batch.per_rank, self.steps_per_epoch,
                 self.lr_plan.describe())
        if self.conv_kernel:
            log.info("CPU convolutions: %s", self.conv_kernel)

    # ----------------------------------------------------------------- weights
    def inference_weights(self) -> dict:
        """The weights to evaluate and ship: EMA's when EMA is on."""
        if self.ema is None:
            return self.model.state_dict()
        return self.ema.apply()

    def save_checkpoint(self, name: str = "last") -> Path:
        """Write ``weights/<name>``: the inference weights, and the loop's and every hook's state for resume."""
        stem = self.run_dir / "weights" / name
        heartbeat.beat("checkpoint")
        hooks = {h.name: state for h in self.hooks if h.name and (state := h.state_dict()) is not None}
        ckpt.save(stem, self.model, self.inference_weights(), self.optimizer, self.lr, self.state, hooks)
        return stem

    @property
    def best_map(self) -> float:
        """mAP50-95 of ``weights/best`` (-1: none yet), as the checkpoint hook keeps it."""
        return max((h.best_map for h in self.hooks if isinstance(h, CheckpointHook)), default=-1.0)

    @property
    def final_metrics(self) -> dict:
        out = dict(self.last_metrics or {})
        out.update({"epochs": self.state.epoch, "world_size": self.world,
                    "global_batch": self.batch.global_batch, "run_dir": str(self.run_dir)})
        return out


def _stretch_decay(cfg, epochs: int) -> None:
    """``--epochs`` also sets the length of the lr decay, so the schedule ends with the run."""
    for sched in cfg["LearningRate"].get("schedulers", []) or []:
        if isinstance(sched, dict) and "max_epochs" in sched:
            sched["max_epochs"] = epochs


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


def train(opts: TrainOptions) -> dict:
    """Build a Trainer from options and train it; the Python face of ``tools/train.py``."""
    trainer = Trainer(opts)
    return trainer.train()
