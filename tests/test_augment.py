"""ppmulti.rank.data.augment against YOLOv5's semantics: the mosaic + affine drawn per tile equals YOLOv5's
2s canvas warped to s (pixels and boxes), boxes move with the pixels, flips, HSV gains, letterbox, rect shapes."""

from __future__ import annotations

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from ppmulti.rank.data import augment as A  # noqa: E402


def _smooth(h, w, seed):
    rng = np.random.default_rng(seed)
    return cv2.resize(rng.integers(0, 255, (h // 32 + 2, w // 32 + 2, 3), dtype=np.uint8), (w, h),
                      interpolation=cv2.INTER_CUBIC)


def _yolov5_reference(tiles, s, hyp, seed):
    """YOLOv5's load_mosaic + random_perspective as it is written there: paste into a 2s canvas of 114,
    clip the boxes to the canvas, warp the canvas (border -s/2), move and filter the boxes."""
    rng = np.random.default_rng(seed)
    yc, xc = (int(rng.uniform(s // 2, 2 * s - s // 2)) for _ in range(2))
    M, scale = A.random_matrix(rng, (2 * s, 2 * s), (s, s), hyp)
    canvas = np.full((2 * s, 2 * s, 3), 114, np.uint8)
    boxes = []
    for i, t in enumerate(tiles):
        (x1a, y1a, x2a, y2a), (x1b, y1b, x2b, y2b) = A.mosaic_layout(xc, yc, s, t.image.shape[:2], i)
        canvas[y1a:y2a, x1a:x2a] = t.image[y1b:y2b, x1b:x2b]
        boxes.append(np.clip(t.boxes + [x1a - x1b, y1a - y1b] * 2, 0, 2 * s))
    boxes = np.concatenate(boxes)
    image = cv2.warpAffine(canvas, M[:2], (s, s), borderValue=(114, 114, 114))
    new = A.transform_boxes(boxes, M, (s, s))
    keep = A.box_candidates(boxes * scale, new, area_thr=0.10)
    return image, new[keep]


def _tiles(h=240, w=320):
    boxes = np.array([[20.0, 30.0, 150.0, 120.0], [0.0, 0.0, w, h], [200.0, 150.0, 205.0, 152.0]])
    return [A.Tile(_smooth(h, w, i), boxes.copy(), np.array([[i], [i], [i]], np.int32)) for i in range(4)]


@pytest.mark.parametrize("hyp", [A.AffineHyp(), A.AffineHyp(degrees=10.0, shear=3.0, scale=0.3)])
@pytest.mark.parametrize("seed", range(6))
def test_mosaic_equals_yolov5s_canvas_then_warp(hyp, seed):
    tiles = _tiles()
    image, boxes, classes = A.mosaic(tiles, 320, hyp, np.random.default_rng(seed))
    ref_image, ref_boxes = _yolov5_reference(tiles, 320, hyp, seed)
    assert image.shape == (320, 320, 3) and image.dtype == np.uint8
    diff = np.abs(image.astype(int) - ref_image.astype(int))
    # the same pixels up to where tiles meet (interpolation across a seam) and, on the resize path, a placement
    # within one pixel of YOLOv5's sub-pixel position
    assert diff.mean() < 2.0 and (diff > 40).mean() < 0.01
    assert len(boxes) == len(ref_boxes) == len(classes)
    assert np.abs(boxes - ref_boxes).max() < 1.0


@pytest.mark.parametrize("degrees,shear", [(0.0, 0.0), (15.0, 0.0), (0.0, 5.0)])
def test_boxes_move_as_the_pixels_do(degrees, shear):
    """A white rectangle on black, labelled by its box, drawn through random matrices: the white pixels' extent
    is the moved box (within a pixel), wherever the matrix puts it, partly outside the output included (for
    axis-aligned boxes)."""
    rng = np.random.default_rng(1)
    hyp = A.AffineHyp(degrees=degrees, shear=shear, translate=0.3, scale=0.5)
    for _ in range(20):
        im = np.zeros((200, 260, 3), np.uint8)
        x1, y1 = int(rng.integers(10, 120)), int(rng.integers(10, 90))
        x2, y2 = x1 + int(rng.integers(40, 120)), y1 + int(rng.integers(40, 100))
        im[y1:y2, x1:x2] = 255
        box = np.array([[x1 - 0.5, y1 - 0.5, x2 - 0.5, y2 - 0.5]])   # pixel edges in pixel-centre coordinates
        M, _ = A.random_matrix(rng, (200, 260), (240, 240), hyp)
        out = np.zeros((240, 240, 3), np.uint8)
        used = A.warp_into(out, im, M)
        moved = A.transform_boxes(box, used, (240, 240))[0]
        white = np.argwhere(out.min(axis=2) > 127)
        if moved[2] - moved[0] < 3 or moved[3] - moved[1] < 3:
            assert len(white) < 0.02 * out.shape[0] * out.shape[1]
            continue
        if (degrees or shear) and not (moved[:2].min() > 0 and moved[2:].max() < 240):
            continue   # a rotated box cut by the border encloses corners outside the image (as in YOLOv5)
        (wy1, wx1), (wy2, wx2) = white.min(0), white.max(0) + 1   # white pixels' edges
        tol = 1.0 if degrees == shear == 0 else 2.0   # a rotated rectangle touches its box with sub-pixel corners
        assert abs(wx1 - moved[0]) <= tol and abs(wx2 - moved[2]) <= tol
        assert abs(wy1 - moved[1]) <= tol and abs(wy2 - moved[3]) <= tol


def test_box_candidates_rules():
    before = np.array([[0, 0, 100, 100], [0, 0, 100, 100], [0, 0, 100, 100], [0, 0, 100, 100]], float)
    after = np.array([[0, 0, 50, 50], [0, 0, 30, 30], [0, 0, 1.5, 50], [0, 0, 100, 0.9]], float)
    assert A.box_candidates(before, after).tolist() == [True, False, False, False]


def test_flips_move_boxes_with_pixels():
    im = np.zeros((10, 20, 3), np.uint8)
    im[2:5, 3:8] = 255
    box = np.array([[3.0, 2.0, 8.0, 5.0]])
    flipped, fb = A.flip_lr(im, box)
    assert fb.tolist() == [[12.0, 2.0, 17.0, 5.0]] and flipped[2:5, 12:17].min() == 255 and flipped.sum() == im.sum()
    flipped, fb = A.flip_ud(im, box)
    assert fb.tolist() == [[3.0, 5.0, 8.0, 8.0]] and flipped[5:8, 3:8].min() == 255


def test_hsv_gains_and_lut():
    rng = np.random.default_rng(0)
    gains = np.array([A.hsv_gains(rng, 0.015, 0.7, 0.4) for _ in range(4000)])
    assert (np.abs(gains - 1) <= [0.015, 0.7, 0.4]).all()
    assert np.allclose(gains.min(0), [0.985, 0.3, 0.6], atol=0.01) and np.allclose(gains.max(0), [1.015, 1.7, 1.4],
                                                                                      atol=0.01)
    image = _smooth(64, 64, 3)
    same = A.augment_hsv(image.copy(), np.array([1.0, 1.0, 1.0]))
    assert np.abs(same.astype(int) - image.astype(int)).max() <= 8   # OpenCV's 8-bit HSV round trip
    grey = np.full((4, 4, 3), 114, np.uint8)
    darker = A.augment_hsv(grey.copy(), np.array([1.0, 1.7, 0.5]))   # grey has no saturation: V alone acts
    assert (darker == 57).all()
    rgb = A.augment_hsv(image.copy(), np.array([1.0, 1.0, 1.0]), rgb=True)
    assert np.array_equal(rgb, same[:, :, ::-1])


def test_letterbox_without_augmentation_is_yolov5s_letterbox():
    im = _smooth(240, 320, 5)
    tile = A.Tile(im, np.array([[10.0, 20.0, 100.0, 200.0]]), np.array([[0]], np.int32))
    out, boxes, _ = A.letterbox_affine(tile, (320, 320), A.AffineHyp(translate=0.0, scale=0.0),
                                       np.random.default_rng(0))
    assert out.shape == (320, 320, 3)
    assert (out[:40] == 114).all() and (out[280:] == 114).all()     # 40 px of pad above and below
    ref = cv2.resize(im, (320, 240), interpolation=cv2.INTER_LINEAR)
    assert np.abs(out[40:280].astype(int) - ref.astype(int)).mean() < 1.0
    assert np.allclose(boxes, [[10.0, 60.0, 100.0, 240.0]], atol=0.51)


def test_rect_shapes_as_yolov5():
    hw = np.array([[480, 640], [360, 640], [640, 480], [640, 320], [640, 640]])
    # batches of 2 in this order: (480x640, 360x640) -> wide; (640x480, 640x320) -> tall; (640x640) square
    shapes = A.rect_shapes(hw, 2, 640)
    assert shapes.tolist() == [[480, 640], [640, 480], [640, 640]]
    assert A.rect_shapes(np.array([[100, 1000]]), 1, 640, pad=0.5).tolist() == [[96, 672]]


def test_mixup_blends_and_keeps_both_boxes():
    a = (np.full((8, 8, 3), 200, np.uint8), np.ones((2, 4), np.float32), np.zeros((2, 1), np.int32))
    b = (np.full((8, 8, 3), 100, np.uint8), np.ones((1, 4), np.float32), np.ones((1, 1), np.int32))
    image, boxes, classes = A.mixup(np.random.default_rng(0), a, b)
    assert 130 < image.mean() < 170 and len(boxes) == 3 and classes[:, 0].tolist() == [0, 0, 1]
