"""--multi-scale: YOLOv5's random training size per step, drawn alike on every rank, applied on the device."""

from __future__ import annotations

import math
import random

STRIDE = 32   # the largest stride of the P5 models (YOLOv5's gs); sizes are multiples of it


def draw_size(imgsz: int, seed: int, epoch: int, step: int, stride: int = STRIDE) -> int:
    """YOLOv5's draw, ``randrange(0.5 imgsz, 1.5 imgsz + gs) // gs * gs``, from a generator seeded by
    (seed, epoch, step) alone: every rank draws the same size at the same step, whatever its own random
    state (the ranks' global generators are seeded differently for augmentation), and a resumed run draws
    the sizes it would have drawn. A string seed is hashed with SHA-512 by ``random``, not by ``hash()``,
    so it is the same in every process."""
    rng = random.Random(f"multi-scale:{seed}:{epoch}:{step}")
    size = rng.randrange(int(imgsz * 0.5), int(imgsz * 1.5) + stride) // stride * stride
    return max(stride, size)


def resize_batch(data: dict, size: int, stride: int = STRIDE) -> tuple[int, int]:
    """Resize ``data['image']`` (N, C, H, W) so its long side is ``size`` and both sides are multiples of
    ``stride`` (YOLOv5: ``ceil(side x size / long side / gs) x gs``), bilinear, on the tensor's device; the
    boxes (``gt_bbox``, pixels xyxy), ``im_shape`` and ``scale_factor`` follow. Returns the new (H, W)."""
    import paddle
    import paddle.nn.functional as F

    image = data["image"]
    h, w = int(image.shape[2]), int(image.shape[3])
    factor = size / max(h, w)
    if factor == 1:
        return h, w
    nh, nw = (math.ceil(side * factor / stride) * stride for side in (h, w))
    if image.dtype == paddle.uint8:   # a uint8 batch (normalised later on the device): resize in float, round back
        resized = F.interpolate(image.astype("float32"), size=[nh, nw], mode="bilinear", align_corners=False)
        data["image"] = resized.round().clip(0, 255).astype("uint8")
    else:
        data["image"] = F.interpolate(image, size=[nh, nw], mode="bilinear", align_corners=False)
    ry, rx = nh / h, nw / w
    if "gt_bbox" in data:
        box = data["gt_bbox"]
        data["gt_bbox"] = box * paddle.to_tensor([rx, ry, rx, ry], dtype=box.dtype)
    for key in ("im_shape", "scale_factor"):   # both (N, 2) as (y, x)
        if key in data and isinstance(data[key], paddle.Tensor):
            data[key] = data[key] * paddle.to_tensor([ry, rx], dtype=data[key].dtype)
    return nh, nw


class MultiScale:
    """Called by ``Trainer.run_step`` on each batch (after it is on the device and in float): a size drawn by
    ``draw_size`` around ``imgsz``, the batch resized to it. ``last_size`` is the (H, W) of the last batch."""

    def __init__(self, imgsz: int, seed: int = 0, stride: int = STRIDE):
        self.imgsz, self.seed, self.stride = int(imgsz), int(seed), int(stride)
        self.last_size: tuple[int, int] | None = None

    def __call__(self, data: dict, epoch: int, step: int) -> tuple[int, int]:
        size = draw_size(self.imgsz, self.seed, epoch, step, self.stride)
        self.last_size = resize_batch(data, size, self.stride)
        return self.last_size
