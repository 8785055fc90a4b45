"""Run directory naming: base/name, then name2, name3, ... as YOLOv5 does, unless exist_ok."""

from __future__ import annotations

from pathlib import Path


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
