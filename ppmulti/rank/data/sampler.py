"""--image-weights: YOLOv5's image sampling by class weights, one draw per epoch shared by every rank, sharded."""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

log = logging.getLogger("ppmulti")


def class_weights(labels: Sequence[np.ndarray], nc: int) -> np.ndarray:
    """YOLOv5's labels_to_class_weights: the inverse of each class's label count (absent classes count as 1),
    normalised to sum 1. ``labels``: each image's class ids."""
    ids = np.concatenate([np.asarray(x, dtype=np.int64).reshape(-1) for x in labels]) if labels else np.zeros(0)
    counts = np.bincount(ids.astype(np.int64), minlength=nc)[:nc].astype(np.float64)
    counts[counts == 0] = 1
    weights = 1.0 / counts
    return weights / weights.sum()


def image_weights(labels: Sequence[np.ndarray], nc: int, weights: np.ndarray) -> np.ndarray:
    """YOLOv5's labels_to_image_weights: an image's weight is the sum of its labels' class weights (an image
    without labels weighs 0 and is not drawn, as in YOLOv5)."""
    out = np.zeros(len(labels), dtype=np.float64)
    for i, x in enumerate(labels):
        ids = np.asarray(x, dtype=np.int64).reshape(-1)
        ids = ids[(ids >= 0) & (ids < nc)]
        out[i] = weights[ids].sum()
    return out


def epoch_weights(labels: Sequence[np.ndarray], nc: int, maps: np.ndarray | None) -> np.ndarray:
    """The draw's weights at an epoch's start: ``cw = class_weights x (1 - maps)^2 / nc`` (YOLOv5's train.py),
    ``maps`` the per-class mAP50-95 of the last evaluation (None or zeros before the first one)."""
    maps = np.zeros(nc) if maps is None else np.asarray(maps, dtype=np.float64)[:nc]
    cw = class_weights(labels, nc) * (1 - maps) ** 2 / nc
    return image_weights(labels, nc, cw)


def weighted_draw(weights: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """n indices drawn with replacement by ``weights`` (YOLOv5's ``random.choices(range(n), weights, k=n)``),
    from a generator seeded by (seed, epoch) alone: the same draw on every rank."""
    n = len(weights)
    total = float(weights.sum())
    p = weights / total if total > 0 else None   # no labels anywhere: a uniform draw
    return np.random.default_rng([int(seed), int(epoch), 0x1A6E]).choice(n, size=n, replace=True, p=p)


def shard(indices: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This rank's part of one draw: padded to a multiple of ``world`` with its first indices (Paddle's
    DistributedBatchSampler's rule), then every ``world``-th from ``rank``."""
    total = -(-len(indices) // world) * world
    padded = np.concatenate([indices, indices[: total - len(indices)]]) if total > len(indices) else indices
    return padded[rank:total:world]


class ImageWeightsBatchSampler:
    """The train loader's batch sampler under --image-weights: each epoch (``set_epoch``) every rank draws
    the same n indices by ``epoch_weights`` and takes its shard, in batches of ``batch_size`` (``drop_last``
    as the reader has it). The labels are read from the dataset when first needed (ppdet's reader parses
    it after the sampler is built). ``maps`` is set by ImageWeightsHook before each epoch."""

    drawn_at_epoch_start = True   # the draw reads the last evaluation's maps: data.feed iterates it per epoch

    def __init__(self, dataset: Any, batch_size: int, num_classes: int, rank: int, world: int,
                 drop_last: bool = True, seed: int = 0):
        self.dataset, self.batch_size, self.nc = dataset, int(batch_size), int(num_classes)
        self.rank, self.world, self.drop_last, self.seed = int(rank), int(world), bool(drop_last), int(seed)
        self.epoch = 0
        self.maps: np.ndarray | None = None
        self._labels: list[np.ndarray] | None = None
        self.indices: np.ndarray | None = None   # this rank's indices of the current epoch

    def labels(self) -> list[np.ndarray]:
        if self._labels is None:
            self._labels = [np.asarray(r.get("gt_class", np.zeros((0, 1))), dtype=np.int64).reshape(-1)
                            for r in self.dataset.roidbs]
        return self._labels

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.indices = None

    def _draw(self) -> np.ndarray:
        labels = self.labels()
        weights = epoch_weights(labels, self.nc, self.maps)
        return shard(weighted_draw(weights, self.seed, self.epoch), self.rank, self.world)

    def __iter__(self):
        if self.indices is None:
            self.indices = self._draw()
        idx = [int(i) for i in self.indices]
        for start in range(0, len(idx), self.batch_size):
            batch = idx[start:start + self.batch_size]
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield batch

    def __len__(self) -> int:
        per_rank = -(-len(self.dataset.roidbs) // self.world)
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)
