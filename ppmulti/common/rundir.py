"""Run directories: naming (base/name, then name2, name3, ... as YOLOv5 does), the newest one, the restart marker."""

from __future__ import annotations

from pathlib import Path

from ppmulti.common.errors import UserError

WEIGHTS = ".pdparams"   # model weights (EMA applied when EMA is on): what eval/infer/export load
STATE = ".pdstate"      # everything resume needs
RUN_DIR_MARKER = "run_dir"   # in a launch's directory: the run that a restarted launch continues


def new_run_dir(base: Path | str, name: str, exist_ok: bool = False) -> Path:
    """Create and return a fresh run directory ``base/name`` (or the next free ``nameN``)."""
    base = Path(base)
    candidate = base / name
    if not exist_ok:
        n = 2
        while candidate.exists():
            candidate = base / f"{name}{n}"
            n += 1
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate


def newest_run(output: str | None) -> Path:
    """Bare ``--resume``: the most recently written ``weights/last`` under the usual run roots."""
    roots = [Path(output).parent] if output else [Path("runs/train"), Path("output")]
    found = [p for root in roots if root.is_dir() for p in root.glob("*/weights/last.pdstate")]
    if not found:
        raise UserError(f"--resume without a path: no run with weights/last.pdstate under "
                        f"{' or '.join(map(str, roots))}; pass the run directory")
    return max(found, key=lambda p: p.stat().st_mtime).parent.parent
