"""The training loop around ppdet's model, data pipeline, optimizer and EMA, with hooks."""

from __future__ import annotations

import copy
import logging
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ppmulti.common import compat
from ppmulti.rank import config as config_mod
from ppmulti.rank import dist
from ppmulti.rank.engine import checkpoint as ckpt
from ppmulti.rank.engine.hooks import (CheckpointHook, ConsoleLogHook, Hook, PlotsHook, ResultsHook, StepOutputs,
                                  VisualDLHook)
from ppmulti.rank.engine.lr import BatchPlan, LRPlan, scale_lr, split_batch
from ppmulti.common.rundir import RUN_DIR_MARKER, new_run_dir
from ppmulti.common.errors import UserError

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


@dataclass
class EpochStats:
    epoch: int
    losses: dict[str, float]
    lr: float
    images_per_s: float
    seconds: float
    metrics: dict | None = None
    per_rank_images_per_s: list[float] = field(default_factory=list)   # [hooks: VisualDL per-rank figure]


class Trainer:
    """One training run on this rank: built from a config, driven by ``train()``."""

    def __init__(self, opts: TrainOptions):
        self.opts = opts
        self.hooks: list[Hook] = []
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
        restarted = self._continue_after_restart()
        self._resume_from = ckpt.resolve_resume(opts.resume) if opts.resume else None
        # read once, before the batch plan: a resumed run keeps the global batch it was trained with
        self._resume_payload = ckpt.load_state(self._resume_from) if self._resume_from else None
        self.batch = self._batch_plan()
        self.cfg.TrainReader["batch_size"] = self.batch.per_rank
        self.run_dir = self._make_run_dir()
        self._record_run_dir()
        self._setup_logging()
        if restarted:
            log.warning("%s", restarted)
        for note in notes:
            log.warning("%s", note)
        if dist.is_main():
            config_mod.dump(self.cfg, self.run_dir / "config.yml")
        self.state = ckpt.TrainState(epoch=0, global_step=0, best_map=-1.0, world_size=self.world,
                                     global_batch=self.batch.global_batch)
        self._build()

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
        if self._resume_payload is not None:
            trained = int(self._resume_payload["train"]["global_batch"])
            if trained % self.world == 0:
                return split_batch(trained, self.world)
            # not divisible: the config's per-rank batch on this world; _resume rescales the LR and says so
        per_rank = int(self.cfg.TrainReader["batch_size"])
        return split_batch(per_rank * self.world, self.world)

    def _make_run_dir(self) -> Path:

        path = None
        if dist.is_main():
            if self._resume_from is not None:
                path = str(self._resume_from.parent.parent)
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

    def _continue_after_restart(self) -> str | None:
        """In a launch restarted by ``--max_restarts``, carry on the run the first start began: resume from
        its last checkpoint (or start it again in the same directory if none was written yet)."""
        from ppmulti.common.envvars import launch_record

        record = launch_record()
        marker = Path(record.directory or "", RUN_DIR_MARKER)
        if record.directory is None or record.restart == 0 or not marker.is_file():
            return None
        run_dir = Path(marker.read_text().strip())
        if (run_dir / "weights" / ("last" + ckpt.STATE)).is_file():
            self.opts.resume = str(run_dir)
            return f"launch restart {record.restart}: resuming {run_dir} from its last checkpoint"
        self.opts.output, self.opts.exist_ok, self.opts.resume = str(run_dir), True, None
        return f"launch restart {record.restart}: no checkpoint in {run_dir} yet, starting it again"

    def _record_run_dir(self) -> None:
        from ppmulti.common.envvars import launch_record
        from ppmulti.common.atomic import atomic_write_text

        record = launch_record()
        if record.directory and record.restart == 0 and dist.is_main():
            atomic_write_text(Path(record.directory, RUN_DIR_MARKER), str(self.run_dir.resolve()) + "\n")

    def _setup_logging(self) -> None:
        from ppmulti.rank.ranklog import setup_rank_logging

        setup_rank_logging(self.run_dir, self.rank)

    def _build(self) -> None:
        import paddle
        from paddle.distributed import fleet
        from ppdet.core.workspace import create
        from ppdet.optimizer import ModelEMA

        cfg = self.cfg
        self.dataset = create("TrainDataset")()
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
        self.conv_kernel = None
        if self.device == "cpu":
            from ppmulti.rank.ops.conv import setup_cpu_convs

            self.conv_kernel = setup_cpu_convs(self.model)

        self.lr = create("LearningRate")(self.steps_per_epoch)
        self.optimizer = create("OptimizerBuilder")(self.lr, self.model)
        self.ema = None
        if cfg.get("use_ema", False):
            self.ema = ModelEMA(self.model, decay=cfg.get("ema_decay", 0.9998),
                                ema_decay_type=cfg.get("ema_decay_type", "threshold"),
                                cycle_epoch=cfg.get("cycle_epoch", -1),
                                ema_black_list=cfg.get("ema_black_list", None),
                                ema_filter_no_grad=cfg.get("ema_filter_no_grad", False))
        if self._resume_payload is not None:
            self._resume(self._resume_from, self._resume_payload)
            self._resume_payload = None   # the weights now live in the model; free the copy
        self.train_model = self.model
        if self.world > 1:
            self.train_model = fleet.distributed_model(self.model)
            self.optimizer = fleet.distributed_optimizer(self.optimizer)
        self.evaluator = None

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

        if self.opts.resume:
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
                                f"{str(exc).splitlines()[0][:160]}); download it by hand and pass its path, "
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
            raise UserError("--sync-bn: Paddle 2.6 has no CPU kernel for sync_batch_norm, so BatchNorm "
                            "cannot be synchronised across CPU ranks; drop --sync-bn or train on GPUs")
        self.model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        log.info("BatchNorm layers converted to SyncBatchNorm across %d ranks", self.world)

    def _resume(self, path: Path, payload: dict) -> None:
        missing, unexpected = ckpt.check_shapes(self.model, payload["model"], str(path))
        self.model.set_state_dict(payload["model"])
        self.optimizer.set_state_dict(payload["optimizer"])
        if payload.get("lr") is not None and hasattr(self.lr, "set_state_dict"):
            self.lr.set_state_dict(payload["lr"])
        if self.ema is not None and payload.get("ema"):
            self.ema.resume(payload["ema"], payload.get("ema_step", 0))
        train = payload["train"]
        self.state = ckpt.TrainState(**train)
        ckpt.set_rng_state(payload.get("rng"))
        if train["world_size"] != self.world and train["global_batch"] == self.batch.global_batch:
            log.warning("resuming a run of %d ranks on %d ranks: the global batch stays %d (%d per rank)",
                        train["world_size"], self.world, self.batch.global_batch, self.batch.per_rank)
        elif train["world_size"] != self.world:
            log.warning("resuming a run of %d ranks on %d ranks", train["world_size"], self.world)
        if train["global_batch"] != self.batch.global_batch:
            log.warning("resuming with global batch %d instead of %d: lr rescaled to %.6g",
                        self.batch.global_batch, train["global_batch"], self.lr_plan.lr)
        self.state.world_size, self.state.global_batch = self.world, self.batch.global_batch
        log.info("resumed from %s at epoch %d (step %d)", path, self.state.epoch, self.state.global_step)

    # ----------------------------------------------------------------- loop
    def register(self, *hooks: Hook) -> None:
        self.hooks.extend(hooks)

    def _call(self, name: str, *args) -> None:
        for hook in self.hooks:
            getattr(hook, name)(self, *args)

    def default_hooks(self) -> None:
        self.register(ConsoleLogHook(), CheckpointHook(), ResultsHook())
        if not self.opts.noplots:
            self.register(PlotsHook())   # after ResultsHook: it draws from the results.csv just written
        self.register(VisualDLHook())

    def train(self) -> dict:
        """Run every remaining epoch; return the final metrics (as written to metrics.json)."""
        if not self.hooks:
            self.default_hooks()
        log.info("world size %d, global batch %d (%d per rank), %d steps per epoch; %s",
                 self.world, self.batch.global_batch, self.batch.per_rank, self.steps_per_epoch,
                 self.lr_plan.describe())
        if self.conv_kernel:
            log.info("CPU convolutions: %s", self.conv_kernel)
        try:
            self._call("before_train")
            epochs = int(self.cfg["epoch"])
            snapshot = max(1, int(self.cfg.get("snapshot_epoch", 1)))
            self.last_metrics = None
            self.stopping_early = False
            with _StopRequests() as self.stop_requests:
                for epoch in range(self.state.epoch, epochs):
                    self._run_epoch(epoch, epochs, snapshot)
                    if self.stopping_early:
                        break
                    # ranks agree every log_iter steps inside an epoch; an epoch shorter than that ends here
                    if epoch + 1 < epochs and self.stop_requests.agreed():
                        self._stop_on_request(epoch, None)
            self._call("after_train")
        finally:
            self._call("close")
        return self.final_metrics

    def _run_epoch(self, epoch: int, epochs: int, snapshot: int) -> None:
        stats = self.train_one_epoch(epoch)
        last = epoch + 1 == epochs
        if (self.opts.validate and (epoch + 1) % snapshot == 0) or last:
            stats.metrics = self.evaluate().as_dict()
            self.last_metrics = stats.metrics
            self._check_patience(epoch, stats.metrics)
        self.state.epoch = epoch + 1
        self.state.step_in_epoch = 0
        self._call("after_epoch", stats)

    def train_one_epoch(self, epoch: int) -> EpochStats:
        import paddle

        self.dataset.set_epoch(epoch)
        sampler = compat.batch_sampler(self.loader)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)   # a new shuffle every epoch, identical across ranks
        self.train_model.train()
        sums: dict[str, object] = {}
        n = 0
        tic = time.time()
        data_time = 0.0
        t_data = time.time()
        skip = self.state.step_in_epoch   # resuming an interrupted epoch: the same shuffle, minus its done steps
        check_every = 1 if self.world == 1 else max(1, int(self.cfg.get("log_iter", 20)))
        for step, data in enumerate(self.loader):
            if step < skip:
                t_data = time.time()
                continue
            data_time += time.time() - t_data
            data["epoch_id"] = epoch
            outputs = self.train_model(data)
            loss = outputs["loss"]
            loss.backward()
            self.optimizer.step()
            lr = self.optimizer.get_lr()
            self.lr.step()
            self.optimizer.clear_grad()
            if self.ema is not None:
                self.ema.update()
            self.state.global_step += 1
            # accumulate on the device; values are read only at log time and epoch end
            for key, value in outputs.items():
                if key.startswith("loss") and isinstance(value, paddle.Tensor):
                    v = value.detach()
                    sums[key] = v if key not in sums else sums[key] + v
            n += 1
            self.state.step_in_epoch = step + 1
            self._call("after_step", epoch, step, StepOutputs(outputs), lr, data_time)
            if (step + 1) % check_every == 0 and self.stop_requests.agreed():
                self._stop_on_request(epoch, step)
            t_data = time.time()
        seconds = time.time() - tic
        losses = {k: float(v.numpy().reshape(-1)[0]) / max(n, 1) for k, v in sums.items()}
        # one gather per epoch: every rank's (images, seconds) -> the total, the slowest and per-rank figures
        done = dist.all_gather_object((n * self.batch.per_rank, seconds))
        images = sum(i for i, _ in done)
        slowest = max(s for _, s in done)
        return EpochStats(epoch=epoch, losses=losses, lr=float(self.optimizer.get_lr()),
                          images_per_s=images / slowest if slowest > 0 else 0.0, seconds=slowest,
                          per_rank_images_per_s=[i / s if s > 0 else 0.0 for i, s in done])

    def _check_patience(self, epoch: int, metrics: dict) -> None:
        """Track the best fitness; with ``--patience N``, stop when N epochs passed without a better one."""
        from ppmulti.common.metrics import fitness

        score = fitness(metrics)
        if score > self.state.best_fitness:
            self.state.best_fitness, self.state.best_epoch = score, epoch + 1
        patience = self.opts.patience
        if patience and epoch + 1 - self.state.best_epoch >= patience and epoch + 1 < int(self.cfg["epoch"]):
            self.stopping_early = True
            log.warning("stopping early after epoch %d: no better fitness for %d epochs (best %.4f at epoch %d; "
                        "--patience %d)", epoch + 1, epoch + 1 - self.state.best_epoch, self.state.best_fitness,
                        self.state.best_epoch, patience)

    def _stop_on_request(self, epoch: int, step: int | None) -> None:
        """Ctrl-C / SIGTERM reached the ranks: save the interrupted epoch (rank 0) and leave.
        ``step`` None: the signal was agreed on at the end of ``epoch``, which is complete."""
        signum = self.stop_requests.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        if dist.is_main():
            stem = self.save_checkpoint("last")
            where = (f"after epoch {epoch + 1}" if step is None
                     else f"in epoch {epoch + 1} after step {step + 1}/{self.steps_per_epoch}")
            log.warning("%s: stopped %s; checkpoint %s saved, continue with --resume %s",
                        name, where, stem, self.run_dir)
        raise Interrupted(name, 128 + int(signum))

    # ----------------------------------------------------------------- weights
    def inference_weights(self) -> dict:
        """The weights to evaluate and ship: EMA's when EMA is on."""
        if self.ema is None:
            return self.model.state_dict()
        return self.ema.apply()

    def evaluate(self):
        from ppmulti.rank.engine.evaluator import CocoEvaluator

        if self.evaluator is None:
            self.evaluator = CocoEvaluator(self.cfg, worker_num=self.cfg.get("worker_num", 0))
        raw = None
        if self.ema is not None:
            raw = copy.deepcopy(self.model.state_dict())
            self.model.set_dict(self.ema.apply())
        try:
            return self.evaluator.evaluate(self.model)
        finally:
            if raw is not None:
                self.model.set_dict(raw)
            self.model.train()

    def save_checkpoint(self, name: str = "last") -> Path:
        stem = self.run_dir / "weights" / name
        ckpt.save(stem, self.model, self.inference_weights(), self.optimizer, self.lr, self.ema, self.state)
        return stem

    @property
    def final_metrics(self) -> dict:
        out = dict(self.last_metrics or {})
        out.update({"epochs": self.state.epoch, "world_size": self.world,
                    "global_batch": self.batch.global_batch, "run_dir": str(self.run_dir)})
        return out


class Interrupted(SystemExit):
    """Training stopped on a signal after saving; exits with 128 + the signal number, as a shell would."""

    def __init__(self, signal_name: str, code: int):
        super().__init__(code)
        self.signal_name = signal_name


class _StopRequests:
    """SIGINT/SIGTERM handlers that only take note; the ranks agree on stopping at a step boundary.

    Stopping where the signal lands would leave a rank inside an all-reduce its peers never join, so every
    ``log_iter`` steps (every step with one rank) the ranks sum their flags and all stop at the same step.
    """

    def __init__(self):
        self.signum: int | None = None
        self._old: dict = {}

    def __enter__(self) -> "_StopRequests":
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum, _frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt   # a second Ctrl-C: stop now, without a checkpoint
        self.signum = signum

    def agreed(self) -> bool:
        if dist.world_size() <= 1:
            return self.signum is not None
        return dist.all_reduce_sum([1.0 if self.signum is not None else 0.0])[0] > 0

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


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
