"""The TensorBoard tracker (--logger tensorboard): event files in the run directory, written with tensorboard alone."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ppmulti.rank.engine.hooks.tracking import Tracker

log = logging.getLogger("ppmulti")


class TensorBoardTracker(Tracker):
    """Event files in RUN_DIR itself, as YOLOv5 writes them, so ``tensorboard --logdir runs/train`` lists each run
    by its name. Written with tensorboard's own EventFileWriter and protos (no torch, no TensorFlow): scalars as
    simple values, the hyperparameters for the HPARAMS tab, the pictures as encoded images (PNG or JPEG as
    they are on disk)."""

    label = "TensorBoard"

    def __init__(self, trainer):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        run_dir = Path(trainer.run_dir)
        self.writer = EventFileWriter(str(run_dir))
        parent = os.path.relpath(run_dir.parent) if _inside_cwd(run_dir.parent) else str(run_dir.parent)
        log.info("TensorBoard: tensorboard --logdir %s, then http://localhost:6006/", parent)

    def _add(self, summary, step: int) -> None:
        from tensorboard.compat.proto import event_pb2

        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def hparams(self, hp: dict) -> None:
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb

        self._add(hparams_pb(hp), 0)

    def scalars(self, values: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto import summary_pb2

        summary = summary_pb2.Summary()
        for tag, value in values.items():
            summary.value.add(tag=tag, simple_value=float(value))
        self._add(summary, step)

    def pictures(self, paths: list[Path], step: int) -> None:
        from PIL import Image
        from tensorboard.compat.proto import summary_pb2

        for path in paths:
            with Image.open(path) as im:
                width, height = im.size
                channels = len(im.getbands())
            image = summary_pb2.Summary.Image(height=height, width=width, colorspace=channels,
                                              encoded_image_string=path.read_bytes())
            summary = summary_pb2.Summary()
            summary.value.add(tag=path.stem, image=image)
            self._add(summary, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


def _inside_cwd(path: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path.cwd().resolve())
        return True
    except ValueError:
        return False
