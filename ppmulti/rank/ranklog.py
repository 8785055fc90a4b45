"""Per-rank logging: rank 0 to the console and train.log, every other rank to its own file only."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path
from typing import Iterator

from ppmulti.common.envvars import PPMULTI_VERBOSE

FORMAT = "%(asctime)s %(levelname)s %(message)s"
# records carrying this attribute (other libraries' prints, see prints_to_log) reach this rank's log file only,
# unless PPMULTI_VERBOSE=1 (ppmulti launch --verbose)
LOG_FILE_ONLY = "ppmulti_noise"


def _not_noise(record: logging.LogRecord) -> bool:
    return not getattr(record, LOG_FILE_ONLY, False)


@contextlib.contextmanager
def prints_to_log() -> Iterator[None]:
    """What other libraries print on stdout inside the block (pycocotools' "loading annotations into memory...")
    goes to this rank's log file as INFO lines, not to the console."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        log = logging.getLogger("ppmulti")
        for line in buf.getvalue().splitlines():
            if line.strip():
                log.info(line.rstrip(), extra={LOG_FILE_ONLY: True})


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
        if os.environ.get(PPMULTI_VERBOSE, "").strip().lower() not in ("1", "true", "yes"):
            console.addFilter(_not_noise)
        log.addHandler(console)
    return log
