"""Ultralytics 8.4's detection losses in Paddle: YOLOv8/YOLO11's (BCE, CIoU, DFL) and YOLO26's end-to-end one."""

from __future__ import annotations

from typing import Any, Sequence

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from ppdet.core.workspace import serializable

from ppmulti.rank.models.ultra_assign import (TaskAlignedAssigner, bbox2dist, bbox_ciou_xyxy, dist2bbox,
                                              make_anchors)
from ppmulti.rank.models.yolov5 import register_once

__all__ = ["UltraDetectionLoss", "UltraE2ELoss", "ultra_gt", "e2e_weights", "BATCH_SCALES"]

# How the mean loss is scaled before backward. ultralytics multiplies it by the rank's batch (and, under DDP, by
# the world size, as DDP averages gradients), then sums `accumulate` batches before a step at lr0: a step's
# gradient is the effective batch x the mean gradient. ppmulti's trainer averages the accumulated batches and
# the ranks, so 'effective' (x global batch x accumulate, lr0 unscaled) is ultralytics' one-process step exactly
# on any number of ranks (each divides by the mean of the ranks' normalisers: _over_ranks), for SGD and Adam
# alike; 'ref_batch' (x ref_batch, with ppmulti's lr scaled linearly from ref_batch) is the same step for SGD;
# 'batch' is ultralytics' returned value (x the rank's batch), for comparing numbers.
BATCH_SCALES = ("effective", "ref_batch", "batch")


def ultra_gt(inputs: dict, batch: int) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """ppmulti's padded batch (``gt_bbox`` [B, M, 4] x1 y1 x2 y2 input pixels, ``gt_class`` [B, M(, 1)],
    ``pad_gt_mask`` [B, M(, 1)]) as ultralytics' padded targets: labels [B, M, 1], boxes [B, M, 4] and the
    real-box mask [B, M, 1] (ultralytics' rule, a box with a positive coordinate sum, and the pad mask)."""
    gt_bbox = inputs.get("gt_bbox")
    if gt_bbox is None or gt_bbox.shape[0] == 0 or gt_bbox.shape[1] == 0:
        empty = paddle.zeros([batch, 0, 1], dtype="float32")
        return empty, paddle.zeros([batch, 0, 4], dtype="float32"), empty
    boxes = gt_bbox.astype("float32").reshape([batch, -1, 4])
    n_max = boxes.shape[1]
    labels = inputs["gt_class"].astype("float32").reshape([batch, n_max, 1])
    mask = (boxes.sum(axis=-1, keepdim=True) > 0).astype("float32")
    if inputs.get("pad_gt_mask") is not None:
        mask = mask * (inputs["pad_gt_mask"].astype("float32").reshape([batch, n_max, 1]) > 0).astype("float32")
    return labels, boxes, mask


def e2e_weights(epoch: int, epochs: int, start: float = 0.8, final: float = 0.1) -> tuple[float, float]:
    """YOLO26's weights of its one-to-many and one-to-one losses in ``epoch`` (0-based): the one-to-many weight
    falls linearly from ``start`` at the first epoch to ``final`` at the last, the one-to-one one is the rest
    of 1 (ultralytics' E2ELoss, updated after every epoch and on resume)."""
    o2m = max(1 - epoch / max(epochs - 1, 1), 0) * (start - final) + final
    return o2m, max(1.0 - o2m, 0.0)


@register_once
@serializable
class UltraDetectionLoss(nn.Layer):
    """Ultralytics 8.4's ``v8DetectionLoss`` on ppmulti's batch: the loss of YOLOv8, YOLO11 (and of each branch
    of YOLO26).

    Called as ``loss(head_outputs, inputs)``: ``head_outputs`` is what ultralytics' Detect head returns in
    training, ``{"boxes": [B, 4 x reg_max, A], "scores": [B, nc, A], "feats": [level tensors B, C, H, W]}``
    (or, from an end-to-end head, the one-to-many part of it); ``inputs`` is the reader's batch (``image``,
    ``gt_bbox``, ``gt_class``, ``pad_gt_mask``). The strides are ``strides`` when given (the head's), else the
    image's height over each level's.

    Returns ``loss`` (back-propagated; see ``batch_scale``) and the gain-weighted means ``loss_box`` (CIoU),
    ``loss_cls`` (BCE) and ``loss_dfl`` (DFL; with ``reg_max`` 1, YOLO26's L1 on image-normalised distances,
    which ultralytics reports as ``l1_loss`` under the same ``dfl`` gain).

    Args:
        num_classes (int): number of classes.
        reg_max (int): DFL bins (16; 1 for YOLO26): documentation only, the head's outputs say which (their
            box channels are 4 x reg_max), as ultralytics reads it from the Detect layer; so does the class count.
        box (float), cls (float), dfl (float): ultralytics' gains (cfg/default.yaml: 7.5, 0.5, 1.5).
        topk (int), topk2 (int), alpha (float), beta (float): the assigner's (10, None, 0.5, 6.0).
        strides (list): the head's strides (None: from the image and feature shapes).
        batch_scale (str): 'ref_batch' (the default, with a config's ``ref_batch: 64`` as ppmulti's ultralytics
            configs have it), 'effective' or 'batch' (see BATCH_SCALES above).
        ref_batch (int): the batch the lr is given for ('ref_batch' scaling), ultralytics' nbs 64.
        accumulate (int): batches per optimizer step ('effective' scaling); the builder sets it from the plan.
    """

    __shared__ = ["num_classes", "ref_batch"]

    def __init__(self, num_classes: int = 80, reg_max: int = 16, box: float = 7.5, cls: float = 0.5,
                 dfl: float = 1.5, topk: int = 10, topk2: int | None = None, alpha: float = 0.5, beta: float = 6.0,
                 strides: Sequence[float] | None = None, batch_scale: str = "ref_batch", ref_batch: int = 64,
                 accumulate: int = 1):
        super().__init__()
        if batch_scale not in BATCH_SCALES:
            raise ValueError(f"UltraDetectionLoss.batch_scale {batch_scale!r}: use one of {', '.join(BATCH_SCALES)}")
        if int(reg_max) < 1:
            raise ValueError(f"UltraDetectionLoss.reg_max {reg_max}: 16 (DFL) or 1 (YOLO26, no DFL)")
        self.num_classes = int(num_classes)
        self.reg_max = int(reg_max)
        self.gains = {"box": float(box), "cls": float(cls), "dfl": float(dfl)}
        self.topk, self.topk2, self.alpha, self.beta = int(topk), topk2, float(alpha), float(beta)
        self.strides = None if strides is None else [float(s) for s in strides]
        self.batch_scale = batch_scale
        self.ref_batch = int(ref_batch)
        self.accumulate = int(accumulate)

    # ------------------------------------------------------------------ helpers
    def _strides(self, feats: Sequence[paddle.Tensor], inputs: dict) -> list[float]:
        if self.strides is not None:
            if len(self.strides) != len(feats):
                raise ValueError(f"UltraDetectionLoss has {len(self.strides)} strides for {len(feats)} levels")
            return self.strides
        image = inputs.get("image")
        if image is None:
            raise ValueError("UltraDetectionLoss needs the head's strides or the batch's image to derive them")
        return [float(image.shape[2]) / float(f.shape[2]) for f in feats]

    def _assigner(self, strides: Sequence[float], nc: int) -> TaskAlignedAssigner:
        return TaskAlignedAssigner(self.topk, nc, self.alpha, self.beta, strides, topk2=self.topk2)

    @staticmethod
    def _decode(points: paddle.Tensor, pred_dist: paddle.Tensor, reg_max: int) -> paddle.Tensor:
        """[B, A, 4 x reg_max] -> boxes x1 y1 x2 y2 in grid units (the DFL expectation when reg_max > 1)."""
        if reg_max > 1:
            batch, anchors = pred_dist.shape[0], pred_dist.shape[1]
            probs = F.softmax(pred_dist.reshape([batch, anchors, 4, reg_max]), axis=-1)
            pred_dist = paddle.matmul(probs, paddle.arange(reg_max, dtype=probs.dtype))
        return dist2bbox(pred_dist, points)

    def _over_ranks(self, scores_sum: paddle.Tensor) -> paddle.Tensor:
        """The loss's normaliser, the assigned scores' sum, as the mean over the ranks in training (PP-YOLOE's
        rule): each rank divides its images' loss by the global batch's sum / world, so the averaged gradients
        are one process's on the whole batch. ultralytics divides by each rank's own sum, which weights a rank
        whose images hold few objects more. In evaluation (validation losses, per rank) and alone: its own."""
        world = paddle.distributed.get_world_size()
        if not self.training or world <= 1:
            return scores_sum
        scores_sum = scores_sum.detach().clone()   # the assigner's targets: no gradient flows through the sum
        paddle.distributed.all_reduce(scores_sum)
        return scores_sum / world

    def _multiplier(self, batch: int) -> float:
        if self.batch_scale == "batch":
            return float(batch)
        if self.batch_scale == "ref_batch":
            return float(self.ref_batch)
        return float(batch * max(1, paddle.distributed.get_world_size()) * max(1, self.accumulate))

    # ------------------------------------------------------------------ the loss
    def components(self, head_outputs: dict, inputs: dict) -> dict[str, paddle.Tensor]:
        """The gain-weighted box, cls and dfl terms (0-d tensors in the graph), before the batch scaling."""
        feats = head_outputs["feats"]
        pred_dist = head_outputs["boxes"].transpose([0, 2, 1])                         # [B, A, 4 x reg_max]
        pred_scores = head_outputs["scores"].transpose([0, 2, 1])                      # [B, A, nc]
        batch, nc = pred_scores.shape[0], pred_scores.shape[2]
        # the head's own reg_max and class count, as ultralytics reads them from its Detect layer
        reg_max = int(pred_dist.shape[2]) // 4
        if reg_max * 4 != int(pred_dist.shape[2]):
            raise ValueError(f"UltraDetectionLoss: the head's boxes have {pred_dist.shape[2]} channels, "
                             f"not 4 x reg_max")
        strides = self._strides(feats, inputs)
        shapes = [(int(f.shape[2]), int(f.shape[3])) for f in feats]
        points, stride_col = make_anchors(shapes, strides, 0.5, dtype=str(pred_scores.dtype).split(".")[-1])
        img_h, img_w = shapes[0][0] * strides[0], shapes[0][1] * strides[0]

        gt_labels, gt_bboxes, mask_gt = ultra_gt(inputs, batch)
        pred_bboxes = self._decode(points, pred_dist, reg_max)                         # grid units
        assigned = self._assigner(strides, nc)(F.sigmoid(pred_scores.detach()), pred_bboxes.detach() * stride_col,
                                           points * stride_col, gt_labels, gt_bboxes, mask_gt)
        target_scores = assigned.scores.astype(pred_scores.dtype)
        scores_sum = paddle.clip(self._over_ranks(target_scores.sum()), min=1.0)

        loss_cls = F.binary_cross_entropy_with_logits(pred_scores, target_scores, reduction="sum") / scores_sum

        fg = paddle.nonzero(assigned.fg)                                               # [K, 2]: b, a
        if fg.shape[0] == 0:
            zero = (pred_dist * 0).sum()   # keeps the box branch in the graph (DDP needs every gradient)
            loss_box, loss_dfl = zero, zero
        else:
            weight = paddle.gather_nd(target_scores, fg).sum(axis=-1, keepdim=True)      # [K, 1]
            target_boxes = assigned.boxes / stride_col                                   # grid units
            box_t = paddle.gather_nd(target_boxes, fg)
            iou = bbox_ciou_xyxy(paddle.gather_nd(pred_bboxes, fg), box_t).unsqueeze(-1)
            loss_box = ((1.0 - iou) * weight).sum() / scores_sum
            point_fg = paddle.gather(points, fg[:, 1])
            dist_fg = paddle.gather_nd(pred_dist, fg)
            if reg_max > 1:
                target = bbox2dist(point_fg, box_t, reg_max - 1)
                loss_dfl = (self._dfl(dist_fg.reshape([-1, reg_max]), target, reg_max) * weight).sum() / scores_sum
            else:
                stride_fg = paddle.gather(stride_col, fg[:, 1])
                scale = paddle.to_tensor([img_w, img_h, img_w, img_h], dtype=pred_dist.dtype)
                target = bbox2dist(point_fg, box_t) * stride_fg / scale
                pred = dist_fg * stride_fg / scale
                loss_dfl = (F.l1_loss(pred, target, reduction="none").mean(axis=-1, keepdim=True)
                            * weight).sum() / scores_sum
        return {"loss_box": loss_box * self.gains["box"], "loss_cls": loss_cls * self.gains["cls"],
                "loss_dfl": loss_dfl * self.gains["dfl"]}

    @staticmethod
    def _dfl(logits: paddle.Tensor, target: paddle.Tensor, reg_max: int) -> paddle.Tensor:
        """Distribution focal loss (Li et al. 2020) of logits [K x 4, reg_max] for distances [K, 4] -> [K, 1]:
        cross-entropy against the two bins around each distance, weighted by nearness."""
        target = target.clip(0, reg_max - 1 - 0.01)
        left = paddle.floor(target).astype("int64")
        w_left = (left + 1).astype(target.dtype) - target
        w_right = 1 - w_left
        logp = F.log_softmax(logits, axis=1)
        left_flat = left.reshape([-1, 1])
        lp = paddle.take_along_axis(logp, left_flat, axis=1).reshape(left.shape)
        rp = paddle.take_along_axis(logp, left_flat + 1, axis=1).reshape(left.shape)
        return -(lp * w_left + rp * w_right).mean(axis=-1, keepdim=True)

    def forward(self, head_outputs: Any, inputs: dict) -> dict[str, paddle.Tensor]:
        if isinstance(head_outputs, (tuple, list)) and len(head_outputs) == 2 and isinstance(head_outputs[1], dict):
            head_outputs = head_outputs[1]   # an eval-mode (inference, raw) pair, as ultralytics accepts
        if "one2many" in head_outputs:
            raise ValueError("UltraDetectionLoss got an end-to-end head's outputs (one2many/one2one): "
                             "use UltraE2ELoss for YOLO26")
        parts = self.components(head_outputs, inputs)
        batch = head_outputs["scores"].shape[0]
        total = (parts["loss_box"] + parts["loss_cls"] + parts["loss_dfl"]) * self._multiplier(batch)
        out = {"loss": total}
        out.update({k: v.detach() for k, v in parts.items()})
        return out


@register_once
@serializable
class UltraE2ELoss(nn.Layer):
    """Ultralytics 8.4's ``E2ELoss``, YOLO26's: the one-to-many branch's loss (topk 10) plus the one-to-one
    branch's (topk 7, then 1 per gt), weighted ``o2m`` and ``1 - o2m``, ``o2m`` falling linearly from 0.8 at the
    first epoch to 0.1 at the last (``e2e_weights``; the epoch is the batch's ``epoch_id``, which ppmulti's
    trainer sets, so a resumed run picks up the schedule where it stopped).

    ``head_outputs`` is ``{"one2many": {...}, "one2one": {...}}`` as ultralytics' end-to-end Detect head
    returns it in training. The logged components are the one-to-one branch's (what ultralytics logs); ``loss``
    is the weighted sum, scaled as ``batch_scale`` says.

    Args: as UltraDetectionLoss (``reg_max`` 1 for YOLO26), and
        epoch (int): the run's epochs (the config's ``epoch``), the schedule's length.
        o2m (float), final_o2m (float): the one-to-many weight at the first and the last epoch.
        topk_o2o (int), topk2_o2o (int): the one-to-one branch's assigner (7, 1).
    """

    __shared__ = ["num_classes", "ref_batch", "epoch"]

    def __init__(self, num_classes: int = 80, reg_max: int = 1, box: float = 7.5, cls: float = 0.5,
                 dfl: float = 1.5, topk: int = 10, topk_o2o: int = 7, topk2_o2o: int = 1, alpha: float = 0.5,
                 beta: float = 6.0, strides: Sequence[float] | None = None, batch_scale: str = "ref_batch",
                 ref_batch: int = 64, accumulate: int = 1, epoch: int = 100, o2m: float = 0.8,
                 final_o2m: float = 0.1):
        super().__init__()
        common = dict(num_classes=num_classes, reg_max=reg_max, box=box, cls=cls, dfl=dfl, alpha=alpha, beta=beta,
                      strides=strides, batch_scale=batch_scale, ref_batch=ref_batch, accumulate=accumulate)
        self.one2many = UltraDetectionLoss(topk=topk, **common)
        self.one2one = UltraDetectionLoss(topk=topk_o2o, topk2=topk2_o2o, **common)
        self.epochs = int(epoch)
        self.o2m_start = float(o2m)
        self.final_o2m = float(final_o2m)
        self.epoch = 0   # overridden by the batch's epoch_id when present

    @property
    def accumulate(self) -> int:
        return self.one2many.accumulate

    @accumulate.setter
    def accumulate(self, value: int) -> None:
        self.one2many.accumulate = self.one2one.accumulate = int(value)

    @property
    def strides(self):
        return self.one2many.strides

    @strides.setter
    def strides(self, value) -> None:
        value = None if value is None else [float(s) for s in value]
        self.one2many.strides = self.one2one.strides = value

    def weights(self, epoch: int | None = None) -> tuple[float, float]:
        return e2e_weights(self.epoch if epoch is None else epoch, self.epochs, self.o2m_start, self.final_o2m)

    def forward(self, head_outputs: Any, inputs: dict) -> dict[str, paddle.Tensor]:
        if isinstance(head_outputs, (tuple, list)) and len(head_outputs) == 2 and isinstance(head_outputs[1], dict):
            head_outputs = head_outputs[1]
        if not isinstance(head_outputs, dict) or "one2many" not in head_outputs or "one2one" not in head_outputs:
            raise ValueError("UltraE2ELoss needs an end-to-end head's outputs {'one2many': ..., 'one2one': ...}; "
                             "use UltraDetectionLoss for YOLOv8/YOLO11")
        epoch_id = inputs.get("epoch_id")
        if epoch_id is not None:
            self.epoch = int(epoch_id)
        w_o2m, w_o2o = self.weights()
        many = self.one2many.components(head_outputs["one2many"], inputs)
        one = self.one2one.components(head_outputs["one2one"], inputs)
        batch = head_outputs["one2one"]["scores"].shape[0]
        mult = self.one2one._multiplier(batch)
        total = (sum(many.values()) * w_o2m + sum(one.values()) * w_o2o) * mult
        out = {"loss": total}
        out.update({k: v.detach() for k, v in one.items()})
        return out
