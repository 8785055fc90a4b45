"""Validation losses on the evaluation's own forward pass (no second pass), against each image's labels: YOLOv5's
(val/box_loss, val/obj_loss, val/cls_loss: its head's raw outputs caught by a hook) and the ultralytics family's
(val/box_loss, val/cls_loss, val/dfl_loss or YOLO26's l1_loss: the raw outputs its Detect head keeps in eval)."""

from __future__ import annotations

from typing import Callable

import numpy as np

PARTS = ("loss_box", "loss_obj", "loss_cls")         # YOLOv5's loss parts
ULTRA_PARTS = ("loss_box", "loss_cls", "loss_dfl")   # ultralytics' loss items (dfl: YOLO26's L1 under its gain)


class ValLoss:
    """Sums YOLOv5's three loss parts over the evaluation's batches on this rank. ``labels(im_id)`` gives an image's
    labels (M, 5: class, x1, y1, x2, y2 in original pixels); a box reaches the input by ``scale_factor`` and, under
    ultralytics' centred val letterbox (RectLetterbox), its ``pad_offset`` margin (ppdet's Resize and Pad letterbox to
    the top left: no margin)."""

    parts = PARTS

    def __init__(self, head, labels: Callable[[int], np.ndarray]):
        self.head = head
        self.labels = labels
        self.sums = dict.fromkeys(self.parts, 0.0)
        self.batches = 0
        self._outs = None
        self._handle = None

    @classmethod
    def for_model(cls, model, labels: Callable[[int], np.ndarray]) -> "ValLoss | None":
        """A ValLoss when ``model`` has a loss that gives validation losses: ppmulti's YOLOv5 head (YOLOv5's three
        parts) or UltraYOLO with its training loss (ultralytics' three items); else None."""
        from ppmulti.rank.models.yolov5_head import YOLOv5Head

        ultra = UltraValLoss.for_model(model, labels)
        if ultra is not None:
            return ultra
        head = next((layer for layer in model.sublayers(include_self=True) if isinstance(layer, YOLOv5Head)), None)
        return None if head is None or head.loss is None else cls(head, labels)

    def __enter__(self) -> "ValLoss":
        def keep(layer, inputs, outputs):
            self._outs = outputs
        self._handle = self.head.register_forward_post_hook(keep)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    def _take(self):
        """The raw outputs of the forward pass just run (None when there was none), forgotten once taken."""
        outs, self._outs = self._outs, None
        return outs

    def targets(self, data: dict) -> dict:
        """The batch's labels in the eval input's pixels, padded: ``gt_bbox`` [B, M, 4] x1 y1 x2 y2, ``gt_class``
        [B, M, 1], ``pad_gt_mask`` [B, M, 1] (M at least 1), as the training reader gives them."""
        import paddle

        ids = _numpy(data["im_id"]).reshape(-1)
        scales = _numpy(data["scale_factor"]).astype(np.float64).reshape(-1, 2)   # (scale_y, scale_x)
        # ultralytics' val letterbox (RectLetterbox) centres the image: its margin (top, left) moves the boxes too
        margins = _numpy(data["pad_offset"]).astype(np.float64).reshape(-1, 2) if "pad_offset" in data else \
            np.zeros_like(scales)
        per_image = [self.labels(int(i)) for i in ids]
        width = max([1] + [len(rows) for rows in per_image])
        gt_bbox = np.zeros((len(ids), width, 4), np.float32)
        gt_class = np.zeros((len(ids), width, 1), np.int32)
        valid = np.zeros((len(ids), width, 1), np.float32)
        for b, rows in enumerate(per_image):
            if len(rows):
                sy, sx = scales[b]
                top, left = margins[b]
                gt_bbox[b, :len(rows)] = rows[:, 1:] * np.array([sx, sy, sx, sy]) + np.array([left, top, left, top])
                gt_class[b, :len(rows), 0] = rows[:, 0]
                valid[b, :len(rows), 0] = 1
        return {"gt_bbox": paddle.to_tensor(gt_bbox), "gt_class": paddle.to_tensor(gt_class),
                "pad_gt_mask": paddle.to_tensor(valid)}

    def losses(self, outs, data: dict) -> dict:
        """The loss parts (0-d tensors) of the raw outputs ``outs`` against the batch's labels."""
        return self.head.loss(outs, self.targets(data), self.head.anchors, self.head.strides)

    def add(self, data: dict) -> None:
        """After the model's forward on ``data``: the loss parts of its raw outputs against the batch's labels."""
        outs = self._take()
        if outs is None:
            return
        losses = self.losses(outs, data)
        for key in self.parts:
            self.sums[key] += float(losses[key].numpy().reshape(-1)[0])
        self.batches += 1

    def state(self) -> tuple[dict[str, float], int]:
        return dict(self.sums), self.batches


class UltraValLoss(ValLoss):
    """YOLOv8 / YOLO11 / YOLO26's validation losses as ultralytics' validator computes them during training: the
    model's training loss (UltraDetectionLoss; YOLO26's UltraE2ELoss, whose items are its one-to-one branch's) on
    the raw outputs of the eval forward (both branches for YOLO26, whichever one inference reads), its loss items
    (gain-weighted box, cls, dfl or L1) summed per batch; ``combine`` divides by the batches."""

    parts = ULTRA_PARTS

    def __init__(self, arch, labels: Callable[[int], np.ndarray]):
        super().__init__(arch.head, labels)
        self.loss = arch.loss

    @classmethod
    def for_model(cls, model, labels: Callable[[int], np.ndarray]) -> "UltraValLoss | None":
        """An UltraValLoss when ``model`` holds an UltraYOLO with its training loss built, else None."""
        from ppmulti.rank.models.ultra_yolo import UltraYOLO

        arch = next((layer for layer in model.sublayers(include_self=True) if isinstance(layer, UltraYOLO)), None)
        if arch is None or arch.loss is None or isinstance(arch.loss, str):
            return None
        return cls(arch, labels)

    def __enter__(self) -> "UltraValLoss":
        self.head.raw = None
        self.head.keep_raw = True
        return self

    def __exit__(self, *exc) -> None:
        self.head.keep_raw = False
        self.head.raw = None

    def _take(self):
        outs, self.head.raw = self.head.raw, None
        return outs

    def losses(self, outs, data: dict) -> dict:
        # the eval batch's image: the loss reads the strides from its size when the head's are not set on it
        return self.loss(outs, {**self.targets(data), "image": data["image"]})


def _numpy(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def combine(states: list[tuple[dict[str, float], int] | None]) -> dict[str, float] | None:
    """Every rank's (sums, batches) -> the mean of each part over all batches (YOLOv5 and ultralytics divide the
    summed parts by their loader's length); None when no rank computed them."""
    states = [s for s in states if s is not None]
    batches = sum(n for _, n in states)
    if not states or not batches:
        return None
    return {k: sum(sums[k] for sums, _ in states) / batches for k in states[0][0]}
