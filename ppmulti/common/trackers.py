"""The experiment trackers --logger names (spellings, the extra each needs), and a tracking URI fit to print."""

from __future__ import annotations

import importlib.util
import urllib.parse
from typing import Iterable

from ppmulti.common.errors import UserError

VISUALDL, TENSORBOARD, MLFLOW = "visualdl", "tensorboard", "mlflow"
TRACKERS = (VISUALDL, TENSORBOARD, MLFLOW)
DEFAULT = (VISUALDL,)

# every spelling --logger takes -> the tracker; YOLOv5 says "tb" (utils/loggers' LOGGERS), ultralytics "tensorboard"
SPELLINGS = {"visualdl": VISUALDL, "vdl": VISUALDL, "tensorboard": TENSORBOARD, "tb": TENSORBOARD,
             "mlflow": MLFLOW}
NONE = ("none", "off", "false")
# YOLOv5's other loggers: csv is always written (results.csv); the rest are refused by name
ALWAYS_ON = {"csv": "results.csv"}
REFUSED = {"wandb": "Weights & Biases", "clearml": "ClearML", "comet": "Comet", "neptune": "Neptune",
           "dvclive": "DVCLive"}

# the module each tracker imports, and the pip line that installs it
MODULES = {VISUALDL: "visualdl", TENSORBOARD: "tensorboard", MLFLOW: "mlflow"}
INSTALL = {VISUALDL: "pip install visualdl", TENSORBOARD: 'pip install "ppmulti[tensorboard]"',
           MLFLOW: 'pip install "ppmulti[mlflow]"'}
LABELS = {VISUALDL: "VisualDL", TENSORBOARD: "TensorBoard", MLFLOW: "MLflow"}


def parse(values: Iterable[str] | None) -> tuple[str, ...] | None:
    """``--logger`` values (several, or comma-separated) -> the trackers in a fixed order; None when not given
    (VisualDL unless the config's use_vdl is false); () for ``none``."""
    if values is None:
        return None
    names = [n.strip().lower() for v in values for n in str(v).split(",") if n.strip()]
    if not names:
        raise UserError(f"--logger: give one or more of {', '.join(TRACKERS)} (or none)")
    if any(n in NONE for n in names):
        if len(names) > 1:
            raise UserError(f"--logger {','.join(names)}: none turns every tracker off; give it alone")
        return ()
    chosen = set()
    for name in names:
        if name in SPELLINGS:
            chosen.add(SPELLINGS[name])
        elif name in REFUSED:
            raise UserError(f"--logger {name}: ppmulti does not log to {REFUSED[name]}; "
                            f"give {', '.join(TRACKERS)}")
        elif name not in ALWAYS_ON:
            raise UserError(f"--logger {name}: unknown tracker; give {', '.join(TRACKERS)} "
                            f"(comma-separated, e.g. --logger visualdl,tensorboard)")
    return tuple(t for t in TRACKERS if t in chosen)


def check_installed(trackers: Iterable[str]) -> None:
    """One line naming the extra to install for the first tracker whose package is missing (found without
    importing it: a parent process that only checks flags stays light)."""
    trackers = tuple(trackers)
    refuse_missing(trackers, missing(trackers))


def missing(trackers: Iterable[str] = TRACKERS) -> frozenset[str]:
    """The trackers among ``trackers`` whose package is not installed (looked up, not imported)."""
    return frozenset(t for t in trackers if importlib.util.find_spec(MODULES[t]) is None)


def refuse_missing(trackers: Iterable[str], absent: Iterable[str]) -> None:
    """``check_installed`` without the look-up: the first of ``trackers`` in ``absent`` is one line."""
    absent = set(absent)
    for tracker in trackers:
        if tracker in absent:
            raise UserError(f"--logger {tracker}: {LABELS[tracker]} is not installed; {INSTALL[tracker]}")


def display_uri(uri: str) -> str:
    """``uri`` without its user, password or query (where a database URL's credentials may sit): fit to print."""
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return "<tracking URI not shown>"
    netloc = parts.netloc
    if "@" not in netloc and not parts.query:
        return uri
    if "@" in netloc:   # user:password, or a token alone: neither is printed
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))
