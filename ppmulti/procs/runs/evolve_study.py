"""Evolution's population in an Optuna study: the storage (URL, heartbeat, retries), one study per --project,
YOLOv5's mutation as an Optuna sampler, and the generation budget that holds however many workers share it.

A candidate is a trial: its hyps are the trial's parameters, its value YOLOv5's fitness. Workers ask for trials and
tell their results; a running trial's worker records Optuna's heartbeat (the database server's clock, never the
workers'), and a trial whose heartbeat stops is failed by whichever worker looks next and queued again with the same
hyps (Optuna's RetryHeartbeatStaleTrialCallback).
"""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ppmulti.common.errors import UserError

DB_NAME = "evolve.db"
SAMPLERS = ("yolov5", "tpe", "cmaes")
HEARTBEAT_SECONDS = 60       # a trial whose worker is silent for 2x this is failed and queued again
PARENT_ATTR = "ppmulti:parent"      # a trial's system attribute: the hyps YOLOv5's mutation started from
HYP_KEYS_ATTR = "hyp_keys"          # the study's user attributes: which hyps it evolves, and their base values
BASE_HYP_ATTR = "base_hyp"
SKIPPED_ATTR = "skipped"


def default_storage(project: Path) -> str:
    return f"sqlite:///{Path(project) / DB_NAME}"


def shown(url: str) -> str:
    """The storage URL as it may be printed: its password replaced by ***."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL sqlalchemy reads: hide anything between ':' and '@' after '//'
        return re.sub(r"(//[^:/@]*):[^@]*@", r"\1:***@", url)


def password(url: str) -> str | None:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).password
    except Exception:  # noqa: BLE001
        return None


# a URL without a driver (postgresql://, mysql://) takes SQLAlchemy's default one (psycopg on SQLAlchemy 2.1,
# psycopg2 on 2.0; mysqlclient): when only another is installed, that one
_DRIVERS = {"postgresql": (("psycopg", "psycopg"), ("psycopg2", "psycopg2")),
            "mysql": (("MySQLdb", "mysqldb"), ("pymysql", "pymysql"))}


def with_driver(url: str) -> str:
    """``url`` with the installed driver named when it names none and SQLAlchemy's default is missing."""
    import importlib.util

    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - open_storage says what is wrong with it
        return url
    found = [driver for module, driver in _DRIVERS.get(parsed.drivername, ()) if importlib.util.find_spec(module)]
    if not found:
        return url
    return parsed.set(drivername=f"{parsed.drivername}+{found[0]}").render_as_string(hide_password=False)


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # no "Trial N finished with value ... parameters {...}"
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def _sqlite_connection() -> type:
    """sqlite3 connections in WAL mode (readers never wait for the writer; commits need no fsync of the database
    itself): a study on one machine's disk, never on a network file system, which WAL does not support."""
    import sqlite3

    class Connection(sqlite3.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.execute("PRAGMA journal_mode=WAL")
            self.execute("PRAGMA synchronous=NORMAL")

    return Connection


_IMMEDIATE: set[Any] = set()   # engines whose transactions begin IMMEDIATE (the storages this process opened)


def _sqlite_begin_immediate(engine: Any) -> None:
    """Every transaction of ``engine`` (SQLite, the driver's own BEGIN turned off by isolation_level=None) begins
    with BEGIN IMMEDIATE, SQLAlchemy's recipe for pysqlite: workers' read-then-write steps serialize. Only once the
    storage is set up: Optuna's set-up reads on one connection while it writes on another."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not _IMMEDIATE:
        def begin(conn: Any) -> None:
            if conn.engine in _IMMEDIATE:   # (before: each statement commits by itself, as set-up needs)
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        event.listen(Engine, "begin", begin)
    _IMMEDIATE.add(engine)


def _retry_callback() -> Any:
    import optuna.storages as st

    cls = getattr(st, "RetryHeartbeatStaleTrialCallback", None) or st.RetryFailedTrialCallback
    return cls(max_retry=None)


def open_storage(url: str, heartbeat: int = HEARTBEAT_SECONDS) -> Any:
    """Optuna's RDBStorage on ``url`` with the heartbeat on and stale trials queued again; bad URLs, missing
    drivers and unreachable servers are one line each (the password never shown)."""
    import inspect

    import optuna
    import sqlalchemy.exc

    _quiet_optuna()
    if heartbeat < 1:
        raise UserError(f"--heartbeat {heartbeat}: need at least 1 second")
    if url.startswith("sqlite"):
        # pysqlite starts a transaction at the first write, so two workers can both read a queued trial as
        # waiting and both run it; BEGIN IMMEDIATE takes the database's write lock at the start instead
        engine = {"connect_args": {"timeout": 120, "isolation_level": None, "factory": _sqlite_connection()}}
    else:
        engine = {"pool_pre_ping": True}
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    callback_kw = ("heartbeat_stale_trial_callback"
                   if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
                   else "failed_trial_callback")   # Optuna < 4.9
    secret = password(url)

    def hidden(exc: BaseException) -> str:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return text.replace(secret, "***") if secret else text

    try:
        for attempt in range(5):
            try:
                storage = optuna.storages.RDBStorage(
                    with_driver(url), engine_kwargs=engine, heartbeat_interval=int(heartbeat),
                    grace_period=2 * int(heartbeat), **{callback_kw: _retry_callback()})
                if url.startswith("sqlite"):
                    _sqlite_begin_immediate(storage.engine)
                return storage
            except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError) as exc:
                # workers that start together on a new database all create its tables and version rows: the
                # later ones find them there
                racing = isinstance(exc, sqlalchemy.exc.IntegrityError) or any(
                    text in str(exc) for text in ("already exists", "database is locked"))
                if not racing or attempt == 4:
                    raise
                time.sleep(0.2 + random.random())
    except ImportError:
        raise UserError(f"--storage {shown(url)}: its database driver is not installed (PostgreSQL: "
                        f"pip install psycopg2-binary; MySQL: pip install PyMySQL and mysql+pymysql://...)") from None
    except sqlalchemy.exc.ArgumentError:
        raise UserError(f"--storage {shown(url)}: not a database URL; use e.g. sqlite:///runs/evolve/evolve.db or "
                        f"postgresql://user@host:5432/db") from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        raise UserError(f"--storage {shown(url)}: cannot use the database ({hidden(exc)})") from None


# ----------------------------------------------------------------------------- the search space and the sampler
def distributions(base_hyp: dict[str, float], bounds: dict[str, tuple[float, float, float]]) -> dict[str, Any]:
    """One Optuna distribution per hyp: YOLOv5's bounds (widened to hold the base value) for the mutated ones,
    the base value alone for the others."""
    from optuna.distributions import FloatDistribution

    out = {}
    for k, v in base_hyp.items():
        v = float(v)
        if k in bounds and bounds[k][0] != 0:
            _, lo, hi = bounds[k]
            out[k] = FloatDistribution(min(lo, v), max(hi, v))
        else:
            out[k] = FloatDistribution(v, v)
    return out


def study_rows(study: Any, hyp_keys: list[str] | None = None) -> list[dict[str, float]]:
    """evolve.csv's rows from the study's finished trials, in trial order: fitness, mAP50, mAP50_95, hyps."""
    from optuna.trial import TrialState

    from ppmulti.procs.runs.evolve import make_row

    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        keys = hyp_keys or list(t.params)
        if not all(k in t.params for k in keys) or "mAP50" not in t.user_attrs:
            continue   # not one of ours (a trial told by hand)
        row = make_row({"mAP50": t.user_attrs["mAP50"], "mAP50_95": t.user_attrs["mAP50_95"]},
                       {k: t.params[k] for k in keys})
        row["fitness"] = float(t.value)
        rows.append(row)
    return rows


def _sampler_base() -> type:
    from optuna.samplers import BaseSampler

    return BaseSampler


class YOLOv5Sampler(_sampler_base()):
    """YOLOv5's --evolve as an Optuna sampler: trial 0 is the base hyps; then a parent drawn from the best 5
    finished trials weighted by fitness (the base hyps while none has finished), mutated within YOLOv5's bounds;
    trial k draws from (seed, k). The draws are ``evolve.breed``'s, the one implementation of YOLOv5's semantics."""

    def __init__(self, base_hyp: dict[str, float], bounds: dict[str, tuple[float, float, float]], seed: int = 0):
        from optuna.samplers import RandomSampler

        self.base_hyp = {k: float(v) for k, v in base_hyp.items()}
        self.bounds = bounds
        self.seed = int(seed)
        self._space = {k: d for k, d in distributions(self.base_hyp, bounds).items() if not d.single()}
        self._fallback = RandomSampler(seed=seed)

    def infer_relative_search_space(self, study, trial) -> dict:
        return dict(self._space)

    def sample_relative(self, study, trial, search_space: dict) -> dict:
        from ppmulti.procs.runs.evolve import breed

        if not search_space:
            return {}
        # YOLOv5 trains the --hyp as given first. Trial numbers are unique, and a study started from an evolve.csv
        # holds its rows as trials 0.., so only a new study asks trial 0; it may ask after another process's trial 1
        # has finished, so the rows do not decide it
        if trial.number == 0:
            return {k: self.base_hyp[k] for k in search_space if k in self.base_hyp}
        rows = study_rows(study, list(self.base_hyp))
        rng = np.random.RandomState([self.seed, trial.number])
        parent, child = breed(rows, self.base_hyp, rng, self.bounds)
        study._storage.set_trial_system_attr(trial._trial_id, PARENT_ATTR, parent)
        return {k: child[k] for k in search_space if k in child}

    def sample_independent(self, study, trial, param_name: str, param_distribution) -> Any:
        v = self.base_hyp.get(param_name)
        if v is not None and param_distribution._contains(param_distribution.to_internal_repr(v)):
            return v
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def make_sampler(name: str, base_hyp: dict[str, float], bounds: dict[str, tuple[float, float, float]],
                 seed: int = 0) -> Any:
    """``--sampler yolov5|tpe|cmaes`` -> the sampler (TPE and CMA-ES are Optuna's own)."""
    import optuna

    if name == "yolov5":
        return YOLOv5Sampler(base_hyp, bounds, seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "cmaes":   # the base hyps run first (queued by open_study), then CMA-ES searches within the bounds
        return optuna.samplers.CmaEsSampler(seed=seed)
    raise UserError(f"--sampler {name}: expected one of {', '.join(SAMPLERS)}")


# ----------------------------------------------------------------------------- the study
def open_study(storage: Any, name: str, sampler: Any, base_hyp: dict[str, float], where: str,
               earlier: list[dict[str, float]] = (),
               bounds: dict[str, tuple[float, float, float]] | None = None) -> Any:
    """The study ``name`` in ``storage``, created or resumed; a study that evolves other hyps is refused. A new study
    starts from ``earlier`` rows (an evolve.csv written before the study existed: ppmulti's file-based evolution),
    each a finished trial. YOLOv5 trains the --hyp as given first: the yolov5 sampler makes trial 0 so, for the
    others the base hyps are queued when the study is created."""
    import optuna

    from ppmulti.procs.runs.evolve import METRIC_COLUMNS

    try:
        study = optuna.create_study(storage=storage, study_name=name, direction="maximize", sampler=sampler)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        keys = study.user_attrs.get(HYP_KEYS_ATTR)
        if keys is not None and set(keys) != set(base_hyp):
            raise UserError(f"study {name!r} in {where} evolves other hyperparameters than this run's --hyp; "
                            f"pick another --study (or --project) or the same hyp file") from None
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise UserError(f"study {name!r} in {where} minimizes; evolution maximizes fitness: pick another --study")
        return study
    if earlier and {k for k in earlier[0] if k not in METRIC_COLUMNS} != set(base_hyp):
        optuna.delete_study(study_name=name, storage=storage)
        raise UserError("the evolve.csv already in --project evolves other hyperparameters than this run's --hyp; "
                        "pick another --project or the same hyp file")
    dists = distributions(base_hyp, bounds or {})
    for row in earlier:
        params = {k: float(row[k]) for k in base_hyp}
        own = {k: d if d._contains(params[k]) else type(d)(min(d.low, params[k]), max(d.high, params[k]))
               for k, d in dists.items()}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=own, value=float(row["fitness"]),
            user_attrs={"mAP50": float(row["mAP50"]), "mAP50_95": float(row["mAP50_95"]), "from": "evolve.csv"}))
    if not isinstance(sampler, YOLOv5Sampler) and not earlier:
        study.enqueue_trial({k: float(v) for k, v in base_hyp.items()})
    study.set_user_attr(HYP_KEYS_ATTR, list(base_hyp))
    study.set_user_attr(BASE_HYP_ATTR, {k: float(v) for k, v in base_hyp.items()})
    return study


def candidate_number(frozen: Any) -> int:
    """The candidate a trial (a FrozenTrial) trains: its own number, or for a retry the number of the trial it
    repeats (whose directory may hold a checkpoint to resume from)."""
    return int(frozen.system_attrs.get("failed_trial", frozen.number))


def requeue(study: Any, trial_id: int) -> None:
    """Queue a copy of a failed trial (same hyps), as Optuna does for a trial whose heartbeat stopped."""
    _retry_callback()(study, study._storage.get_trial(trial_id))


def next_trial(study: Any, storage: Any, generations: int, stop: threading.Event, poll: float,
               wait: Any = None) -> Any | None:
    """A trial to train, or None when ``generations`` trials have finished (or ``stop`` is set).

    Exactly ``generations`` trials finish however many workers share the study: a worker asks only while finished
    + running trials are fewer, and a trial runs only when fewer than ``generations`` trials numbered before it
    are finished, running or queued (the storage numbers trials one at a time, so of two workers asking at the
    same moment the later one yields: its trial is marked failed before it gets any hyps). While the others'
    running trials fill the budget a worker waits (``wait(poll)``, by default ``stop.wait``; the engine's returns
    early when one of its own trials finishes): a trial whose heartbeat stops comes back queued."""
    import optuna
    from optuna.trial import TrialState

    live = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
    while not stop.is_set():
        optuna.storages.fail_stale_trials(study)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        done, running = states.count(TrialState.COMPLETE), states.count(TrialState.RUNNING)
        if done >= generations:
            return None
        if done + running >= generations:
            (wait or stop.wait)(poll)
            continue
        trial = study.ask()
        storage.record_heartbeat(trial._trial_id)
        ahead = sum(1 for t in study.get_trials(deepcopy=False) if t.number < trial.number and t.state in live)
        if ahead < generations:
            return trial
        frozen = storage.get_trial(trial._trial_id)
        trial.set_user_attr(SKIPPED_ATTR, f"{generations} trials were already finished or running")
        study.tell(trial, state=TrialState.FAIL)
        if frozen.params or frozen.system_attrs.get("fixed_params"):
            requeue(study, trial._trial_id)   # a queued trial lost the race: queued again, its hyps kept
    return None


@contextlib.contextmanager
def heartbeat(storage: Any, trial_id: int, interval: float) -> Iterator[None]:
    """Record the trial's heartbeat every ``interval`` seconds while the block runs."""
    done = threading.Event()

    def beat() -> None:
        try:
            while not done.wait(interval):
                try:
                    storage.record_heartbeat(trial_id)
                except Exception as exc:  # noqa: BLE001 - a database hiccup: the next beat tries again
                    print(f"evolve: heartbeat of trial {trial_id} failed ({type(exc).__name__}); retrying",
                          flush=True)
        finally:
            storage.remove_session()

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
