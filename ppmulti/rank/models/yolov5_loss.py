"""YOLOv5's training loss: anchor-ratio target assignment with neighbour cells, CIoU box loss, BCE obj/cls."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from ppdet.core.workspace import serializable

from ppmulti.rank.models.yolov5 import register_once

__all__ = ["LevelTargets", "build_targets", "bbox_ciou", "YOLOv5Loss"]

# The centre cell, then left, up, right, down: YOLOv5 also makes the two neighbouring cells
# nearest to a gt centre responsible for it (its xy decoding reaches -0.5..1.5 of a cell).
_NEIGHBOUR_OFFSETS = np.array([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=np.float64)


@dataclass
class LevelTargets:
    """The predictions one pyramid level must fit: one row per (gt, anchor, cell) match."""

    image: np.ndarray      # [n] image index in the batch
    anchor: np.ndarray     # [n] anchor index within the level
    gj: np.ndarray         # [n] grid row
    gi: np.ndarray         # [n] grid column
    box: np.ndarray        # [n, 4] target (x, y) relative to the cell's corner, (w, h), in grid units
    cls: np.ndarray        # [n] class id
    anchor_wh: np.ndarray  # [n, 2] the matched anchor, in grid units

    def __len__(self) -> int:
        return len(self.image)

    def flat_index(self, num_anchors: int, height: int, width: int) -> np.ndarray:
        """Row of each match in the level's predictions flattened as [B, na, H, W]."""
        return ((self.image * num_anchors + self.anchor) * height + self.gj) * width + self.gi


def build_targets(gt_bbox: np.ndarray, gt_class: np.ndarray, gt_valid: np.ndarray,
                  anchors: Sequence[np.ndarray], strides: Sequence[float],
                  grid_shapes: Sequence[tuple[int, int]], anchor_t: float = 4.0,
                  offset_bias: float = 0.5) -> list[LevelTargets]:
    """Match padded ppdet ground truth to anchors and cells the way YOLOv5's ``build_targets`` does.

    Args:
        gt_bbox: [B, M, 4] boxes x1, y1, x2, y2 in input pixels.
        gt_class: [B, M] or [B, M, 1] class ids.
        gt_valid: [B, M] or [B, M, 1], nonzero for real boxes (ppdet's ``pad_gt_mask``).
        anchors: per level, [na, 2] anchor w, h in pixels.
        strides: per level, the stride in pixels.
        grid_shapes: per level, (H, W) of the prediction grid.
        anchor_t: a gt matches an anchor when max(r, 1/r) < anchor_t for both w and h ratios.
        offset_bias: a neighbour cell is added when the centre lies within this fraction of its edge.

    The row order is YOLOv5's (offset, then anchor, then gt in batch order), so where two rows
    land on the same prediction, "the last one wins" picks the same row as YOLOv5.
    """
    gt_bbox = np.asarray(gt_bbox, dtype=np.float64).reshape(-1, 4)
    batch = np.asarray(gt_valid).shape[0]
    valid = np.asarray(gt_valid).reshape(-1) > 0
    classes = np.asarray(gt_class).reshape(-1).astype(np.int64)
    per_image = gt_bbox.shape[0] // batch if batch else 0
    images = np.repeat(np.arange(batch, dtype=np.int64), per_image)
    gt_bbox, classes, images = gt_bbox[valid], classes[valid], images[valid]
    centres = (gt_bbox[:, :2] + gt_bbox[:, 2:]) / 2
    sizes = gt_bbox[:, 2:] - gt_bbox[:, :2]

    levels = []
    for level_anchors, stride, (height, width) in zip(anchors, strides, grid_shapes):
        anchor_wh = np.asarray(level_anchors, dtype=np.float64).reshape(-1, 2) / stride
        gxy, gwh = centres / stride, sizes / stride
        # A degenerate box (w or h of 0) gives ratio inf and matches nothing.
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = gwh[None] / anchor_wh[:, None]                       # [na, nt, 2]
            worst = np.maximum(ratio, 1.0 / ratio).max(axis=2)
        match = np.nan_to_num(worst, nan=np.inf) < anchor_t
        anchor_idx, gt_idx = np.nonzero(match)                          # anchor-major, like t[j]
        cxy = gxy[gt_idx]
        inverse = np.array([width, height], dtype=np.float64) - cxy
        near_low = (cxy % 1 < offset_bias) & (cxy > 1)                  # left (x), up (y)
        near_high = (inverse % 1 < offset_bias) & (inverse > 1)         # right (x), down (y)
        use = np.stack([np.ones(len(cxy), dtype=bool), near_low[:, 0], near_low[:, 1],
                        near_high[:, 0], near_high[:, 1]])             # [5, n]
        offset_idx, row = np.nonzero(use)                               # offset-major, like t.repeat
        sel_xy = cxy[row]
        # Truncation (not floor), as torch's .long(); the values are non-negative here.
        cell = (sel_xy - _NEIGHBOUR_OFFSETS[offset_idx] * offset_bias).astype(np.int64)
        sel_gt = gt_idx[row]
        sel_anchor = anchor_idx[row]
        levels.append(LevelTargets(
            image=images[sel_gt],
            anchor=sel_anchor.astype(np.int64),
            gj=np.clip(cell[:, 1], 0, height - 1),
            gi=np.clip(cell[:, 0], 0, width - 1),
            box=np.concatenate([sel_xy - cell, gwh[sel_gt]], axis=1).astype(np.float32),
            cls=classes[sel_gt],
            anchor_wh=anchor_wh[sel_anchor].astype(np.float32),
        ))
    return levels


def bbox_ciou(box1: paddle.Tensor, box2: paddle.Tensor, eps: float = 1e-7) -> paddle.Tensor:
    """Complete IoU (Zheng et al. 2020) of boxes given as [..., 4] centre x, y, w, h; returns [...].

    The aspect-ratio weight alpha is treated as a constant, as in YOLOv5.
    """
    x1, y1, w1, h1 = paddle.unbind(box1, axis=-1)
    x2, y2, w2, h2 = paddle.unbind(box2, axis=-1)
    b1x1, b1x2, b1y1, b1y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
    b2x1, b2x2, b2y1, b2y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    inter = ((paddle.minimum(b1x2, b2x2) - paddle.maximum(b1x1, b2x1)).clip(min=0) *
             (paddle.minimum(b1y2, b2y2) - paddle.maximum(b1y1, b2y1)).clip(min=0))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = paddle.maximum(b1x2, b2x2) - paddle.minimum(b1x1, b2x1)
    ch = paddle.maximum(b1y2, b2y2) - paddle.minimum(b1y1, b2y1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((x2 - x1) ** 2 + (y2 - y1) ** 2)
    v = (4 / math.pi ** 2) * (paddle.atan(w2 / h2) - paddle.atan(w1 / h1)) ** 2
    alpha = (v / (v - iou + (1 + eps))).detach()
    return iou - (rho2 / c2 + v * alpha)


@register_once
@serializable
class YOLOv5Loss(nn.Layer):
    """YOLOv5's ComputeLoss on ppdet's padded batch (gt_bbox xyxy pixels, gt_class, pad_gt_mask).

    Args:
        num_classes (int): number of classes.
        anchor_t (float): anchor-to-gt size ratio threshold (YOLOv5 hyp ``anchor_t``).
        offset_bias (float): neighbour-cell rule; 0.5 adds the two nearest neighbour cells.
        balance (list): objectness weight per level, P3 first.
        loss_weight (dict): ``box``, ``obj``, ``cls`` gains as in YOLOv5's hyp file, before the
            scaling by 3/nl, nc/80 and (img_size/640)^2 that YOLOv5's train.py applies.
        img_size (int): the training image size the objectness gain is scaled for.
        cls_pw (float): BCE positive weight for classes.
        obj_pw (float): BCE positive weight for objectness.
        label_smoothing (float): class targets become 1 - eps/2 and eps/2.
        gr (float): objectness target = (1 - gr) + gr * CIoU.
        batch_scale (str): 'ref_batch' multiplies the mean loss by ``ref_batch`` (pairs with a
            learning rate scaled linearly from ref_batch); 'batch' multiplies it by the global
            batch (per-rank batch x world size), literally YOLOv5, for a fixed learning rate.
        ref_batch (int): the global batch the learning rate is given for (YOLOv5's nbs, 64).
    """

    __shared__ = ["num_classes", "ref_batch"]

    def __init__(self, num_classes: int = 80, anchor_t: float = 4.0, offset_bias: float = 0.5,
                 balance: Sequence[float] = (4.0, 1.0, 0.4),
                 loss_weight: dict | None = None, img_size: int = 640, cls_pw: float = 1.0,
                 obj_pw: float = 1.0, label_smoothing: float = 0.0, gr: float = 1.0,
                 batch_scale: str = "ref_batch", ref_batch: int = 64):
        super().__init__()
        if batch_scale not in ("ref_batch", "batch"):
            raise ValueError(f"YOLOv5Loss.batch_scale {batch_scale!r}: use 'ref_batch' or 'batch'")
        weights = {"box": 0.05, "obj": 1.0, "cls": 0.5}
        weights.update(loss_weight or {})
        self.num_classes = num_classes
        self.anchor_t = anchor_t
        self.offset_bias = offset_bias
        self.balance = list(balance)
        nl = len(self.balance)
        # YOLOv5's train.py rescales the hyp gains for the number of levels, classes and image size.
        self.box_weight = weights["box"] * 3 / nl
        self.cls_weight = weights["cls"] * num_classes / 80 * 3 / nl
        self.obj_weight = weights["obj"] * (img_size / 640) ** 2 * 3 / nl
        self.cls_pw = cls_pw
        self.obj_pw = obj_pw
        self.cls_pos, self.cls_neg = 1.0 - 0.5 * label_smoothing, 0.5 * label_smoothing
        self.gr = gr
        self.batch_scale = batch_scale
        self.ref_batch = ref_batch

    def _batch_multiplier(self, batch: int) -> float:
        if self.batch_scale == "ref_batch":
            return float(self.ref_batch)
        # YOLOv5 multiplies by the rank's batch and, under DDP, by the world size, because the
        # gradient all-reduce averages over ranks.
        return float(batch * max(1, paddle.distributed.get_world_size()))

    def _bce(self, logits: paddle.Tensor, target: paddle.Tensor, pos_weight: float) -> paddle.Tensor:
        weight = None
        if pos_weight != 1.0:
            weight = paddle.full([1], pos_weight, dtype=logits.dtype)
        return F.binary_cross_entropy_with_logits(logits, target, pos_weight=weight, reduction="mean")

    def forward(self, head_outs: Sequence[paddle.Tensor], targets: dict,
                anchors: Sequence[np.ndarray], strides: Sequence[float]) -> dict:
        """Loss of raw head outputs (per level [B, na*(5+nc), H, W]) against a ppdet batch.

        Returns ``loss`` (what is back-propagated) and, as YOLOv5 logs them, the weighted
        per-batch means ``loss_box``, ``loss_obj``, ``loss_cls``; ``loss`` is their sum
        times the batch multiplier (see ``batch_scale``).
        """
        if len(head_outs) != len(self.balance):
            raise ValueError(f"YOLOv5Loss has {len(self.balance)} balance weights for "
                             f"{len(head_outs)} levels; set YOLOv5Loss.balance")
        batch = head_outs[0].shape[0]
        gt_bbox = targets["gt_bbox"].numpy()
        gt_class = targets["gt_class"].numpy()
        if "pad_gt_mask" in targets:
            gt_valid = targets["pad_gt_mask"].numpy()
        else:
            gt_valid = np.ones(gt_bbox.shape[:2], dtype=np.float32)
        na = len(anchors[0])
        no = self.num_classes + 5
        shapes = [(int(p.shape[2]), int(p.shape[3])) for p in head_outs]
        levels = build_targets(gt_bbox, gt_class, gt_valid, anchors, strides, shapes,
                               self.anchor_t, self.offset_bias)

        # 0-d, as ppdet's losses are: numpy 2 refuses float() of a 1-element 1-D tensor (the loss parts)
        zero = paddle.zeros([], dtype=head_outs[0].dtype)
        loss_box, loss_obj, loss_cls = zero, zero, zero
        for i, (out, tgt) in enumerate(zip(head_outs, levels)):
            height, width = shapes[i]
            pred = out.reshape([batch, na, no, height, width]).transpose([0, 1, 3, 4, 2])
            pred = pred.reshape([-1, no])
            obj_target = paddle.zeros([pred.shape[0]], dtype=pred.dtype)
            if len(tgt):
                index = tgt.flat_index(na, height, width)
                picked = paddle.gather(pred, paddle.to_tensor(index))
                pxy = F.sigmoid(picked[:, :2]) * 2 - 0.5
                pwh = (F.sigmoid(picked[:, 2:4]) * 2) ** 2 * paddle.to_tensor(tgt.anchor_wh)
                iou = bbox_ciou(paddle.concat([pxy, pwh], axis=1), paddle.to_tensor(tgt.box))
                loss_box = loss_box + (1.0 - iou).mean()

                score = iou.detach().clip(min=0)
                if self.gr < 1:
                    score = (1.0 - self.gr) + self.gr * score
                # Several matches can share one prediction; keep the last, as YOLOv5's indexed
                # assignment does, so the scatter below never sees a duplicate index.
                _, last_rev = np.unique(index[::-1], return_index=True)
                keep = len(index) - 1 - last_rev
                obj_target = paddle.scatter(obj_target, paddle.to_tensor(index[keep]),
                                            paddle.gather(score, paddle.to_tensor(keep)), overwrite=True)

                if self.num_classes > 1:
                    cls_target = np.full((len(tgt), self.num_classes), self.cls_neg, dtype=np.float32)
                    cls_target[np.arange(len(tgt)), tgt.cls] = self.cls_pos
                    loss_cls = loss_cls + self._bce(picked[:, 5:], paddle.to_tensor(cls_target), self.cls_pw)
            loss_obj = loss_obj + self._bce(pred[:, 4], obj_target, self.obj_pw) * self.balance[i]

        loss_box = loss_box * self.box_weight
        loss_obj = loss_obj * self.obj_weight
        loss_cls = loss_cls * self.cls_weight
        total = (loss_box + loss_obj + loss_cls) * self._batch_multiplier(batch)
        return {"loss": total, "loss_box": loss_box.detach(), "loss_obj": loss_obj.detach(),
                "loss_cls": loss_cls.detach()}
