"""A Trainer from RunPlan: fleet, config, device, seed, checks, batch plan, run dir, logging, parts, hooks."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
from pathlib import Path
from typing import Any, Callable

from ppmulti.common.atomic import atomic_write_text
from ppmulti.common.cpus import ULTRALYTICS_SPARE_CORES
from ppmulti.common.errors import UserError
from ppmulti.common.rundir import new_run_dir
from ppmulti.rank import config as config_mod
from ppmulti.rank import dist
from ppmulti.rank import ref_batch as ref_batch_mod
from ppmulti.rank import zoo
from ppmulti.rank.data import agree
from ppmulti.rank.data import coco as coco_cache
from ppmulti.rank.data import voc
from ppmulti.rank.data.cache import apply_cache, prebuild_cache
from ppmulti.rank.data.device import place_hsv
from ppmulti.rank.engine import checkpoint as ckpt
from ppmulti.rank.engine import made_plan
from ppmulti.rank.engine import ultra_recipe
from ppmulti.rank.engine.hooks import (CheckpointHook, EarlyStopHook, EMAHook, EvaluationHook, LossWatchHook,
                                       ResumeHook, StopOnSignalHook)
from ppmulti.rank.engine.hooks.amp import MixedPrecisionHook
from ppmulti.rank.engine.hooks.amp import request as amp_request
from ppmulti.rank.engine.hooks.resume import record_run_dir
from ppmulti.rank.engine.lr import (Accumulation, BatchPlan, LRPlan, linear_warmup, optimizer_steps, plan_batch,
                                    scale_lr, yolov5_warmup_batches, yolov5_weight_decay)
from ppmulti.rank.engine.made_plan import MadePlan, plan_file_text
from ppmulti.rank.plan import PLAN_FILE, RunPlan
from ppmulti.rank.engine.trainer import Trainer, freeze_backbone

log = logging.getLogger("ppmulti")


def build_trainer(opts: RunPlan, trainer_class: type[Trainer] = Trainer,
                  after_edit: Callable[[Any], None] | None = None) -> Trainer:
    """The Trainer of one run on this rank, as ``ppmulti train`` builds it (the core hooks registered; the
    reporting ones come with ``train()`` unless hooks are registered first). ``after_edit(cfg)``: a probe's own
    change to the loaded, edited config (ppmulti bench)."""
    return _Build(opts, after_edit).trainer(trainer_class)


class _Build:
    """The steps of building a run from its options, in the order they must happen (each reads the ones
    before it): only ``trainer()`` is called from outside."""

    def __init__(self, opts: RunPlan, after_edit: Callable[[Any], None] | None = None):
        self.opts = opts
        self.after_edit = after_edit
        self.plan_notes: list[str] = []   # logged right after the plan's line (Trainer._log_plan)

    def trainer(self, trainer_class: type[Trainer]) -> Trainer:
        opts = self.opts
        self.world = dist.init()
        self.rank = dist.rank()
        self.cfg = config_mod.load(opts.config, opts.overrides)
        loaded_classes = self.cfg.get("num_classes")   # a flag's edit of it below is named by the agreement check
        if opts.edit:
            from ppmulti.rank.yolo_config import apply_edit

            notes = apply_edit(self.cfg, opts.edit)
        else:
            notes = []
        if self.after_edit is not None:
            self.after_edit(self.cfg)
        self.classes_edited = self.cfg.get("num_classes") != loaded_classes
        apply_cache(self.cfg, opts.cache)
        coco_cache.swap_in(self.cfg)   # a COCO json's parse is read from its cache after the first start
        voc.swap_in(self.cfg)          # VOC files checked at the scan as COCO's are
        from ppmulti.rank.ppdet_bridge import select_device

        self.device = select_device(self.cfg)
        hsv_on_device = place_hsv(self.cfg, self.device)
        if self.device == "cpu":   # ppmulti yolo runs: a core left out, as ultralytics leaves one
            self.threads = dist.set_cpu_threads(spare=ULTRALYTICS_SPARE_CORES if opts.ultra_args is not None else 0)
        else:
            self.threads = None
        self._seed(opts.seed)
        if opts.epochs is not None:
            self.cfg["epoch"] = int(opts.epochs)
            stretch_decay(self.cfg, int(opts.epochs))
        if opts.workers is not None:
            self.cfg["worker_num"] = int(opts.workers)
        config_mod.check_dataset(self.cfg, "TrainDataset")
        config_mod.check_dataset(self.cfg, "EvalDataset")
        self.amp = MixedPrecisionHook(amp_request(opts.amp, self.cfg.get("amp"), self.cfg.get("amp_level"),
                                                  self.device, opts.amp_default))
        # read before the batch plan and the run directory: a resumed run keeps both (engine.resume_plan)
        self.resume = ResumeHook(opts, int(self.cfg["epoch"]))
        if self.resume.plan.extends:   # the lr decay ends with the new last epoch, whichever flag asked for it
            stretch_decay(self.cfg, int(self.cfg["epoch"]))
        self.batch = self._shared_batch_plan()
        self.cfg.TrainReader["batch_size"] = self.batch.per_rank
        self._group_rect()
        self.run_dir = self._make_run_dir()
        record_run_dir(self.run_dir)
        self._setup_logging()
        for note in self.resume.plan.notes:
            log.warning("%s", note)
        for note in notes:
            log.warning("%s", note)
        if hsv_on_device is not None:
            log.info("YOLOv5's HSV gains: %s", "applied on the GPU (the loader hands over BGR uint8 and the gains)"
                     if hsv_on_device else "applied in the loader workers")
        self._apply_switches()
        if dist.is_main():
            config_mod.dump(self.cfg, self.run_dir / "config.yml")
            atomic_write_text(self.run_dir / PLAN_FILE, opts.to_json() + "\n")   # what the ranks were asked to do
            if opts.record is not None:
                _write_record(self.run_dir / "opt.yaml", opts.record)
                # the hyps this run trains with, beside its flags, with or without --hyp (as YOLOv5 keeps them):
                # the --hyp file as given, else the values read back from the resolved config
                if opts.record.get("hyp"):
                    from ppmulti.common.hyp import load_hyp

                    hyp = load_hyp(opts.record["hyp"])
                else:
                    from ppmulti.rank.yolo_config import read_hyp

                    hyp = read_hyp(self.cfg)
                _write_record(self.run_dir / "hyp.yaml", hyp)
            if opts.ultra_args is not None:   # ultralytics' args.yaml: its keys, the run's numbered name and place
                _write_record(self.run_dir / "args.yaml",
                              {**opts.ultra_args, "name": self.run_dir.name, "save_dir": str(self.run_dir)})
        self._build_parts()
        if dist.is_main():   # what rank 0 made for every rank, beside what they were asked
            atomic_write_text(self.run_dir / PLAN_FILE, plan_file_text(opts.to_json(), self.made))
        state = ckpt.TrainState(epoch=0, global_step=0, world_size=self.world, global_batch=self.batch.global_batch,
                                accumulate=self.batch.accumulate)
        hooks = [EMAHook(), self.amp, self.resume, EvaluationHook(), EarlyStopHook(opts.patience), CheckpointHook(),
                 LossWatchHook(), StopOnSignalHook()]
        if self.image_weights is not None:
            from ppmulti.rank.engine.hooks.image_weights import ImageWeightsHook

            hooks.append(ImageWeightsHook(self.image_weights))
        if self.warmup_batches:
            hooks.append(self._yolov5_warmup_hook())
        if opts.callbacks:   # users' callbacks, in every rank
            from ppmulti.rank.engine.hooks.callbacks import CallbacksHook

            hooks += [CallbacksHook(list(opts.callbacks), "early"), CallbacksHook(list(opts.callbacks), "late")]
        if int(self.cfg.get("close_mosaic") or 0) > 0:   # ultralytics' configs: mosaic off for the last N epochs
            from ppmulti.rank.engine.hooks.close_mosaic import CloseMosaicHook

            hooks.append(CloseMosaicHook(int(self.cfg["close_mosaic"])))
        if self.cfg.get("profiler_options"):   # PaddleDetection's --profiler_options (-o profiler_options=...)
            from ppmulti.rank.engine.hooks.profiler import ProfilerHook, parse_options

            hooks.append(ProfilerHook(parse_options(self.cfg["profiler_options"])))
        trainer = trainer_class(self.model, self.loader, self.optimizer, lr=self.lr, cfg=self.cfg, opts=opts,
                                run_dir=self.run_dir, state=state, batch=self.batch, world=self.world, rank=self.rank,
                                train_model=self.train_model, amp=self.amp, dataset=self.dataset,
                                lr_plan=self.lr_plan, hooks=hooks, report_by_default=True,
                                multi_scale=self._multi_scale())
        trainer.device, trainer.threads, trainer.conv_kernel = self.device, self.threads, self.conv_kernel
        trainer.plan_notes = self.plan_notes
        if self.warmup_batches:   # groups ramp from 1 batch unless --accumulate N was given; the lr counts batches
            ramp = self.warmup_batches if self.opts.accumulate is None else 0
            trainer.accumulation = Accumulation(self.batch.accumulate, len(self.loader), ramp)
            trainer.lr_per_batch = True
        return trainer

    def _seed(self, seed: int) -> None:
        import numpy as np
        import paddle

        # ranks differ in augmentation randomness but start from the same weights (see _build_parts)
        random.seed(seed + self.rank)
        np.random.seed(seed + self.rank)
        paddle.seed(seed + self.rank)

    def _apply_switches(self) -> None:
        """--deterministic / --cudnn-benchmark in this rank: Paddle reads these flags when a kernel runs, so
        setting them here (after import, in every rank, one process or many) takes effect for the whole run."""
        from ppmulti.rank import compat

        switches = self.opts.switches
        if switches.mode == "default":
            return
        for key, value in switches.env.items():
            os.environ.setdefault(key, value)
        done, absent = compat.set_defined_flags(switches.flags)
        log.info("%s mode (%s): %s%s", switches.mode, switches.why,
                 f"set {', '.join(f'{k}={switches.flags[k]}' for k in done)}" if done else "nothing to set",
                 f"; this Paddle build has no {', '.join(absent)}" if absent else "")

    def _shared_batch_plan(self) -> BatchPlan:
        """Rank 0's batch plan, for every rank (dist.made_on_main), once every rank's edited config has been
        found the same as rank 0's (made_plan.refuse_differing): the plan is needed before the dataset is built,
        the rest of the plan (made_plan.MadePlan) once it is loaded."""
        digest = made_plan.config_digest(config_mod.resolved(self.cfg))
        return dist.made_on_main(self._batch_plan, mine=digest,
                                 check=lambda digests: made_plan.refuse_differing(digests, str(self.opts.config)))

    def _batch_plan(self) -> BatchPlan:
        """--batch, --accumulate, YOLOv5's nominal batch and a resumed run's effective batch (lr.plan_batch)."""
        given = self.cfg.TrainReader["batch_size"]
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:   # -o is checked at the start
            raise UserError(f"TrainReader.batch_size: {given!r} in {self.opts.config}: expected a whole number of "
                            f"images per rank, 1 or more (e.g. batch_size: 8), or pass --batch N")
        return plan_batch(self.world, given, batch=self.opts.batch,
                          accumulate=self.opts.accumulate, nominal=self.opts.nominal_batch,
                          trained=self.resume.plan.trained)

    def _group_rect(self) -> None:
        """--rect's letterbox shapes grouped by the plan's global batch (a resumed run's kept one, not the
        config's batch_size x world): the dataset, built after this, reads it."""
        if self.opts.edit is not None and self.opts.edit.rect:
            from ppmulti.rank.yolo_config import set_rect_batch

            set_rect_batch(self.cfg, self.batch.global_batch)

    def _image_weights_sampler(self):
        """--image-weights: the train loader's batch sampler (data.sampler), None without the flag."""
        if not self.opts.image_weights:
            return None
        from ppmulti.rank.data.sampler import ImageWeightsBatchSampler

        reader = self.cfg.TrainReader
        return ImageWeightsBatchSampler(self.dataset, self.batch.per_rank, int(self.cfg["num_classes"]), self.rank,
                                        self.world, drop_last=bool(reader.get("drop_last", True)), seed=self.opts.seed)

    def _multi_scale(self):
        """--multi-scale: YOLOv5's size draw around the training size (the config's eval size), the same on
        every rank (engine.multiscale)."""
        if not self.opts.multi_scale:
            return None
        from ppmulti.rank.engine.multiscale import MultiScale

        imgsz = max(int(self.cfg.get("eval_height") or 0), int(self.cfg.get("eval_width") or 0))
        if imgsz < 32:
            raise UserError("--multi-scale needs the training image size: set --imgsz (or eval_height/eval_width)")
        return MultiScale(imgsz, seed=self.opts.seed)

    def _make_run_dir(self) -> Path:
        """Rank 0 makes the run directory and tells the others; a file in its way (``runs``, ``output``) is one
        line on every rank, so that no rank waits for a directory that never comes."""
        # the flag that moves the run elsewhere, in the dialect of the command line
        yolo = self.opts.record is not None
        where = ("--project DIR (or --output DIR)" if yolo else "--output DIR" if self.opts.output
                 else "-o save_dir=DIR (or --output DIR)")

        def make() -> str:
            if self.resume.run_dir is not None:
                return str(self.resume.run_dir)
            if self.opts.output:
                return str(new_run_dir(Path(self.opts.output).parent, Path(self.opts.output).name,
                                       exist_ok=bool(self.opts.exist_ok), where=where))
            return str(new_run_dir(Path(self.cfg.get("save_dir", "output")), self.cfg["filename"],
                                   exist_ok=self.opts.exist_ok, where=where))

        run_dir = Path(dist.made_on_main(make))
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        return run_dir

    def _setup_logging(self) -> None:
        from ppmulti.rank.ranklog import setup_rank_logging

        setup_rank_logging(self.run_dir, self.rank)

    def _build_parts(self) -> None:
        """Dataset, loader, lr plan, model, lr schedule and optimizer; AMP and CPU convolutions set up, and
        the model and optimizer wrapped for several ranks."""
        import paddle
        from paddle.distributed import fleet
        from ppdet.core.workspace import create

        from ppmulti.rank import compat
        from ppmulti.rank.ranklog import prints_to_log

        cfg = self.cfg
        self.dataset = create("TrainDataset")()
        self.image_weights = self._image_weights_sampler()
        try:
            with prints_to_log():   # pycocotools' notices while the annotations load
                self.loader = create("TrainReader")(self.dataset, cfg.get("worker_num", 0), self.image_weights)
        except KeyError:   # ppdet's COCO parse meets an annotation whose category is not listed
            explained = agree.explain_parse_error(cfg, "TrainDataset")
            if explained is None:
                raise
            raise explained from None
        self._agree_classes()   # before the model is built: it may take num_classes from the data
        prebuild_cache(self.dataset, cfg)   # --cache: built here, before the loader's workers fork
        # rank 0 makes the rest of the plan from its loader; the others follow it (the same edits, its numbers)
        self.made = dist.made_on_main(self._plan_training, follow=self._plan_training,
                                      mine=len(self.dataset.roidbs), check=made_plan.refuse_other_data)
        steps_per_epoch = self.made.steps_per_epoch
        if self.opts.nominal_batch:
            self._yolov5_weight_decay(int(self.opts.nominal_batch))

        paddle.seed(self.opts.seed)  # identical initial weights on every rank
        self.model = create(cfg.architecture)
        self.model.load_meanstd(cfg["TestReader"]["sample_transforms"])
        if cfg.get("print_params"):   # PaddleDetection's count: weights, not BatchNorm's running statistics
            n = sum(int(p.size) for name, p in self.model.named_parameters()
                    if not any(x in name for x in (*compat.batchnorm_state_names(), "aux_")))
            self.plan_notes.append(f"model params: {n / 1e6:.3f} M (print_params)")
        self._load_initial_weights()
        if self.opts.freeze:
            freeze_backbone(self.model, self.opts.freeze)
        self._maybe_sync_bn()
        self.lr = create("LearningRate")(steps_per_epoch)
        musgd = ultra_recipe.wants_musgd(cfg["OptimizerBuilder"])
        if musgd:   # ppmulti's own (ppdet's OptimizerBuilder builds paddle.optimizer classes only)
            from ppmulti.rank.engine import musgd_run

            self.optimizer = musgd_run.from_config(cfg["OptimizerBuilder"], self.lr, self.model)
            self.plan_notes.append(self.optimizer.describe(self.lr_plan.lr))
            musgd_run.refuse_amp(*self._amp_mode())
        else:
            with ultra_recipe.adamw_decay_groups(cfg):   # an ultralytics model's AdamW: its no-decay groups
                self.optimizer = create("OptimizerBuilder")(self.lr, self.model)
        self.amp.setup(self)   # may cast the model (O2): before it is wrapped for several ranks
        self.conv_kernel = None
        if self.device == "cpu":
            from ppmulti.rank.ops.cpu import setup_cpu_ops

            self.conv_kernel = setup_cpu_ops(self.model, bf16=self.amp.mode == "bfloat16")
        self.train_model = self.model
        if self.world > 1:
            unused, note = zoo.find_unused_parameters(cfg, self.world)
            if note:
                self.plan_notes.append(note)
            self.train_model = compat.distributed_model(self.model, unused)
            # the DataParallel model all-reduces the gradients in backward; fleet's optimizer wrapper takes
            # Paddle optimizers only, and MuSGD needs nothing of it
            if not musgd:
                self.optimizer = fleet.distributed_optimizer(self.optimizer)

    def _amp_mode(self) -> tuple[str, str]:
        """The AMP mode and level this run will take on its device (what MixedPrecisionHook.setup decides)."""
        from ppmulti.rank.engine.hooks.amp import cpu_bf16_problem
        from ppmulti.rank.engine.hooks.amp import plan as amp_plan

        decided = amp_plan(self.amp.req, self.device, cpu_bf16_problem)
        return decided.mode, decided.level

    def _agree_classes(self) -> None:
        """The data's classes against num_classes (data.agree), on every rank before the first step: one line
        at start instead of ppdet's KeyError in the evaluation after an epoch."""
        cfg = self.cfg
        origin = agree.num_classes_origin(self.opts.config, self.opts.overrides,
                                          "--data/--cfg" if self.classes_edited else None)
        train = agree.dataset_classes(self.dataset, "TrainDataset", cfg.get("TrainDataset"))
        notes = agree.agree_train(cfg, train, origin, str(self.opts.config), agree.max_label(self.dataset))
        agree.agree_eval(cfg, train, str(self.opts.config), origin)
        for note in notes:
            log.warning("%s", note)
        if notes:
            from ppmulti.rank import compat

            compat.set_reader_num_classes(self.loader, int(cfg["num_classes"]))   # built with the old one
            if self.image_weights is not None:
                self.image_weights.nc = int(cfg["num_classes"])

    def _plan_training(self, made: MadePlan | None = None) -> MadePlan:
        """The rest of the plan, once the training set is loaded: the batch a set smaller than the batch trains
        with, YOLOv5's recipe and warmup, the steps the lr counts and the LR plan, with the config edits they
        bring. Rank 0 makes it (``made`` None); the other ranks follow rank 0's ``made``: the same config edits
        (ppdet's workspace is per process) with rank 0's numbers."""
        if (len(self.loader) < 1) if made is None else (made.batch != self.batch):
            self._small_set(None if made is None else made.batch)
        # optimizer=auto decided: config.yml names the optimizer, lr and momentum chosen (ppdet's OptimizerBuilder,
        # which the run's tools and a resume build from it, has no `auto`)
        self.plan_notes += ultra_recipe.choose_for_run(self.cfg, self.dataset.roidbs, self.batch,
                                                       self.opts.nominal_batch)
        # a YOLOv5 command line warms up as YOLOv5 does, batch by batch (hooks.warmup): its lr counts batches
        self.warmup_batches = (self._yolov5_warmup(None if made is None else made.warmup_batches)
                               if self.opts.nominal_batch else 0)
        if made is None:
            steps_per_epoch = (len(self.loader) if self.warmup_batches else
                               optimizer_steps(len(self.loader), self.batch.accumulate))   # what the lr counts
        else:
            steps_per_epoch = made.steps_per_epoch
        self.lr_plan = self._scale_lr(len(self.dataset.roidbs), steps_per_epoch, None if made is None else made.lr)
        return MadePlan(self.batch, self.lr_plan, self.warmup_batches, steps_per_epoch)

    def _small_set(self, made: BatchPlan | None = None) -> None:
        """A training set smaller than the batch trains as YOLOv5 trains it: one smaller batch. Each rank's
        batch becomes its shard (the sampler pads every shard to the same size, so every rank runs the same
        one step and the collectives stay in step); the lr is scaled for the batch actually used. ``made``:
        rank 0's smaller batch, which the other ranks take."""
        from ppdet.core.workspace import create

        from ppmulti.rank import compat
        from ppmulti.rank.ranklog import prints_to_log

        images = len(self.dataset.roidbs)
        asked = self.batch
        if made is None:
            if images < self.world:
                raise UserError(f"the training set has {images} image(s), fewer than the {self.world} ranks: "
                                f"every rank needs at least one; train on {images or 1} rank(s) or add images")
            shard = getattr(compat.batch_sampler(self.loader), "num_samples", None) or math.ceil(images / self.world)
            shard = min(int(shard), self.batch.per_rank)
            self.batch = dataclasses.replace(asked, global_batch=shard * self.world, per_rank=shard)
        else:
            self.batch = made
            shard = made.per_rank
        # the accumulation stays as planned from the batch asked for, as YOLOv5 computes it from --batch-size
        self.cfg.TrainReader["batch_size"] = shard
        self.image_weights = self._image_weights_sampler()
        with prints_to_log():
            self.loader = create("TrainReader")(self.dataset, self.cfg.get("worker_num", 0), self.image_weights)
        if len(self.loader) < 1:   # our own invariant: a shard always fills one batch of its own size
            raise RuntimeError(f"training loader still empty with a per-rank batch of {shard}")
        log.warning("the training set has %d images, fewer than the batch %d: training with batch %d "
                    "(%d per rank), as YOLOv5 does", images, asked.global_batch, self.batch.global_batch, shard)

    def _scale_lr(self, dataset_size: int, steps_per_epoch: int, made: LRPlan | None = None) -> LRPlan:
        """The LR plan (rank 0's ``made`` on the other ranks) and its edits of the config's LearningRate."""
        lr_cfg = self.cfg["LearningRate"]
        base_lr = float(lr_cfg["base_lr"])
        ref = ref_batch_mod.resolve(self.cfg.get("ref_batch"), self.opts.config, self.opts.overrides)
        ref_batch = ref.ref_batch or self.batch.effective_batch
        if ref.from_docs is not None:   # kept in the run's config.yml, which a bare --resume reads
            self.cfg["ref_batch"] = ref_batch
        if dist.is_main():
            # the run's config.yml again, as planned: the classes agreed with the data, a small set's batch, the
            # optimizer=auto choice, the ref_batch; before base_lr is scaled (every dump keeps the lr at ref_batch)
            config_mod.dump(self.cfg, self.run_dir / "config.yml")
        warmup = linear_warmup(lr_cfg.get("schedulers") or [])
        if made is None:
            plan = scale_lr(base_lr, ref_batch, self.batch.effective_batch, dataset_size,
                            warmup_steps=None if warmup is None else warmup.get("steps", 500),
                            warmup_epochs=None if warmup is None else warmup.get("epochs"),
                            total_steps=steps_per_epoch * int(self.cfg["epoch"]))
            plan = dataclasses.replace(plan, ref_source=ref.source)
            if self.warmup_batches:
                plan = dataclasses.replace(plan, warmup_steps=self.warmup_batches, yolov5_warmup=True)
        else:
            plan = made
        if self.warmup_batches:
            from ppmulti.rank.engine.hooks.warmup import START_FACTOR

            warmup["start_factor"] = START_FACTOR
        lr_cfg["base_lr"] = plan.lr
        if warmup is not None:
            warmup["steps"] = plan.warmup_steps
            warmup["epochs"] = None
        return plan

    def _yolov5_warmup_hook(self):
        """YOLOv5's warmup of the biases' lr and the momentum (hooks.warmup), and its line in the log."""
        from ppmulti.rank.engine.hooks.warmup import YOLOv5WarmupHook

        bias_lr, momentum = float(self.cfg.get("warmup_bias_lr", 0.1)), float(self.cfg.get("warmup_momentum", 0.8))
        ramp = (f"batches per optimizer step from 1 to {self.batch.accumulate}, "
                if self.opts.accumulate is None and self.batch.accumulate > 1 else "")
        sgd = self.cfg["OptimizerBuilder"]["optimizer"].get("type") in ("Momentum", ultra_recipe.MUSGD_TYPE)
        self.plan_notes.append(f"YOLOv5's warmup, first {self.warmup_batches} batches: {ramp}lr from 0, biases' lr "
                               f"from {bias_lr:g} (warmup_bias_lr)"
                               + (f", momentum from {momentum:g} (warmup_momentum)" if sgd else ""))
        return YOLOv5WarmupHook(self.warmup_batches, bias_lr, momentum)

    def _yolov5_warmup(self, made: int | None = None) -> int:
        """YOLOv5's warmup length in batches (lr.yolov5_warmup_batches: at least 100, at most a third of the run),
        from the config's LinearWarmup epochs (hyp warmup_epochs); YOLOv5 warms up even with none, so a missing
        LinearWarmup is added. ``made``: rank 0's length, which the other ranks take."""
        scheds = self.cfg["LearningRate"].setdefault("schedulers", [])
        warmup = next((s for s in scheds if isinstance(s, dict) and s.get("name") == "LinearWarmup"), None)
        if warmup is None:
            warmup = {"name": "LinearWarmup", "start_factor": 0.0, "epochs": 0.0}
            scheds.append(warmup)
            for sched in scheds:
                if isinstance(sched, dict) and "use_warmup" in sched:
                    sched["use_warmup"] = True
        if made is not None:
            return made
        batches = len(self.loader)
        epochs = warmup.get("epochs")
        if epochs is None:   # a warmup given in optimizer steps at the reference batch
            epochs = float(warmup.get("steps") or 0) * int(self.cfg.get("ref_batch") or 1) / max(1, len(
                self.dataset.roidbs))
        return yolov5_warmup_batches(float(epochs), batches, batches * int(self.cfg["epoch"]))

    def _yolov5_weight_decay(self, nominal: int) -> None:
        """YOLOv5's weight decay per optimizer step (``wd x effective batch / nbs`` at lr0): see
        lr.yolov5_weight_decay. The L2 regularizer's factor, or AdamW's decoupled weight_decay."""
        builder = self.cfg["OptimizerBuilder"]
        opt, reg = builder.get("optimizer") or {}, builder.get("regularizer") or {}
        ref = self.lr_plan.ref_batch
        if opt.get("type") == "AdamW" and isinstance(opt.get("weight_decay"), (int, float)):
            opt["weight_decay"] = yolov5_weight_decay(opt["weight_decay"], ref, nominal)
            wd = opt["weight_decay"]
        elif reg.get("factor") is not None:
            reg["factor"] = yolov5_weight_decay(reg["factor"], ref, nominal)
            wd = reg["factor"]
        else:
            return
        self.plan_notes.append(f"weight decay {wd:g} x the lr scaled from effective batch "
                               f"{self.batch.effective_batch} / ref_batch {ref}: YOLOv5's decay x effective batch "
                               f"/ {nominal} per optimizer step")

    def _load_initial_weights(self) -> None:
        from ppmulti.rank.engine.pretrained import load_initial_weights

        if self.resume.path is None:
            load_initial_weights(self.model, self.cfg, self.opts.weights)

    def _maybe_sync_bn(self) -> None:
        """--sync-bn or ppdet's ``norm_type: sync_bn``: BatchNorm statistics over all ranks' batches. GPUs take
        Paddle's SyncBatchNorm; elsewhere (CPU ranks over gloo) Paddle has no kernel, so ppmulti's collective one
        (ops.sync_bn) replaces every BatchNorm, with the same parameters and state-dict keys. There it is asked for
        by --sync-bn only: a config's ``norm_type: sync_bn`` is written for GPUs, PaddleDetection's own trainer
        keeps per-rank BatchNorm on CPUs, and the collective one costs 2-3x the step time on CPU ranks
        (bench/results/sync_bn.md); the run log says so."""
        import paddle

        wanted = self.opts.sync_bn or self.cfg.get("norm_type") == "sync_bn"
        if not wanted or self.world <= 1:
            if self.opts.sync_bn and self.world <= 1:
                log.info("--sync-bn with one rank: nothing to synchronise, plain BatchNorm")
            return
        source = "--sync-bn" if self.opts.sync_bn else "norm_type: sync_bn"
        if self.device == "gpu":
            self.model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
            self.plan_notes.append(f"BatchNorm layers converted to Paddle's SyncBatchNorm across {self.world} "
                                   f"ranks ({source})")
            return
        if not self.opts.sync_bn:
            self.plan_notes.append(f"norm_type: sync_bn: BatchNorm per rank on {self.device} ranks, as "
                                   f"PaddleDetection's trainer keeps it; --sync-bn synchronises it (2-3x the step time "
                                   f"on CPU ranks)")
            return
        from ppmulti.rank.ops.sync_bn import convert_sync_batchnorm

        n = convert_sync_batchnorm(self.model)
        self.plan_notes.append(f"{n} BatchNorm layers synchronised across {self.world} ranks ({source}; "
                               f"all-reduced statistics on {self.device})")


def _write_record(path: Path, record: dict) -> None:
    import yaml

    from ppmulti.common.atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(record, sort_keys=False, default_flow_style=None))


def stretch_decay(cfg, epochs: int) -> None:
    """``--epochs`` also sets the length of the lr decay, so the schedule ends with the run."""
    for sched in cfg["LearningRate"].get("schedulers", []) or []:
        if isinstance(sched, dict) and "max_epochs" in sched:
            sched["max_epochs"] = epochs


def train(opts: RunPlan) -> dict:
    """Build a Trainer from options and train it; the Python face of ``tools/train.py``."""
    return build_trainer(opts).train()
