"""The VisualDL log under run_dir/vdl: hyperparameters, step and epoch scalars, mAP."""

from __future__ import annotations

import time
from pathlib import Path

from ppmulti.rank import dist
from ppmulti.rank.engine.hooks.base import Hook, host_losses


HPARAM_METRICS = ["eval/mAP50", "eval/mAP50_95"]


def run_hparams(trainer) -> dict:
    """The hyperparameters a run is compared by in VisualDL's hparams view (int, float or str values)."""
    cfg = trainer.cfg
    opt = (cfg.get("OptimizerBuilder") or {}).get("optimizer") or {}
    plan = trainer.lr_plan
    hp = {"config": Path(trainer.opts.config).name, "architecture": str(cfg.get("architecture", "")),
          "epochs": int(cfg["epoch"]), "world_size": int(trainer.world),
          "global_batch": int(trainer.batch.global_batch), "batch_per_rank": int(trainer.batch.per_rank),
          "accumulate": int(getattr(trainer.batch, "accumulate", 1)),
          # a trainer built from parts may have no lr plan: None values are dropped below
          "lr": plan and float(plan.lr), "base_lr": plan and float(plan.base_lr),
          "ref_batch": plan and int(plan.ref_batch), "warmup_steps": plan and int(plan.warmup_steps),
          "optimizer": str(opt.get("type", "")),
          "weight_decay": opt.get("weight_decay"), "momentum": opt.get("momentum"),
          "use_ema": int(bool(cfg.get("use_ema", False))), "eval_size": cfg.get("eval_height"),
          "seed": int(trainer.opts.seed), "amp": str(getattr(getattr(trainer, "amp", None), "mode", "off")),
          "weights": trainer.opts.weights or cfg.get("pretrain_weights") or ""}
    # VisualDL stores int, float and str; anything else (None, lists, numpy scalars) is dropped or coerced
    out = {}
    for key, value in hp.items():
        if isinstance(value, bool):
            value = int(value)
        elif hasattr(value, "item") and not isinstance(value, (int, float, str)):
            value = value.item()
        if isinstance(value, (int, float, str)):
            out[key] = value
    return out


def vdl_wanted(cfg) -> bool:
    """``use_vdl``: on unless the config says false (PaddleDetection's default is off; ppmulti's is on)."""
    value = (cfg or {}).get("use_vdl", True)
    return value is None or bool(value)


def vdl_dir(cfg, run_dir) -> Path:
    """Where the log goes: the config's ``vdl_log_dir``, else RUN_DIR/vdl."""
    return Path((cfg or {}).get("vdl_log_dir") or Path(run_dir) / "vdl")


class VisualDLHook(Hook):
    """Rank 0 writes a VisualDL log under ``run_dir/vdl``: the run's hyperparameters; per logging step the
    losses, lr, global images/s and seconds of data wait per step; per epoch the mean losses, the lr and
    the global and per-rank images/s; per evaluated epoch mAP50 and mAP50-95. ``ppmulti board RUN_DIR`` shows it.
    The config's ``use_vdl: false`` (PaddleDetection's --use_vdl false) turns it off; ``vdl_log_dir`` (its
    --vdl_log_dir) puts it elsewhere."""

    priority = 90

    def before_train(self, trainer) -> None:
        self.writer = None
        if not dist.is_main() or not vdl_wanted(trainer.cfg):
            return
        from visualdl import LogWriter

        self.writer = LogWriter(logdir=str(vdl_dir(trainer.cfg, trainer.run_dir)))
        self.writer.add_hparams(run_hparams(trainer), list(HPARAM_METRICS))
        self.interval = max(1, int(trainer.cfg.get("log_iter", 20)))
        self.tic = time.time()
        self.steps = 0
        self.data_mark = 0.0   # the epoch's cumulative data time at the last log

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        if self.writer is None:
            return
        self.steps += 1
        if (step + 1) % self.interval:
            return
        g = trainer.state.global_step
        for key, value in host_losses(outputs).items():
            self.writer.add_scalar(f"train/{key}", value, g)
        self.writer.add_scalar("train/lr", float(lr), g)
        elapsed = time.time() - self.tic
        if elapsed > 0:
            self.writer.add_scalar("train/images_per_s", self.steps * trainer.batch.global_batch / elapsed, g)
        # data_time is the epoch's running total: log the mean wait per step over this interval
        self.writer.add_scalar("train/data_time", max(0.0, float(data_time) - self.data_mark) / self.steps, g)
        self.data_mark = float(data_time)
        self.tic, self.steps = time.time(), 0

    def after_epoch(self, trainer, stats) -> None:
        if self.writer is None:
            return
        e = stats.epoch + 1
        # per-epoch means too: an epoch shorter than log_iter (an evolution candidate) logs no step scalar
        for key, value in (getattr(stats, "losses", None) or {}).items():
            self.writer.add_scalar(f"epoch/{key}", float(value), e)
        self.writer.add_scalar("epoch/lr", float(stats.lr), e)
        self.writer.add_scalar("epoch/images_per_s", stats.images_per_s, e)
        for r, ips in enumerate(getattr(stats, "per_rank_images_per_s", None) or []):
            self.writer.add_scalar(f"epoch/images_per_s_rank{r}", float(ips), e)
        if getattr(stats, "amp", None):   # float16 AMP: steps the scaler skipped, and its scale
            self.writer.add_scalar("epoch/amp_skipped_steps", float(stats.amp["skipped_steps"]), e)
            self.writer.add_scalar("epoch/amp_loss_scale", float(stats.amp["loss_scale"]), e)
        if stats.metrics:
            self.writer.add_scalar("eval/mAP50", stats.metrics["mAP50"], e)
            self.writer.add_scalar("eval/mAP50_95", stats.metrics["mAP50_95"], e)
            for r, ips in enumerate(stats.metrics.get("per_rank_images_per_s") or []):
                self.writer.add_scalar(f"eval/images_per_s_rank{r}", float(ips), e)
        self.writer.flush()
        self.tic, self.steps, self.data_mark = time.time(), 0, 0.0

    def after_train(self, trainer) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
