"""ultralytics' close_mosaic: mosaic and mixup off for the last N epochs of a run, in every loader worker."""

from __future__ import annotations

import logging

from ppmulti.rank.engine.hooks.base import Hook
from ppmulti.rank.engine.ultra_recipe import mosaic_closed

log = logging.getLogger("ppmulti")


def mosaic_ops(loader) -> list:
    """The train loader's mosaic ops (``YOLOv5Mosaic``), found through its dataset's transform."""
    dataset = getattr(loader, "dataset", None)
    transform = getattr(dataset, "transform", None)
    ops = getattr(transform, "transforms_cls", None) or []   # ppdet's Compose keeps its op instances here
    return [op for op in ops if hasattr(op, "close_from")]


class CloseMosaicHook(Hook):
    """Before the loader's workers start (``before_train``), tells the mosaic op the epoch from which it draws
    plain letterboxed images (``epochs - close_mosaic``); the workers read the epoch from their own copy of
    the dataset, so the switch needs no restart. Logs the switch once, in that epoch."""

    priority = 10

    def __init__(self, close_mosaic: int) -> None:
        self.close_mosaic = int(close_mosaic)
        self.first_closed: int | None = None

    def before_train(self, trainer) -> None:
        epochs = int(trainer.cfg["epoch"])
        if self.close_mosaic <= 0:
            return
        self.first_closed = max(0, epochs - self.close_mosaic)
        ops = mosaic_ops(trainer.loader)
        if not ops:
            log.warning("close_mosaic %d: this training reader has no mosaic op to switch off", self.close_mosaic)
            return
        for op in ops:
            op.close_from = self.first_closed

    def before_epoch(self, trainer, epoch: int) -> None:
        if self.first_closed is not None and epoch == self.first_closed and \
                mosaic_closed(epoch, int(trainer.cfg["epoch"]), self.close_mosaic):
            log.info("close_mosaic: mosaic and mixup off for the last %d epochs", self.close_mosaic)
