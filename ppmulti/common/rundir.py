"""Run directories: naming (base/name, then name2, name3, ... as YOLOv5 does), the newest one, the restart marker."""

from __future__ import annotations

from pathlib import Path

from ppmulti.common.errors import UserError

WEIGHTS = ".pdparams"   # model weights (EMA applied when EMA is on): what eval/infer/export load
STATE = ".pdstate"      # everything resume needs
RUN_DIR_MARKER = "run_dir"   # in a launch's directory: the run that a restarted launch continues


def new_run_dir(base: Path | str, name: str, exist_ok: bool = False) -> Path:
    """Create and return a fresh run directory ``base/name``, else the first free of ``name2``, ``name3``, ...
    (YOLOv5's increment_path: the lowest free number, so a deleted ``exp2`` is taken again before ``exp4``);
    with ``exist_ok`` ``base/name`` itself, existing or not. Each directory is claimed by its mkdir, so two runs
    started at once never share one."""
    base = Path(base)
    if exist_ok:
        (base / name).mkdir(parents=True, exist_ok=True)
        return base / name
    base.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        candidate = base / (name if n == 1 else f"{name}{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1


def newest_run(output: str | None) -> Path:
    """Bare ``--resume``: the most recently written ``weights/last`` under the usual run roots."""
    roots = [Path(output).parent] if output else [Path("runs/train"), Path("output")]
    found = [p for root in roots if root.is_dir() for p in root.glob("*/weights/last.pdstate")]
    if not found:
        raise UserError(f"--resume without a path: no run with weights/last.pdstate under "
                        f"{' or '.join(map(str, roots))}; pass the run directory")
    return max(found, key=lambda p: p.stat().st_mtime).parent.parent


def run_of(resume: str | Path) -> Path:
    """The run directory of a ``--resume`` path: the directory itself, or the run of ``RUN/weights/last[.pdstate]``."""
    path = Path(resume)
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == "weights" else path.parent
