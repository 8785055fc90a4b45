"""The VisualDL tracker (the default --logger): run_dir/vdl, and the hyperparameter summary every tracker gets."""

from __future__ import annotations

from pathlib import Path

from ppmulti.rank.engine.hooks.tracking import Tracker


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


class VisualDLTracker(Tracker):
    """A VisualDL LogWriter under ``vdl_dir``: ``ppmulti board RUN_DIR`` shows it. The config's ``use_vdl: false``
    (PaddleDetection's --use_vdl false) turns it off unless --logger names it; ``vdl_log_dir`` (its --vdl_log_dir)
    puts it elsewhere."""

    label = "VisualDL"

    def __init__(self, trainer):
        from visualdl import LogWriter

        self.writer = LogWriter(logdir=str(vdl_dir(trainer.cfg, trainer.run_dir)))

    def hparams(self, hp: dict) -> None:
        self.writer.add_hparams(hp, list(HPARAM_METRICS))

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), int(step))

    def pictures(self, paths: list[Path], step: int) -> None:
        import numpy as np
        from PIL import Image

        for path in paths:
            with Image.open(path) as im:
                self.writer.add_image(path.stem, np.asarray(im.convert("RGB")), int(step))

    def flush(self) -> None:
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()
