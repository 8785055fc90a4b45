"""Ultralytics 8.4's anchor-free geometry and task-aligned assigner (TOOD) for YOLOv8/YOLO11/YOLO26, in Paddle."""

from __future__ import annotations

import math
from typing import Sequence

import paddle
import paddle.nn.functional as F

__all__ = ["make_anchors", "dist2bbox", "bbox2dist", "bbox_ciou_xyxy", "Assignment", "TaskAlignedAssigner"]


def make_anchors(shapes: Sequence[tuple[int, int]], strides: Sequence[float], offset: float = 0.5,
                 dtype: str = "float32") -> tuple[paddle.Tensor, paddle.Tensor]:
    """Cell centres of every level in grid units, row-major per level, levels in order: ``points`` [A, 2] (x, y)
    and each point's stride [A, 1] (``A`` = sum of h x w)."""
    points, stride_col = [], []
    for (height, width), stride in zip(shapes, strides):
        xs = paddle.arange(width, dtype=dtype) + offset
        ys = paddle.arange(height, dtype=dtype) + offset
        grid_y, grid_x = paddle.meshgrid(ys, xs)
        points.append(paddle.stack([grid_x, grid_y], axis=-1).reshape([-1, 2]))
        stride_col.append(paddle.full([height * width, 1], float(stride), dtype=dtype))
    return paddle.concat(points), paddle.concat(stride_col)


def dist2bbox(dist: paddle.Tensor, points: paddle.Tensor) -> paddle.Tensor:
    """Distances (left, top, right, bottom) from ``points`` [..., 2] to boxes x1, y1, x2, y2 [..., 4]."""
    lt, rb = paddle.split(dist, 2, axis=-1)
    return paddle.concat([points - lt, points + rb], axis=-1)


def bbox2dist(points: paddle.Tensor, boxes: paddle.Tensor, reg_max: float | None = None) -> paddle.Tensor:
    """Boxes x1, y1, x2, y2 to distances (l, t, r, b) from ``points``; with ``reg_max`` clipped to
    [0, reg_max - 0.01] so the right-hand DFL bin stays inside the distribution."""
    x1y1, x2y2 = paddle.split(boxes, 2, axis=-1)
    dist = paddle.concat([points - x1y1, x2y2 - points], axis=-1)
    if reg_max is not None:
        dist = dist.clip(0, reg_max - 0.01)
    return dist


def bbox_ciou_xyxy(box1: paddle.Tensor, box2: paddle.Tensor, eps: float = 1e-7) -> paddle.Tensor:
    """Complete IoU of corner-form boxes [..., 4] -> [...], with ultralytics' conventions: ``eps`` is added to
    both heights (not widths) and to the union and the enclosing diagonal, and the aspect weight alpha is a
    constant (no gradient)."""
    ax1, ay1, ax2, ay2 = paddle.unbind(box1, axis=-1)
    bx1, by1, bx2, by2 = paddle.unbind(box2, axis=-1)
    w1, h1 = ax2 - ax1, ay2 - ay1 + eps
    w2, h2 = bx2 - bx1, by2 - by1 + eps
    inter = ((paddle.minimum(ax2, bx2) - paddle.maximum(ax1, bx1)).clip(min=0) *
             (paddle.minimum(ay2, by2) - paddle.maximum(ay1, by1)).clip(min=0))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = paddle.maximum(ax2, bx2) - paddle.minimum(ax1, bx1)
    ch = paddle.maximum(ay2, by2) - paddle.minimum(ay1, by1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((bx1 + bx2 - ax1 - ax2) ** 2 + (by1 + by2 - ay1 - ay2) ** 2) / 4
    v = (4 / math.pi ** 2) * (paddle.atan(w2 / h2) - paddle.atan(w1 / h1)) ** 2
    alpha = (v / (1 - iou + v + eps)).detach()
    return iou - (rho2 / c2 + v * alpha)


class Assignment:
    """What the assigner gives each anchor of each image: ``labels`` [B, A] (int64), ``boxes`` [B, A, 4] (the
    assigned gt, pixels), ``scores`` [B, A, nc] (one-hot scaled by the normalised alignment: the class
    targets), ``fg`` [B, A] (bool) and ``gt_index`` [B, A] (int64)."""

    def __init__(self, labels, boxes, scores, fg, gt_index):
        self.labels, self.boxes, self.scores, self.fg, self.gt_index = labels, boxes, scores, fg, gt_index


class TaskAlignedAssigner:
    """Ultralytics 8.4's task-aligned assignment (no parameters, no gradient).

    For each gt the candidates are the anchor centres strictly inside it (a side shorter than ``stride_val``,
    the second level's stride, is widened to it about its centre first); their alignment is
    ``score^alpha x CIoU^beta`` (score: the predicted probability of the gt's class; CIoU clipped at 0); the
    ``topk`` best candidates are positives. An anchor positive for several gts keeps the one it overlaps
    most; with ``topk2`` < ``topk`` (YOLO26's one-to-one branch: 7 then 1) each gt then keeps only its
    ``topk2`` best positives. The class target of a positive is ``align x (gt's best CIoU / gt's best
    align)``, maximised over the gts.

    Args:
        topk (int): positives per gt (10 in ultralytics' one-to-many loss).
        num_classes (int): number of classes.
        alpha (float): exponent of the class score (0.5).
        beta (float): exponent of the CIoU (6.0).
        strides (list): the levels' strides (the widening floor is the second one).
        eps (float): guard against a division by zero.
        topk2 (int): second selection after the conflicts are resolved (None: ``topk``).
    """

    def __init__(self, topk: int = 10, num_classes: int = 80, alpha: float = 0.5, beta: float = 6.0,
                 strides: Sequence[float] = (8, 16, 32), eps: float = 1e-9, topk2: int | None = None):
        self.topk = int(topk)
        self.topk2 = int(topk2 or topk)
        self.num_classes = int(num_classes)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.strides = [float(s) for s in strides]
        self.stride_val = self.strides[1] if len(self.strides) > 1 else self.strides[0]
        self.eps = float(eps)

    @paddle.no_grad()
    def __call__(self, pd_scores: paddle.Tensor, pd_bboxes: paddle.Tensor, anc_points: paddle.Tensor,
                 gt_labels: paddle.Tensor, gt_bboxes: paddle.Tensor, mask_gt: paddle.Tensor) -> Assignment:
        """Assign ``gt_bboxes`` [B, M, 4] (pixels, x1 y1 x2 y2; ``mask_gt`` [B, M, 1] marks the real ones,
        ``gt_labels`` [B, M, 1]) to the anchors ``anc_points`` [A, 2] (pixels), given the predicted class
        probabilities ``pd_scores`` [B, A, nc] and boxes ``pd_bboxes`` [B, A, 4] (pixels)."""
        batch, anchors = pd_scores.shape[0], pd_scores.shape[1]
        n_max = gt_bboxes.shape[1]
        if n_max == 0:
            return Assignment(paddle.full([batch, anchors], self.num_classes, dtype="int64"),
                              paddle.zeros_like(pd_bboxes), paddle.zeros_like(pd_scores),
                              paddle.zeros([batch, anchors], dtype="bool"),
                              paddle.zeros([batch, anchors], dtype="int64"))
        gt_labels = gt_labels.reshape([batch, n_max]).astype("int64")
        mask_gt = mask_gt.reshape([batch, n_max, 1]).astype(pd_scores.dtype)

        in_gts = self._candidates_in_gts(anc_points, gt_bboxes, mask_gt)             # [B, M, A] float 0/1
        align, overlaps = self._box_metrics(pd_scores, pd_bboxes, gt_labels, gt_bboxes, in_gts * mask_gt)
        mask_pos = self._topk_mask(align) * in_gts * mask_gt                          # [B, M, A]

        gt_index, fg, mask_pos = self._resolve(mask_pos, overlaps, align, n_max)
        labels, boxes, scores = self._targets(gt_labels, gt_bboxes, gt_index, fg)

        align = align * mask_pos
        overlaps = overlaps * mask_pos
        best_align = align.max(axis=-1, keepdim=True)                                 # [B, M, 1]
        best_overlap = overlaps.max(axis=-1, keepdim=True)
        norm = (align * best_overlap / (best_align + self.eps)).max(axis=-2)           # [B, A]
        scores = scores * norm.unsqueeze(-1)
        return Assignment(labels, boxes, scores, fg > 0, gt_index)

    def _candidates_in_gts(self, points: paddle.Tensor, gt_bboxes: paddle.Tensor, mask_gt: paddle.Tensor,
                           eps: float = 1e-9) -> paddle.Tensor:
        """[B, M, A]: 1 where the anchor centre lies strictly inside the (widened) gt box."""
        x1, y1, x2, y2 = paddle.unbind(gt_bboxes, axis=-1)
        cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
        valid = mask_gt[..., 0] > 0
        floor = paddle.full_like(w, self.stride_val)
        # tiny boxes grow to one stride so that every gt has a few candidates
        w = paddle.where(valid & (w < self.stride_val), floor, w)
        h = paddle.where(valid & (h < self.stride_val), floor, h)
        lt_x, lt_y = (cx - w / 2).unsqueeze(-1), (cy - h / 2).unsqueeze(-1)
        rb_x, rb_y = (cx + w / 2).unsqueeze(-1), (cy + h / 2).unsqueeze(-1)
        px, py = points[:, 0], points[:, 1]
        inside = (px - lt_x > eps) & (py - lt_y > eps) & (rb_x - px > eps) & (rb_y - py > eps)
        return inside.astype(gt_bboxes.dtype)

    def _box_metrics(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask):
        """Alignment and CIoU [B, M, A] of each candidate (zero elsewhere), computed on the candidates only."""
        shape = [pd_scores.shape[0], gt_bboxes.shape[1], pd_scores.shape[1]]
        align = paddle.zeros(shape, dtype=pd_scores.dtype)
        overlaps = paddle.zeros(shape, dtype=pd_bboxes.dtype)
        idx = paddle.nonzero(mask > 0)                                                 # [K, 3]: b, m, a
        if idx.shape[0] == 0:
            return align, overlaps
        b, m, a = idx[:, 0], idx[:, 1], idx[:, 2]
        labels = paddle.gather_nd(gt_labels, paddle.stack([b, m], axis=1))
        score = paddle.gather_nd(pd_scores, paddle.stack([b, a, labels], axis=1))
        gt = paddle.gather_nd(gt_bboxes, paddle.stack([b, m], axis=1))
        pd = paddle.gather_nd(pd_bboxes, paddle.stack([b, a], axis=1))
        iou = bbox_ciou_xyxy(gt, pd).clip(min=0)
        value = score.pow(self.alpha) * iou.pow(self.beta)
        return paddle.scatter_nd_add(align, idx, value), paddle.scatter_nd_add(overlaps, idx, iou)

    def _topk_mask(self, align: paddle.Tensor) -> paddle.Tensor:
        """[B, M, A]: 1 on each gt's ``topk`` largest alignments (padded gts are zeroed by the caller)."""
        k = min(self.topk, align.shape[-1])
        _, index = paddle.topk(align, k, axis=-1, largest=True)
        return paddle.put_along_axis(paddle.zeros_like(align), index, paddle.ones(index.shape, align.dtype), axis=-1)

    def _resolve(self, mask_pos, overlaps, align, n_max):
        """An anchor claimed by several gts keeps the gt it overlaps most; then ``topk2``; returns each anchor's
        gt index [B, A], its foreground flag [B, A] and the final mask [B, M, A]."""
        claims = mask_pos.sum(axis=-2)                                                # [B, A]
        best = paddle.argmax(overlaps, axis=1)                                        # [B, A], first on ties
        is_best = F.one_hot(best, n_max).transpose([0, 2, 1]).astype(mask_pos.dtype)  # [B, M, A]
        mask_pos = paddle.where((claims > 1).unsqueeze(1).expand_as(mask_pos), is_best, mask_pos)
        if self.topk2 != self.topk:
            k = min(self.topk2, align.shape[-1])
            _, index = paddle.topk(align * mask_pos, k, axis=-1, largest=True)
            keep = paddle.put_along_axis(paddle.zeros_like(mask_pos), index,
                                         paddle.ones(index.shape, mask_pos.dtype), axis=-1)
            mask_pos = mask_pos * keep
        fg = mask_pos.max(axis=-2)
        gt_index = paddle.argmax(mask_pos, axis=-2)                                   # 0 for background
        return gt_index, fg, mask_pos

    def _targets(self, gt_labels, gt_bboxes, gt_index, fg):
        batch, n_max = gt_labels.shape
        flat = gt_index + paddle.arange(batch, dtype="int64").unsqueeze(-1) * n_max    # [B, A]
        labels = paddle.gather(gt_labels.reshape([-1]), flat.reshape([-1])).reshape(flat.shape)
        boxes = paddle.gather(gt_bboxes.reshape([-1, 4]), flat.reshape([-1])).reshape([batch, -1, 4])
        labels = labels.clip(min=0)
        scores = F.one_hot(labels, self.num_classes) * (fg > 0).astype(gt_bboxes.dtype).unsqueeze(-1)
        return labels, boxes, scores
