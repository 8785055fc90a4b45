"""Per-rank logging: rank 0 to the console and train.log, every other rank to its own file only."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(message)s"


def setup_rank_logging(run_dir: Path, rank: int) -> logging.Logger:
    log = logging.getLogger("ppmulti")
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    fmt = logging.Formatter(FORMAT, datefmt="%H:%M:%S")
    name = "train.log" if rank == 0 else f"logs/rank{rank}.log"
    path = Path(run_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(fmt)
    log.addHandler(file_handler)
    if rank == 0:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(fmt)
        log.addHandler(console)
    return log
