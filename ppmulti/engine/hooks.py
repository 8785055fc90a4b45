"""Training hooks, one concern each: console log, checkpoints, results.csv/metrics.json, VisualDL."""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from pathlib import Path

from ppmulti import dist
from ppmulti.io import atomic_write_text

log = logging.getLogger("ppmulti")


class Hook:
    """Called by the Trainer at fixed points; override what you need."""

    def before_train(self, trainer) -> None: ...

    def after_step(self, trainer, epoch: int, step: int, outputs: dict, lr: float, data_time: float) -> None: ...

    def after_epoch(self, trainer, stats) -> None: ...

    def after_train(self, trainer) -> None: ...


class ConsoleLogHook(Hook):
    """Every ``log_iter`` steps: losses, lr, throughput (this rank's log; rank 0's is the console)."""

    def before_train(self, trainer) -> None:
        self.interval = max(1, int(trainer.cfg.get("log_iter", 20)))
        self.tic = time.time()
        self.steps = 0

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        self.steps += 1
        if (step + 1) % self.interval and step + 1 != trainer.steps_per_epoch:
            return
        elapsed = time.time() - self.tic
        ips = self.steps * trainer.batch.global_batch / elapsed if elapsed > 0 else 0.0
        losses = " ".join(f"{k}={float(v.numpy().reshape(-1)[0]):.4f}" for k, v in outputs.items()
                          if k.startswith("loss"))
        log.info("epoch %d/%d step %d/%d %s lr=%.6g %.1f img/s (global) data %.3fs",
                 epoch + 1, trainer.cfg["epoch"], step + 1, trainer.steps_per_epoch, losses, lr, ips,
                 data_time)
        self.tic = time.time()
        self.steps = 0

    def after_epoch(self, trainer, stats) -> None:
        msg = (f"epoch {stats.epoch + 1} done in {stats.seconds:.1f}s, {stats.images_per_s:.2f} img/s, "
               + " ".join(f"{k}={v:.4f}" for k, v in stats.losses.items()))
        if stats.metrics:
            msg += f"; bbox mAP50={stats.metrics['mAP50']:.4f} mAP50-95={stats.metrics['mAP50_95']:.4f}"
        log.info(msg)
        self.tic = time.time()
        self.steps = 0


class CheckpointHook(Hook):
    """Rank 0 writes ``weights/last`` every snapshot epoch and copies it to ``weights/best`` on a new best;
    ``--nosave`` keeps only the final save, ``--save-period N`` also keeps ``weights/epochN`` every N epochs."""

    def after_epoch(self, trainer, stats) -> None:
        epoch = stats.epoch + 1
        final = epoch == int(trainer.cfg["epoch"]) or getattr(trainer, "stopping_early", False)
        snapshot = max(1, int(trainer.cfg.get("snapshot_epoch", 1)))
        period = int(getattr(trainer.opts, "save_period", -1) or -1)
        periodic = period > 0 and epoch % period == 0
        if getattr(trainer.opts, "nosave", False):
            due = final
        else:
            due = final or epoch % snapshot == 0 or periodic
        if not due or not dist.is_main():
            return
        from ppmulti.engine.checkpoint import WEIGHTS, copy_checkpoint

        score = stats.metrics["mAP50_95"] if stats.metrics else None
        is_best = score is not None and score > trainer.state.best_map
        if is_best:
            trainer.state.best_map = score
        stem = trainer.save_checkpoint("last")
        best = stem.parent / "best"
        if is_best or not (best.parent / ("best" + WEIGHTS)).exists():
            copy_checkpoint(stem, best)
        if periodic:
            copy_checkpoint(str(stem), stem.parent / f"epoch{epoch}", state=False)


RESULT_FIELDS = ["epoch", "loss", "lr", "mAP50", "mAP50_95", "images_per_s", "epoch_seconds"]


class ResultsHook(Hook):
    """Rank 0 keeps ``results.csv`` (a row per epoch) and writes ``metrics.json`` at the end."""

    def before_train(self, trainer) -> None:
        self.path = Path(trainer.run_dir) / "results.csv"
        self.rows: list[dict] = []
        self.started = time.time()
        if self.path.exists():  # resume: keep the rows of the epochs already done
            with open(self.path, newline="") as f:
                self.rows = [r for r in csv.DictReader(f) if int(r["epoch"]) <= trainer.state.epoch]

    def after_epoch(self, trainer, stats) -> None:
        if not dist.is_main():
            return
        row = {"epoch": stats.epoch + 1, "lr": f"{stats.lr:.6g}",
               "images_per_s": f"{stats.images_per_s:.3f}", "epoch_seconds": f"{stats.seconds:.2f}",
               "mAP50": "", "mAP50_95": ""}
        for key, value in stats.losses.items():
            row[key] = f"{value:.5f}"
        if stats.metrics:
            row["mAP50"] = f"{stats.metrics['mAP50']:.5f}"
            row["mAP50_95"] = f"{stats.metrics['mAP50_95']:.5f}"
        self.rows.append(row)
        fields = list(RESULT_FIELDS)
        for r in self.rows:
            fields.extend(k for k in r if k not in fields)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buf.getvalue())

    def after_train(self, trainer) -> None:
        if not dist.is_main():
            return
        metrics = trainer.final_metrics
        metrics["train_seconds"] = round(time.time() - self.started, 2)
        metrics["weights"] = {"last": "weights/last.pdparams", "best": "weights/best.pdparams"}
        if trainer.state.best_map >= 0:
            metrics["best_mAP50_95"] = trainer.state.best_map
        atomic_write_text(Path(trainer.run_dir) / "metrics.json", json.dumps(metrics, indent=2) + "\n")


class VisualDLHook(Hook):
    """Rank 0 writes a VisualDL log under ``run_dir/vdl``: losses, lr and global images/s per logging
    step, mAP per evaluated epoch. ``visualdl --logdir RUN_DIR/vdl`` shows it."""

    def before_train(self, trainer) -> None:
        self.writer = None
        if not dist.is_main():
            return
        from visualdl import LogWriter

        self.writer = LogWriter(logdir=str(Path(trainer.run_dir) / "vdl"))
        self.interval = max(1, int(trainer.cfg.get("log_iter", 20)))
        self.tic = time.time()
        self.steps = 0

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        if self.writer is None:
            return
        self.steps += 1
        if (step + 1) % self.interval:
            return
        g = trainer.state.global_step
        for key, value in outputs.items():
            if key.startswith("loss"):
                self.writer.add_scalar(f"train/{key}", float(value.numpy().reshape(-1)[0]), g)
        self.writer.add_scalar("train/lr", float(lr), g)
        elapsed = time.time() - self.tic
        if elapsed > 0:
            self.writer.add_scalar("train/images_per_s", self.steps * trainer.batch.global_batch / elapsed, g)
        self.writer.add_scalar("train/data_time", float(data_time), g)
        self.tic, self.steps = time.time(), 0

    def after_epoch(self, trainer, stats) -> None:
        if self.writer is None:
            return
        self.writer.add_scalar("epoch/images_per_s", stats.images_per_s, stats.epoch + 1)
        if stats.metrics:
            self.writer.add_scalar("eval/mAP50", stats.metrics["mAP50"], stats.epoch + 1)
            self.writer.add_scalar("eval/mAP50_95", stats.metrics["mAP50_95"], stats.epoch + 1)

    def after_train(self, trainer) -> None:
        if self.writer is not None:
            self.writer.close()
