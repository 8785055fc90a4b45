"""Training images as YOLOv5 loads them: decoded to BGR uint8, the long side resized to the training size."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


MIN_IMAGE_SIDE = 2                     # pixels; smaller images are counted as corrupt
EXIF_ORIENTATION = 0x0112              # the EXIF tag; 5-8 mean the camera held the picture sideways


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


def image_size(path: Path) -> tuple[int, int] | str:
    """(width, height) of a readable image, or why it cannot be used (missing, corrupt, truncated)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            width, height = im.size
            fmt = im.format
            if "exif" in im.info and im.getexif().get(EXIF_ORIENTATION) in (5, 6, 7, 8):
                width, height = height, width   # OpenCV decodes it rotated (YOLOv5's exif_size does the same)
            im.verify()
    except FileNotFoundError:
        return "missing"
    except Exception as exc:  # PIL raises many types for broken files
        return f"unreadable ({type(exc).__name__})"
    if width < MIN_IMAGE_SIDE or height < MIN_IMAGE_SIDE:
        return f"too small ({width}x{height})"
    if fmt == "JPEG":
        with open(path, "rb") as f:
            f.seek(-2, os.SEEK_END)
            if f.read() != b"\xff\xd9":
                return "truncated JPEG"
    return width, height


def image_shapes(files: list[str]) -> list[tuple[int, int]]:
    """(h, w) of every file as OpenCV decodes it, from its header (no pixels read; EXIF rotation applied): what a
    cache needs to lay its images out when the scan's sizes are not given."""
    from ppmulti.rank.data.cache import fill_parallel

    out: list[tuple[int, int]] = [(0, 0)] * len(files)

    def one(i: int) -> None:
        size = image_size(Path(files[i]))
        if isinstance(size, str):
            raise OSError(f"cannot use image {files[i]}: {size}")
        out[i] = (size[1], size[0])

    fill_parallel(len(files), one)
    return out


def store_key(files: list[str], size: int, augment: bool) -> str:
    """What a cached store's pixels depend on: every file's path, size and mtime, the size and the resize rule."""
    import hashlib

    from ppmulti.rank.data.cache import file_stamp

    h = hashlib.sha1(f"{size}|{int(bool(augment))}|".encode())
    for f in files:
        h.update(f"{f}\0{file_stamp(f)}\n".encode())
    return h.hexdigest()


class RamStore(ImageStore):
    """``--cache ram``: every image decoded once into one byte array per node, which every local rank and its
    loader workers map read-only (``cache.shared_pixels``). ``load`` returns read-only views: copy to write."""

    def __init__(self, files: list[str], size: int, augment: bool = True,
                 shapes: list[tuple[int, int]] | None = None, local_size: int = 1):
        super().__init__(files, size, augment)
        from ppmulti.rank.data.cache import fill_parallel, shared_pixels

        self.orig = list(shapes) if shapes is not None else image_shapes(self.files)
        self.hw = [resized_shape(h0, w0, self.size) for h0, w0 in self.orig]
        nbytes = np.array([h * w * 3 for h, w in self.hw], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(nbytes)]).astype(np.int64)
        self.nbytes = int(self.offsets[-1])

        def fill(buf: np.ndarray) -> None:
            def one(i: int) -> None:
                got = decode(self.files[i], self.size, self.augment)
                if got.hw != self.hw[i]:
                    raise OSError(f"{self.files[i]} is {got.orig_hw[1]}x{got.orig_hw[0]} now, "
                                  f"{self.orig[i][1]}x{self.orig[i][0]} when it was scanned")
                buf[self.offsets[i]:self.offsets[i + 1]] = got.image.reshape(-1)

            fill_parallel(len(self.files), one)

        self.pixels = shared_pixels(store_key(self.files, self.size, self.augment), self.nbytes, fill, local_size)

    def load(self, index: int) -> Loaded:
        h, w = self.hw[index]
        image = self.pixels[self.offsets[index]:self.offsets[index + 1]].reshape(h, w, 3)
        return Loaded(image, self.orig[index], (h, w))


class DiskStore(ImageStore):
    """``--cache disk``: each image decoded once into an ``.npy`` (``cache.npy_path``: beside it, or under the user
    cache dir), memory-mapped on load, so the page cache is shared by every process of the node. A file changed
    since is decoded again; the first rank of the node writes the missing ones under a lock."""

    def __init__(self, files: list[str], size: int, augment: bool = True,
                 shapes: list[tuple[int, int]] | None = None):
        super().__init__(files, size, augment)
        from ppmulti.rank.data.cache import build_lock, fill_parallel, npy_path

        self.orig = list(shapes) if shapes is not None else image_shapes(self.files)
        self.paths = [npy_path(f, self.size, self.augment) for f in self.files]
        missing = [i for i, p in enumerate(self.paths) if not p.is_file()]
        if missing:
            with build_lock(f"disk:{store_key(self.files, self.size, self.augment)}"):
                missing = [i for i in missing if not self.paths[i].is_file()]
                fill_parallel(len(missing), lambda j: self._write(missing[j]))
            self.written = len(missing)
        else:
            self.written = 0

    def _write(self, index: int) -> Loaded:
        from ppmulti.rank.data.cache import save_npy

        got = decode(self.files[index], self.size, self.augment)
        save_npy(self.paths[index], got.image)
        return got

    def load(self, index: int) -> Loaded:
        try:
            image = np.load(self.paths[index], mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):   # removed or damaged since: decode it again
            return self._write(index)
        h, w = image.shape[:2]
        return Loaded(image, self.orig[index], (h, w))


def make_store(files: list[str], size: int, augment: bool = True, cache: str | None = None,
               shapes: list[tuple[int, int]] | None = None) -> ImageStore:
    """The store for ``--cache`` (None, "ram" or "disk"); ``shapes`` are the files' (h, w) from the scan (read
    from the headers when not given). Build it in the rank's main process, before the loader's workers fork:
    they inherit the RAM cache's mapping."""
    from ppmulti.common.envvars import worker_info
    from ppmulti.rank.data.cache import parse_cache

    mode = parse_cache(cache)
    if mode == "ram":
        return RamStore(files, size, augment, shapes, local_size=worker_info().local_size)
    if mode == "disk":
        return DiskStore(files, size, augment, shapes)
    return ImageStore(files, size, augment)
