"""YOLOv5's training augmentations as numpy/cv2 functions: mosaic and random affine drawn as one warp per tile,
HSV gains through a lookup table, flips, letterbox shapes for --rect. No paddle here (tested on its own).

The semantics follow YOLOv5's ``utils/dataloaders.py`` (load_mosaic, the rect batch shapes) and
``utils/augmentations.py`` (random_perspective, box_candidates, augment_hsv, mixup); the way the pixels are made
differs: YOLOv5 pastes four tiles into a 2s x 2s canvas and warps the canvas to s x s, here every tile is
warped straight into its part of the s x s output with the same matrix (mosaic offset, then the affine), so the
work grows with the output's pixels, not the canvas's. Boxes go through the identical transform and filter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FILL = 114   # YOLOv5's grey for padding and for what the affine brings in from outside the canvas


@dataclass(frozen=True)
class AffineHyp:
    """YOLOv5's hyp values for the geometric augmentations (hyp.scratch-low's defaults)."""

    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    perspective: float = 0.0


def random_matrix(rng, in_hw: tuple[float, float], out_hw: tuple[int, int], hyp: AffineHyp):
    """YOLOv5's random_perspective matrix M = T @ S @ R @ P @ C for an input of ``in_hw`` drawn into ``out_hw``;
    returns (M 3x3, the scale s drawn). Draws in YOLOv5's order: perspective, angle, scale, shear, translation."""
    import cv2

    C = np.eye(3)
    C[0, 2], C[1, 2] = -in_hw[1] / 2, -in_hw[0] / 2
    P = np.eye(3)
    P[2, 0] = rng.uniform(-hyp.perspective, hyp.perspective)
    P[2, 1] = rng.uniform(-hyp.perspective, hyp.perspective)
    R = np.eye(3)
    a = rng.uniform(-hyp.degrees, hyp.degrees)
    s = rng.uniform(1 - hyp.scale, 1 + hyp.scale)
    R[:2] = cv2.getRotationMatrix2D(angle=a, center=(0, 0), scale=s)
    S = np.eye(3)
    S[0, 1] = math.tan(rng.uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    S[1, 0] = math.tan(rng.uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    T = np.eye(3)
    T[0, 2] = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * out_hw[1]
    T[1, 2] = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * out_hw[0]
    return T @ S @ R @ P @ C, s


def box_candidates(box1: np.ndarray, box2: np.ndarray, wh_thr: float = 2, ar_thr: float = 100,
                   area_thr: float = 0.1, eps: float = 1e-16) -> np.ndarray:
    """YOLOv5's filter: boxes (n x 4, xyxy) that stay wider and taller than ``wh_thr`` pixels, keep more than
    ``area_thr`` of their area (``box1`` before, already scaled by s) and an aspect ratio under ``ar_thr``."""
    w1, h1 = box1[:, 2] - box1[:, 0], box1[:, 3] - box1[:, 1]
    w2, h2 = box2[:, 2] - box2[:, 0], box2[:, 3] - box2[:, 1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def transform_boxes(boxes: np.ndarray, M: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """The four corners of each xyxy box through M (3x3), their enclosing box clipped to the output."""
    n = len(boxes)
    if not n:
        return np.zeros((0, 4), np.float64)
    xy = np.ones((n * 4, 3))
    xy[:, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)
    xy = xy @ M.T
    perspective = M[2, 0] != 0 or M[2, 1] != 0
    xy = (xy[:, :2] / xy[:, 2:3] if perspective else xy[:, :2]).reshape(n, 8)
    x, y = xy[:, [0, 2, 4, 6]], xy[:, [1, 3, 5, 7]]
    new = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], 1)
    new[:, [0, 2]] = new[:, [0, 2]].clip(0, out_hw[1])
    new[:, [1, 3]] = new[:, [1, 3]].clip(0, out_hw[0])
    return new


def _is_scale_translate(M: np.ndarray) -> bool:
    return M[0, 1] == 0 and M[1, 0] == 0 and M[2, 0] == 0 and M[2, 1] == 0 and M[0, 0] > 0 and M[1, 1] > 0


def warp_into(out: np.ndarray, src: np.ndarray, M: np.ndarray, region=None) -> np.ndarray:
    """Draw ``src`` through M (3x3, src pixels -> out pixels) into ``out``, touching only what it covers;
    returns the matrix the pixels actually went through (what the boxes must go through).

    ``region`` (x1, y1, x2, y2 in src pixels, default all of src) is the part of src that is visible. When M
    only scales and translates, the visible crop is resized into the covered output rectangle (cv2.resize
    costs about a quarter of a warpAffine of the same pixels); its integer placement moves it by under a
    pixel from M, and the returned matrix says exactly where it went. Otherwise the whole output is warped
    with a transparent border (pixels outside ``region`` are not written) and M is returned.
    """
    import cv2

    x1, y1, x2, y2 = region if region is not None else (0, 0, src.shape[1], src.shape[0])
    if x2 <= x1 or y2 <= y1:
        return M
    H, W = out.shape[:2]
    if _is_scale_translate(M):
        placed = []
        for scale, shift, lo, hi, size in ((M[0, 0], M[0, 2], x1, x2, W), (M[1, 1], M[1, 2], y1, y2, H)):
            c = shift + 0.5 - 0.5 * scale            # pixel edges: out_edge = scale * src_edge + c
            s0 = max(lo, math.floor(-c / scale))      # the source span that can reach the output
            s1 = min(hi, math.ceil((size - c) / scale))
            if s1 <= s0:
                return M
            o0, o1 = round(scale * s0 + c), round(scale * s1 + c)
            if o1 <= o0:
                return M
            placed.append((s0, s1, o0, o1))
        (sx0, sx1, u0, u1), (sy0, sy1, v0, v1) = placed
        part = cv2.resize(src[sy0:sy1, sx0:sx1], (u1 - u0, v1 - v0), interpolation=cv2.INTER_LINEAR)
        cu0, cv0 = max(u0, 0), max(v0, 0)
        cu1, cv1 = min(u1, W), min(v1, H)
        out[cv0:cv1, cu0:cu1] = part[cv0 - v0:cv1 - v0, cu0 - u0:cu1 - u0]
        kx, ky = (u1 - u0) / (sx1 - sx0), (v1 - v0) / (sy1 - sy0)
        return np.array([[kx, 0, u0 + (0.5 - sx0) * kx - 0.5], [0, ky, v0 + (0.5 - sy0) * ky - 0.5], [0, 0, 1]])
    crop = src[y1:y2, x1:x2]
    shift = np.array([[1, 0, x1], [0, 1, y1], [0, 0, 1]], np.float64)
    Mc = M @ shift
    if Mc[2, 0] != 0 or Mc[2, 1] != 0:
        cv2.warpPerspective(crop, Mc, (W, H), dst=out, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_TRANSPARENT)
    else:
        cv2.warpAffine(crop, Mc[:2], (W, H), dst=out, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_TRANSPARENT)
    return M


@dataclass
class Tile:
    """One loaded image for a mosaic: pixels (BGR uint8, h x w x 3) and boxes (n x 4 xyxy, in its pixels)."""

    image: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray   # n x 1 int32


def mosaic_layout(xc: int, yc: int, s: int, hw: tuple[int, int], i: int):
    """YOLOv5's load_mosaic placement of tile ``i`` (0 top-left .. 3 bottom-right) of size hw around (xc, yc)
    on a 2s canvas: (canvas rectangle, tile rectangle), each x1, y1, x2, y2."""
    h, w = hw
    if i == 0:
        a = (max(xc - w, 0), max(yc - h, 0), xc, yc)
        b = (w - (a[2] - a[0]), h - (a[3] - a[1]), w, h)
    elif i == 1:
        a = (xc, max(yc - h, 0), min(xc + w, s * 2), yc)
        b = (0, h - (a[3] - a[1]), min(w, a[2] - a[0]), h)
    elif i == 2:
        a = (max(xc - w, 0), yc, xc, min(s * 2, yc + h))
        b = (w - (a[2] - a[0]), 0, w, min(a[3] - a[1], h))
    else:
        a = (xc, yc, min(xc + w, s * 2), min(s * 2, yc + h))
        b = (0, 0, min(w, a[2] - a[0]), min(a[3] - a[1], h))
    return a, b


def mosaic(tiles: list[Tile], s: int, hyp: AffineHyp, rng):
    """YOLOv5's load_mosaic followed by random_perspective (border -s/2): an s x s BGR image, boxes, classes."""
    border = -s // 2
    yc, xc = (int(rng.uniform(-border, 2 * s + border)) for _ in range(2))
    M, scale = random_matrix(rng, (2 * s, 2 * s), (s, s), hyp)
    out = np.full((s, s, 3), FILL, np.uint8)
    canvas, moved, classes = [], [], []
    for i, tile in enumerate(tiles):
        (x1a, y1a, _, _), (x1b, y1b, x2b, y2b) = mosaic_layout(xc, yc, s, tile.image.shape[:2], i)
        padw, padh = x1a - x1b, y1a - y1b
        offset = np.array([[1, 0, padw], [0, 1, padh], [0, 0, 1]], np.float64)
        used = warp_into(out, tile.image, M @ offset, (x1b, y1b, x2b, y2b))
        if len(tile.boxes):
            # YOLOv5 clips the boxes to the 2s canvas, then moves them with the pixels
            boxes = np.clip(tile.boxes.astype(np.float64) + [padw, padh, padw, padh], 0, 2 * s)
            canvas.append(boxes)
            moved.append(transform_boxes(boxes - [padw, padh, padw, padh], used, (s, s)))
            classes.append(tile.classes)
    if not canvas:
        return out, np.zeros((0, 4), np.float32), np.zeros((0, 1), np.int32)
    return out, *_keep(np.concatenate(canvas), np.concatenate(moved), np.concatenate(classes), scale)


def _keep(before: np.ndarray, after: np.ndarray, classes: np.ndarray, scale: float):
    keep = box_candidates(before * scale, after, area_thr=0.10)
    return after[keep].astype(np.float32), classes[keep].astype(np.int32).reshape(-1, 1)


def letterbox_affine(tile: Tile, shape: tuple[int, int], hyp: AffineHyp, rng, scaleup: bool = True):
    """YOLOv5's non-mosaic path: letterbox into ``shape`` (h, w; centred, 114 pad), then random_perspective
    with border 0, drawn as one warp. Returns (image h x w x 3, boxes, classes)."""
    h0, w0 = tile.image.shape[:2]
    r = min(shape[0] / h0, shape[1] / w0)
    if not scaleup:
        r = min(r, 1.0)
    nw, nh = int(round(w0 * r)), int(round(h0 * r))
    dw, dh = (shape[1] - nw) / 2, (shape[0] - nh) / 2
    left, top = int(round(dw - 0.1)), int(round(dh - 0.1))
    L = np.array([[nw / w0, 0, left], [0, nh / h0, top], [0, 0, 1]], np.float64)
    M, scale = random_matrix(rng, shape, shape, hyp)
    out = np.full((shape[0], shape[1], 3), FILL, np.uint8)
    used = warp_into(out, tile.image, M @ L)
    if not len(tile.boxes):
        return out, np.zeros((0, 4), np.float32), np.zeros((0, 1), np.int32)
    boxes = tile.boxes.astype(np.float64)
    before = boxes * [nw / w0, nh / h0, nw / w0, nh / h0] + [left, top, left, top]
    return out, *_keep(before, transform_boxes(boxes, used, shape), tile.classes, scale)


def hsv_gains(rng, hgain: float, sgain: float, vgain: float) -> np.ndarray:
    """YOLOv5's random multiplicative gains: 1 + U(-1, 1) x gain for H, S and V."""
    return rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1


def augment_hsv(image: np.ndarray, gains: np.ndarray, rgb: bool = False) -> np.ndarray:
    """Multiply H (mod 180), S and V (clipped) of a BGR uint8 image by ``gains`` through one 3-channel LUT.
    Returns the image: BGR written back in place, or (``rgb``) a new RGB image, the channel swap for free."""
    import cv2

    x = np.arange(0, 256, dtype=np.float64)
    lut = np.stack([((x * gains[0]) % 180), np.clip(x * gains[1], 0, 255), np.clip(x * gains[2], 0, 255)],
                   1).astype(np.uint8).reshape(256, 1, 3)
    hsv = cv2.cvtColor(image, cv2.COLOR_BGR2HSV)
    cv2.LUT(hsv, lut, dst=hsv)
    if rgb:
        return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=image)
    return image


def mixup(rng, a: tuple, b: tuple):
    """YOLOv5's mixup: blend two augmented images with r ~ Beta(32, 32); the boxes of both are kept."""
    r = rng.beta(32.0, 32.0)
    image = (a[0] * r + b[0] * (1 - r)).astype(np.uint8)
    return image, np.concatenate([a[1], b[1]]), np.concatenate([a[2], b[2]])


def flip_lr(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right: the image (a new contiguous array: cv2.flip copies fast, where collating a reversed
    numpy view copies slowly) and its xyxy boxes."""
    import cv2

    w = image.shape[1]
    out = boxes.copy()
    out[:, 0], out[:, 2] = w - boxes[:, 2], w - boxes[:, 0]
    return cv2.flip(image, 1), out


def flip_ud(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror top-bottom: the image (a new contiguous array) and its xyxy boxes."""
    import cv2

    h = image.shape[0]
    out = boxes.copy()
    out[:, 1], out[:, 3] = h - boxes[:, 3], h - boxes[:, 1]
    return cv2.flip(image, 0), out


def to_chw(image: np.ndarray, swap_rb: bool = False) -> np.ndarray:
    """An h x w x 3 image (any strides: a flipped view is fine) as a contiguous 3 x h x w uint8 array, in one
    copy; ``swap_rb`` turns BGR into RGB on the way."""
    return np.ascontiguousarray((image[:, :, ::-1] if swap_rb else image).transpose(2, 0, 1))


def rect_shapes(hw: np.ndarray, batch: int, img_size: int, stride: int = 32, pad: float = 0.0) -> np.ndarray:
    """YOLOv5's --rect batch shapes for images of sizes ``hw`` (n x 2) already in batch order (sorted by
    aspect ratio): per batch, ``ceil(shape * img_size / stride + pad) * stride`` with shape the batch's
    h/w ratio range brought to a long side of 1. Returns one (h, w) per batch."""
    ar = hw[:, 0] / hw[:, 1]
    nb = int(math.ceil(len(hw) / batch))
    shapes = np.ones((nb, 2))
    for i in range(nb):
        a = ar[i * batch:(i + 1) * batch]
        mini, maxi = a.min(), a.max()
        if maxi < 1:
            shapes[i] = [maxi, 1]
        elif mini > 1:
            shapes[i] = [1, 1 / mini]
    return (np.ceil(shapes * img_size / stride + pad) * stride).astype(int)


# ultralytics' val (and YOLOv5's val.py) letterbox each batch to its rect shape with half a stride of margin
VAL_RECT_PAD = 0.5


def val_letterbox(image: np.ndarray, img_size: int, shape: tuple[int, int],
                  fill: int = 114) -> tuple[np.ndarray, tuple[float, float], tuple[int, int]]:
    """ultralytics' validation letterbox of one image into ``shape`` (h, w): the long side brought to ``img_size``
    (linear interpolation), then shrunk further only if ``shape`` needs it (never enlarged), centred, the margin
    filled with ``fill``. Returns (image, (gain_h, gain_w) from the original pixels, (top, left) margin)."""
    import cv2

    h0, w0 = image.shape[:2]
    r = img_size / max(h0, w0)
    if r != 1:
        size = (min(math.ceil(w0 * r), img_size), min(math.ceil(h0 * r), img_size))
        image = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR)
    h, w = image.shape[:2]
    r = min(shape[0] / h, shape[1] / w, 1.0)
    new_w, new_h = max(round(w * r), 1), max(round(h * r), 1)
    if (new_h, new_w) != (h, w):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    dh, dw = (shape[0] - new_h) / 2, (shape[1] - new_w) / 2
    # the odd pixel of a margin goes to the bottom and right, as ultralytics' +-0.1 rounding puts it
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    if top or bottom or left or right:
        image = cv2.copyMakeBorder(image, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(fill,) * 3)
    return image, (new_h / h0, new_w / w0), (top, left)
