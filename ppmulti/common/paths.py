"""Where the repository's configs and tools live (ppmulti is installed from a clone with `pip install -e .`)."""

from __future__ import annotations

from pathlib import Path

from ppmulti.common.errors import UserError

PACKAGE = Path(__file__).resolve().parents[1]
ROOT = PACKAGE.parent
CONFIGS = ROOT / "configs"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")   # what a directory of images may hold
# Scripts started by file path (Paddle's launcher runs a script as `python -u SCRIPT` only when it ends in .py):
TRAIN_SCRIPT = PACKAGE / "procs" / "train_command.py"   # the train command, which every rank of a training runs
TRAIN_TOOL = ROOT / "tools" / "train.py"                # the same command as users type it
WORKER_SCRIPT = PACKAGE / "rank" / "worker.py"           # each rank's entry point under ppmulti launch
BENCH_PROBE = PACKAGE / "rank" / "bench_probe.py"        # ppmulti bench's measuring probes


def config_path(relative: str) -> Path:
    """A shipped config by its path under configs/, e.g. ``demo/ppyoloe_demo.yml``."""
    path = CONFIGS / relative
    if not path.is_file():
        raise UserError(f"shipped config {relative} not found under {CONFIGS}; install ppmulti from a clone "
                        f"with `pip install -e .`, or pass --config")
    return path
