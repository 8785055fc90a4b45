"""Where the repository's configs and tools live (ppmulti is installed from a clone with `pip install -e .`)."""

from __future__ import annotations

from pathlib import Path

from ppmulti.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")   # what a directory of images may hold
TRAIN_SCRIPT = Path(__file__).resolve().parent / "train_cli.py"


def config_path(relative: str) -> Path:
    """A shipped config by its path under configs/, e.g. ``demo/ppyoloe_demo.yml``."""
    path = CONFIGS / relative
    if not path.is_file():
        raise UserError(f"shipped config {relative} not found under {CONFIGS}; install ppmulti from a clone "
                        f"with `pip install -e .`, or pass --config")
    return path
