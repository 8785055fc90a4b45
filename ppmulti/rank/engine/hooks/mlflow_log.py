"""The MLflow tracker (--logger mlflow): one MLflow run per training, through MLflow's client."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import urllib.parse
from pathlib import Path
from typing import Mapping

from ppmulti.common import envvars
from ppmulti.common.trackers import display_uri
from ppmulti.rank.engine.hooks.tracking import Tracker

log = logging.getLogger("ppmulti")

DEFAULT_DB = "mlflow.db"   # MLflow's own default store, in the directory training starts from
MAX_PARAMS = 100           # per log_batch call (MLflow's limit)
MAX_PARAM_VALUE = 6000     # characters of one param value (MLflow's limit)
MAX_METRICS = 1000         # per log_batch call


def tracking_uri(environ: Mapping[str, str] | None = None) -> str:
    """MLFLOW_TRACKING_URI as users set it, else ``sqlite:///CWD/mlflow.db`` (MLflow 3's own default, made
    absolute: ``mlflow ui`` started in that directory shows the runs; artifacts go to CWD/mlruns)."""
    environ = os.environ if environ is None else environ
    uri = (environ.get(envvars.MLFLOW_TRACKING_URI) or "").strip()
    return uri or f"sqlite:///{Path.cwd() / DEFAULT_DB}"


def experiment_name(run_dir: Path, environ: Mapping[str, str] | None = None) -> str:
    """MLFLOW_EXPERIMENT_NAME, else the run's project: --project (runs/train by default), relative to the working
    directory when inside it; the run itself is named after --name (exp, exp2, ...)."""
    environ = os.environ if environ is None else environ
    name = (environ.get(envvars.MLFLOW_EXPERIMENT_NAME) or "").strip()
    if name:
        return name
    parent = Path(run_dir).resolve().parent
    try:
        return str(parent.relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(parent)


class MLflowTracker(Tracker):
    """An MLflow run named after the run directory, in the experiment named after the project: the
    hyperparameters as params, every scalar as a metric (sent once per epoch, in batches), the run directory's
    pictures and small files as artifacts, and the end status (FINISHED, KILLED on a stop signal, FAILED).
    Given ``run_id`` (a resumed run's), that MLflow run continues."""

    label = "MLflow"

    def __init__(self, trainer, run_id: str | None = None):
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        self.pending: list = []
        self.known_params: dict[str, str] = {}
        run_dir = Path(trainer.run_dir)
        self.run_id = self._continue(run_id) if run_id else None
        if self.run_id is None:
            experiment = experiment_name(run_dir)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self._create(experiment)
            run = self.client.create_run(experiment_id, run_name=run_dir.name,
                                         tags={"ppmulti.run_dir": str(run_dir.resolve())})
            self.run_id = run.info.run_id
            log.info("MLflow: run %s (%s) in experiment %r at %s", run_dir.name, self.run_id, experiment,
                     display_uri(self.uri))
        else:
            log.info("MLflow: continuing run %s at %s", self.run_id, display_uri(self.uri))

    def _create(self, experiment: str) -> str:
        try:
            return self.client.create_experiment(experiment)
        except Exception:   # another run created it meanwhile (evolution's workers): take theirs
            found = self.client.get_experiment_by_name(experiment)
            if found is None:
                raise
            return found.experiment_id

    def _continue(self, run_id: str) -> str | None:
        try:
            run = self.client.get_run(run_id)
        except Exception:   # another tracking server, or the run was deleted: a new run instead
            log.warning("MLflow: run %s of the checkpoint is not at %s; starting a new one", run_id,
                        display_uri(self.uri))
            return None
        self.known_params = dict(run.data.params)
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def hparams(self, hp: dict) -> None:
        from mlflow.entities import Param

        # a resumed run keeps the params it has (MLflow refuses to change one); new keys are added
        params = [Param(str(k), str(v)[:MAX_PARAM_VALUE]) for k, v in hp.items() if str(k) not in self.known_params]
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS])

    def scalars(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(tag, float(value), now, int(step)) for tag, value in values.items()]
        if len(self.pending) >= MAX_METRICS:
            self.flush()

    def flush(self) -> None:
        while self.pending:
            batch, self.pending = self.pending[:MAX_METRICS], self.pending[MAX_METRICS:]
            self.client.log_batch(self.run_id, metrics=batch)

    def pictures(self, paths: list[Path], step: int) -> None:
        self.files(paths)

    def files(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path))

    def close(self, status: str) -> None:
        try:
            self.flush()
        finally:
            # MLflow prints links to the run for a tracking server, with the URI's credentials in them
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                self.client.set_terminated(self.run_id, status=status)
            for line in printed.getvalue().splitlines():
                if line.strip():
                    log.info("MLflow: %s", self.redact(line.strip()))

    def redact(self, text: str) -> str:
        """An error's text without the URI's credentials, wherever they appear in it."""
        text = text.replace(self.uri, display_uri(self.uri))
        netloc = urllib.parse.urlsplit(self.uri).netloc
        if "@" in netloc:
            userinfo = netloc.rsplit("@", 1)[0]
            text = text.replace(userinfo, "***")
            text = text.replace(urllib.parse.unquote(userinfo), "***")
        return text
