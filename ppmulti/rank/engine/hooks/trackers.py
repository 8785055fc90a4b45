"""The trackers hook: one set of scalars, hyperparameters and pictures, sent by rank 0 to each --logger tracker."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from ppmulti.common import trackers as names
from ppmulti.common.errors import first_line
from ppmulti.common.secrets import Redactor
from ppmulti.rank import dist
from ppmulti.rank.engine.hooks.base import Hook, host_losses
from ppmulti.rank.engine.hooks.tracking import Tracker
from ppmulti.rank.engine.hooks.visualdl import run_hparams, vdl_wanted

log = logging.getLogger("ppmulti")

PICTURES = ("*.png", "*.jpg")   # the run directory's pictures (plots, mosaics, curves), logged at the end
FILES = ("results.csv", "opt.yaml", "hyp.yaml", "config.yml", "metrics.json")   # MLflow keeps these too


def chosen(trainer) -> tuple[str, ...]:
    """The run's trackers: --logger's, else VisualDL unless the config's use_vdl is false."""
    loggers = getattr(trainer.opts, "loggers", None)
    if loggers is not None:
        return tuple(loggers)
    return names.DEFAULT if vdl_wanted(trainer.cfg) else ()


def run_params(trainer) -> dict:
    """The run's hyperparameters for the trackers: VisualDL's summary (visualdl.run_hparams), the options under
    ``opt/`` (YOLOv5's opt.yaml record, else RunPlan) and the hyp values under ``hyp/``; int, float or str."""
    hp = dict(run_hparams(trainer))
    for key, value in _options(trainer.opts).items():
        hp[f"opt/{key}"] = value
    for key, value in _hyp(trainer).items():
        hp[f"hyp/{key}"] = value
    return {k: v for k, v in ((k, _plain(v)) for k, v in hp.items()) if v is not None}


def _plain(value):
    if isinstance(value, bool):
        return int(value)
    if hasattr(value, "item") and not isinstance(value, (int, float, str)):
        value = value.item()
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return None


def _options(opts) -> dict:
    record = getattr(opts, "record", None)
    if isinstance(record, dict):
        return record
    if dataclasses.is_dataclass(opts):
        items = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    else:
        items = dict(vars(opts))
    skip = ("edit", "switches", "record")
    return {k: v for k, v in items.items() if k not in skip and _plain(v) is not None}


def _hyp(trainer) -> dict:
    """The run's hyp.yaml when it has one, else the --hyp file its opt.yaml names."""
    import yaml

    record = getattr(trainer.opts, "record", None) or {}
    for path in (Path(trainer.run_dir) / "hyp.yaml" if trainer.run_dir else None, record.get("hyp")):
        if path and Path(path).is_file():
            try:
                data = yaml.safe_load(Path(path).read_text())
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(data, dict):
                return {str(k): v for k, v in data.items() if isinstance(v, (int, float, str, bool))}
    return {}


def run_pictures(run_dir) -> list[Path]:
    """The pictures in the run directory (not in its subdirectories), by name."""
    if run_dir is None:
        return []
    return sorted({p for pattern in PICTURES for p in Path(run_dir).glob(pattern) if p.is_file()})


def _build(tracker: str, trainer, resumed: dict) -> Tracker:
    if tracker == names.VISUALDL:
        from ppmulti.rank.engine.hooks.visualdl import VisualDLTracker   # visualdl: imported when chosen

        return VisualDLTracker(trainer)
    if tracker == names.TENSORBOARD:
        from ppmulti.rank.engine.hooks.tensorboard_log import TensorBoardTracker

        return TensorBoardTracker(trainer)
    from ppmulti.rank.engine.hooks.mlflow_log import MLflowTracker

    return MLflowTracker(trainer, run_id=resumed.get("mlflow_run_id"))


class TrackersHook(Hook):
    """Rank 0 logs the run to each tracker --logger names (VisualDL by default, under RUN_DIR/vdl; TensorBoard
    event files in RUN_DIR, as YOLOv5 writes them; an MLflow run): the hyperparameters at the start; per logging
    step the losses, lr, global images/s and seconds of data wait per step; per epoch the mean losses, the lr,
    the global and per-rank images/s and, on evaluated epochs, mAP50 and mAP50-95; at the end the run
    directory's pictures (and, for MLflow, results.csv, opt.yaml, hyp.yaml, config.yml, metrics.json).
    A tracker that fails (a tracking server gone) is named in one warning and dropped; training goes on.
    MLflow's run id is kept in checkpoints, so a resumed run continues its MLflow run."""

    priority = 90
    reads_weights = False   # names the weights files at most: the checkpoint's write goes on
    name = "trackers"

    def __init__(self, only: tuple[str, ...] | None = None):
        self.only = only   # None: the run's choice (chosen()); VisualDLHook fixes it
        self.trackers: list[Tracker] = []
        self.resumed: dict = {}   # this hook's state in the checkpoint a run resumes from
        self.mlflow_run_id: str | None = None

    def before_train(self, trainer) -> None:
        self.trackers = []
        if not dist.is_main():
            return
        self._redactor = Redactor()
        self.interval = max(1, int(trainer.cfg.get("log_iter", 20)))
        self.tic = time.time()
        self.steps = 0
        self.data_mark = 0.0   # the epoch's cumulative data time at the last log
        for tracker in (self.only if self.only is not None else chosen(trainer)):
            try:
                self.trackers.append(_build(tracker, trainer, self.resumed))
            except Exception as exc:   # a tracker is a convenience: the training goes on without it
                log.warning("%s: could not start (%s: %s); the run is not logged there", names.LABELS[tracker],
                            type(exc).__name__, self._redactor.line(first_line(exc)))
        self.mlflow_run_id = next((t.run_id for t in self.trackers if getattr(t, "run_id", None)), None)
        if self.trackers:
            self._each("hparams", run_params(trainer))

    def _each(self, method: str, *args) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:
                self.trackers.remove(tracker)
                text = self._redactor.line(tracker.redact(first_line(exc)))
                log.warning("%s: %s failed (%s: %s); the rest of the run is not logged there", tracker.label,
                            method, type(exc).__name__, text)
                if method != "close":
                    try:
                        tracker.close("FAILED")
                    except Exception:   # already reported above; nothing more to say
                        pass

    def after_step(self, trainer, epoch, step, outputs, lr, data_time) -> None:
        if not self.trackers:
            return
        self.steps += 1
        if (step + 1) % self.interval:
            return
        values = {f"train/{key}": value for key, value in host_losses(outputs).items()}
        values["train/lr"] = float(lr)
        elapsed = time.time() - self.tic
        if elapsed > 0:
            values["train/images_per_s"] = self.steps * trainer.batch.global_batch / elapsed
        # data_time is the epoch's running total: log the mean wait per step over this interval
        values["train/data_time"] = max(0.0, float(data_time) - self.data_mark) / self.steps
        self._each("scalars", values, trainer.state.global_step)
        self.data_mark = float(data_time)
        self.tic, self.steps = time.time(), 0

    def after_epoch(self, trainer, stats) -> None:
        if not self.trackers:
            return
        # per-epoch means too: an epoch shorter than log_iter (an evolution candidate) logs no step scalar
        values = {f"epoch/{key}": float(value) for key, value in (getattr(stats, "losses", None) or {}).items()}
        values["epoch/lr"] = float(stats.lr)
        values["epoch/images_per_s"] = float(stats.images_per_s)
        for r, ips in enumerate(getattr(stats, "per_rank_images_per_s", None) or []):
            values[f"epoch/images_per_s_rank{r}"] = float(ips)
        if getattr(stats, "amp", None):   # float16 AMP: steps the scaler skipped, and its scale
            values["epoch/amp_skipped_steps"] = float(stats.amp["skipped_steps"])
            values["epoch/amp_loss_scale"] = float(stats.amp["loss_scale"])
        if stats.metrics:
            values["eval/mAP50"] = float(stats.metrics["mAP50"])
            values["eval/mAP50_95"] = float(stats.metrics["mAP50_95"])
            for r, ips in enumerate(stats.metrics.get("per_rank_images_per_s") or []):
                values[f"eval/images_per_s_rank{r}"] = float(ips)
        self._each("scalars", values, stats.epoch + 1)
        self._each("flush")
        self.tic, self.steps, self.data_mark = time.time(), 0, 0.0

    def after_train(self, trainer) -> None:
        if not self.trackers:
            return
        run_dir = trainer.run_dir
        self._each("pictures", run_pictures(run_dir), int(getattr(trainer.state, "epoch", 0)))
        if run_dir is not None:
            self._each("files", [Path(run_dir) / f for f in FILES if (Path(run_dir) / f).is_file()])
        self._each("close", "KILLED" if getattr(trainer, "interrupted", None) else "FINISHED")
        self.trackers = []

    def close(self, trainer) -> None:
        if self.trackers:   # training raised: after_train never ran
            self._each("close", "FAILED")
            self.trackers = []

    # MLflow's run id travels with the checkpoints, so a resumed run continues the same MLflow run
    def state_dict(self) -> dict | None:
        return {"mlflow_run_id": self.mlflow_run_id} if self.mlflow_run_id else None

    def load_state_dict(self, state: dict) -> None:
        self.resumed = dict(state or {})


class VisualDLHook(TrackersHook):
    """The trackers hook with VisualDL alone (a Trainer built from parts; built runs take ``TrackersHook``, which
    follows --logger): hyperparameters, step and epoch scalars, mAP, pictures, under ``run_dir/vdl``."""

    def __init__(self):
        super().__init__(only=names.DEFAULT)

    def before_train(self, trainer) -> None:
        self.only = names.DEFAULT if vdl_wanted(trainer.cfg) else ()
        super().before_train(trainer)
