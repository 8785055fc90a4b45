"""ppmulti.rank.data.images: YOLOv5's load_image rule (long side to the training size, BGR uint8)."""

import numpy as np
import pytest

from ppmulti.rank.data.images import ImageStore, decode, resized_shape


def test_resized_shape_long_side():
    assert resized_shape(480, 640, 640) == (480, 640)
    assert resized_shape(480, 640, 320) == (240, 320)
    assert resized_shape(1080, 810, 640) == (640, 480)
    assert resized_shape(100, 50, 640) == (640, 320)


def test_decode_and_store(tmp_path):
    cv2 = pytest.importorskip("cv2")
    img = np.zeros((48, 64, 3), np.uint8)
    img[..., 0] = 200   # blue in BGR
    path = tmp_path / "a.png"
    cv2.imwrite(str(path), img)
    loaded = decode(str(path), 32)
    assert loaded.orig_hw == (48, 64) and loaded.hw == (24, 32)
    assert loaded.image.shape == (24, 32, 3) and loaded.image.dtype == np.uint8
    assert loaded.image[..., 0].min() == 200 and loaded.image[..., 2].max() == 0
    store = ImageStore([str(path)], 64)
    assert len(store) == 1 and store.load(0).image.shape == (48, 64, 3)
    with pytest.raises(OSError, match="cannot decode"):
        decode(str(tmp_path / "missing.jpg"), 32)
