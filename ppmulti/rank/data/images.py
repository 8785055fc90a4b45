"""Training images as YOLOv5 loads them: decoded to BGR uint8, the long side resized to the training size."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Loaded:
    """One decoded image: the pixels (h x w x 3 uint8, BGR), the file's size and the size after resizing."""

    image: np.ndarray
    orig_hw: tuple[int, int]
    hw: tuple[int, int]


def resized_shape(h0: int, w0: int, size: int) -> tuple[int, int]:
    """(h, w) of an h0 x w0 image whose long side is brought to ``size`` (YOLOv5's load_image rule)."""
    r = size / max(h0, w0)
    if r == 1:
        return h0, w0
    return min(math.ceil(h0 * r), size), min(math.ceil(w0 * r), size)


def decode(path: str, size: int, augment: bool = True) -> Loaded:
    """Decode ``path`` and resize it as YOLOv5 does: linear when training (or enlarging), area when shrinking
    for evaluation. Raises OSError naming the file when it cannot be decoded."""
    import cv2

    im = cv2.imread(path, cv2.IMREAD_COLOR)
    if im is None:
        raise OSError(f"cannot decode image {path}")
    h0, w0 = im.shape[:2]
    h, w = resized_shape(h0, w0, size)
    if (h, w) != (h0, w0):
        interp = cv2.INTER_LINEAR if (augment or h > h0) else cv2.INTER_AREA
        im = cv2.resize(im, (w, h), interpolation=interp)
    return Loaded(im, (h0, w0), (h, w))


class ImageStore:
    """Where a dataset's decoded images come from, by index: here the files themselves, decoded on every call.

    The caches (``--cache ram|disk``) are stores with the same ``load``; the augmentations only ever call it.
    """

    def __init__(self, files: list[str], size: int, augment: bool = True):
        self.files = list(files)
        self.size = int(size)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.files)

    def load(self, index: int) -> Loaded:
        return decode(self.files[index], self.size, self.augment)
