"""Training hooks, one concern each: console log, checkpoints, results.csv/metrics.json, VisualDL."""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from pathlib import Path

from ppmulti.rank import dist
from ppmulti.common.atomic import atomic_write_text

log = logging.getLogger("ppmulti")


class StepOutputs(dict):
    """One step's outputs (loss tensors by name); ``losses()`` copies the losses to the host once per step,
    whichever hook asks first (the console and VisualDL log at the same steps)."""

    _host: dict[str, float] | None = None

    def losses(self) -> dict[str, float]:
        if self._host is None:
            self._host = {k: float(v.numpy().reshape(-1)[0]) for k, v in self.items() if k.startswith("loss")}
        return self._host


def host_losses(outputs: dict) -> dict[str, float]:
    """The loss values of ``outputs`` as floats (a plain dict, as tests pass, is copied each time)."""
    return (outputs if isinstance(outputs, StepOutputs) else StepOutputs(outputs)).losses()


class Hook:
    """Called by the Trainer at fixed points; override what you need."""

    def before_train(self, trainer) -> None: ...

    def after_step(self, trainer, epoch: int, step: int, outputs: dict, lr: float, data_time: float) -> None: ...

    def after_epoch(self, trainer, stats) -> None: ...

    def after_train(self, trainer) -> None: ...

    def close(self, trainer) -> None:
        """Always last, after ``after_train`` or when training raised: give back what ``before_train`` took."""


class ConsoleLogHook(Hook):
    """Every ``log_iter`` steps: losses, lr, throughput (this rank's log; rank 0's is the console).

    On a terminal (rank 0) an epoch bar shows the same figures in its postfix; the per-interval lines then
    go to train.log only, so the console is not filled twice. Off a terminal nothing changes."""

    def __init__(self, stream=None):
        self.stream = stream   # the console; None: sys.stdout (tests pass their own)
        self.bar = None
        self.bars = None

    def before_train(self, trainer) -> None:
        from ppmulti.rank.engine.progress import ConsoleBars, wants_bars

        self.interval = max(1, int(trainer.cfg.get("log_iter", 20)))
        self.tic = time.time()
        self.steps = 0
        self.bar = None
        self.bars = ConsoleBars(self.stream).__enter__() if wants_bars(self.stream) else None

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        self.steps += 1
        if self.bars is not None:
            if self.bar is None:   # opened on the first step, so a resumed epoch starts part-way
                self.bar = self.bars.bar(trainer.steps_per_epoch, f"epoch {epoch + 1}/{trainer.cfg['epoch']}",
                                         initial=step)
            self.bar.update(1)
        if (step + 1) % self.interval and step + 1 != trainer.steps_per_epoch:
            return
        elapsed = time.time() - self.tic
        ips = self.steps * trainer.batch.global_batch / elapsed if elapsed > 0 else 0.0
        values = host_losses(outputs)
        losses = " ".join(f"{k}={v:.4f}" for k, v in values.items())
        extra = None
        if self.bar is not None:
            # throughput first: a narrow terminal cuts the postfix from the right
            short = " ".join(f"{k if k == 'loss' else k[5:]}={v:.3f}" for k, v in values.items())
            self.bar.set_postfix_str(f"{ips:.1f} img/s lr={lr:.3g} {short}", refresh=False)
            from ppmulti.rank.engine.progress import FILE_ONLY

            extra = {FILE_ONLY: True}
        log.info("epoch %d/%d step %d/%d %s lr=%.6g %.1f img/s (global) data %.3fs",
                 epoch + 1, trainer.cfg["epoch"], step + 1, trainer.steps_per_epoch, losses, lr, ips,
                 data_time, extra=extra)
        self.tic = time.time()
        self.steps = 0

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def after_epoch(self, trainer, stats) -> None:
        self._close_bar()
        msg = (f"epoch {stats.epoch + 1} done in {stats.seconds:.1f}s, {stats.images_per_s:.2f} img/s, "
               + " ".join(f"{k}={v:.4f}" for k, v in stats.losses.items()))
        if stats.metrics:
            msg += f"; bbox mAP50={stats.metrics['mAP50']:.4f} mAP50-95={stats.metrics['mAP50_95']:.4f}"
        log.info(msg)
        self.tic = time.time()
        self.steps = 0

    def after_train(self, trainer) -> None:
        self.close(trainer)

    def close(self, trainer) -> None:
        # also on an exception or Ctrl-C: stdout, stderr and the console handler must not stay wrapped
        self._close_bar()
        if self.bars is not None:
            self.bars.__exit__(None, None, None)
            self.bars = None


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
        from ppmulti.rank.engine.checkpoint import WEIGHTS, copy_checkpoint

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


HPARAM_METRICS = ["eval/mAP50", "eval/mAP50_95"]


def run_hparams(trainer) -> dict:
    """The hyperparameters a run is compared by in VisualDL's hparams view (int, float or str values)."""
    cfg = trainer.cfg
    opt = (cfg.get("OptimizerBuilder") or {}).get("optimizer") or {}
    plan = trainer.lr_plan
    hp = {"config": Path(trainer.opts.config).name, "architecture": str(cfg.get("architecture", "")),
          "epochs": int(cfg["epoch"]), "world_size": int(trainer.world),
          "global_batch": int(trainer.batch.global_batch), "batch_per_rank": int(trainer.batch.per_rank),
          "lr": float(plan.lr), "base_lr": float(plan.base_lr), "ref_batch": int(plan.ref_batch),
          "warmup_steps": int(plan.warmup_steps), "optimizer": str(opt.get("type", "")),
          "weight_decay": opt.get("weight_decay"), "momentum": opt.get("momentum"),
          "use_ema": int(bool(cfg.get("use_ema", False))), "eval_size": cfg.get("eval_height"),
          "seed": int(trainer.opts.seed), "weights": trainer.opts.weights or cfg.get("pretrain_weights") or ""}
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


class VisualDLHook(Hook):
    """Rank 0 writes a VisualDL log under ``run_dir/vdl``: the run's hyperparameters; per logging step the
    losses, lr, global images/s and seconds of data wait per step; per epoch the global and per-rank
    images/s; per evaluated epoch mAP50 and mAP50-95. ``ppmulti board RUN_DIR`` shows it."""

    def before_train(self, trainer) -> None:
        self.writer = None
        if not dist.is_main():
            return
        from visualdl import LogWriter

        self.writer = LogWriter(logdir=str(Path(trainer.run_dir) / "vdl"))
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
        self.writer.add_scalar("epoch/images_per_s", stats.images_per_s, e)
        for r, ips in enumerate(getattr(stats, "per_rank_images_per_s", None) or []):
            self.writer.add_scalar(f"epoch/images_per_s_rank{r}", float(ips), e)
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


class PlotsHook(Hook):
    """Rank 0 draws ``results.png`` from results.csv and ``PR_curve.png`` on every evaluated epoch (matplotlib
    costs a fraction of a second, so not on every epoch). The last epoch always evaluates, so the final
    plots need no drawing of their own."""

    def after_epoch(self, trainer, stats) -> None:
        if not dist.is_main() or not stats.metrics:
            return
        self._results(trainer)
        curve = getattr(getattr(trainer, "evaluator", None), "last_pr", None)
        if curve is not None:
            from ppmulti.rank.engine.plots import PR_PNG, plot_pr

            self._guard(plot_pr, curve, Path(trainer.run_dir) / PR_PNG)

    def _results(self, trainer) -> None:
        from ppmulti.rank.engine.plots import RESULTS_PNG, plot_results

        csv_path = Path(trainer.run_dir) / "results.csv"
        if csv_path.is_file():
            self._guard(plot_results, csv_path, Path(trainer.run_dir) / RESULTS_PNG)

    @staticmethod
    def _guard(fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a plot is a convenience: never stop a training for it
            log.warning("could not draw %s: %s: %s", args[-1], type(exc).__name__, exc)
