"""YOLOv5's validation losses (val/box_loss, val/obj_loss, val/cls_loss): the YOLOv5 head's own loss on the raw
outputs of the evaluation's forward pass (caught by a hook, no second pass) against each image's labels."""

from __future__ import annotations

from typing import Callable

import numpy as np

PARTS = ("loss_box", "loss_obj", "loss_cls")


class ValLoss:
    """Sums YOLOv5's three loss parts over the evaluation's batches on this rank. ``labels(im_id)`` gives an image's
    labels (M, 5: class, x1, y1, x2, y2 in original pixels); the eval transforms letterbox to the top left, so a
    box reaches the input by ``scale_factor`` alone."""

    def __init__(self, head, labels: Callable[[int], np.ndarray]):
        self.head = head
        self.labels = labels
        self.sums = dict.fromkeys(PARTS, 0.0)
        self.batches = 0
        self._outs = None
        self._handle = None

    @classmethod
    def for_model(cls, model, labels: Callable[[int], np.ndarray]) -> "ValLoss | None":
        """A ValLoss when ``model`` has ppmulti's YOLOv5 head (whose loss has YOLOv5's three parts), else None."""
        from ppmulti.rank.models.yolov5_head import YOLOv5Head

        head = next((layer for layer in model.sublayers(include_self=True) if isinstance(layer, YOLOv5Head)), None)
        return None if head is None or head.loss is None else cls(head, labels)

    def __enter__(self) -> "ValLoss":
        def keep(layer, inputs, outputs):
            self._outs = outputs
        self._handle = self.head.register_forward_post_hook(keep)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    def add(self, data: dict) -> None:
        """After the model's forward on ``data``: the loss parts of its raw outputs against the batch's labels."""
        import paddle

        if self._outs is None:
            return
        outs, self._outs = self._outs, None
        ids = _numpy(data["im_id"]).reshape(-1)
        scales = _numpy(data["scale_factor"]).astype(np.float64).reshape(-1, 2)   # (scale_y, scale_x)
        per_image = [self.labels(int(i)) for i in ids]
        width = max([1] + [len(rows) for rows in per_image])
        gt_bbox = np.zeros((len(ids), width, 4), np.float32)
        gt_class = np.zeros((len(ids), width, 1), np.int32)
        valid = np.zeros((len(ids), width, 1), np.float32)
        for b, rows in enumerate(per_image):
            if len(rows):
                sy, sx = scales[b]
                gt_bbox[b, :len(rows)] = rows[:, 1:] * np.array([sx, sy, sx, sy])
                gt_class[b, :len(rows), 0] = rows[:, 0]
                valid[b, :len(rows), 0] = 1
        targets = {"gt_bbox": paddle.to_tensor(gt_bbox), "gt_class": paddle.to_tensor(gt_class),
                   "pad_gt_mask": paddle.to_tensor(valid)}
        losses = self.head.loss(outs, targets, self.head.anchors, self.head.strides)
        for key in PARTS:
            self.sums[key] += float(losses[key].numpy().reshape(-1)[0])
        self.batches += 1

    def state(self) -> tuple[dict[str, float], int]:
        return dict(self.sums), self.batches


def _numpy(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def combine(states: list[tuple[dict[str, float], int] | None]) -> dict[str, float] | None:
    """Every rank's (sums, batches) -> the mean of each part over all batches, as YOLOv5 divides by its loader's
    length; None when no rank computed them."""
    states = [s for s in states if s is not None]
    batches = sum(n for _, n in states)
    if not states or not batches:
        return None
    return {k: sum(sums[k] for sums, _ in states) / batches for k in PARTS}
