"""ultralytics' Detect head in Paddle: anchor-free boxes (DFL) and classes per level, YOLO26's one-to-one branch.

Training-mode output (what the ultralytics losses read), exactly as ultralytics 8.4's Detect returns it:
- YOLOv8 / YOLO11: ``{"boxes": [B, 4*reg_max, N], "scores": [B, nc, N], "feats": [P3, P4, P5]}``
  (raw logits; N = sum of H*W over the levels, level by level, row-major);
- YOLO26 (end-to-end): ``{"one2many": {...as above...}, "one2one": {...as above...}}``, the one-to-one branch
  computed on detached features.
Eval-mode output: the decoded ``[B, 4 + nc, N]`` (boxes in input pixels: xywh, or xyxy with ``xyxy``; sigmoid
scores) for an NMS, or, when the end-to-end branch is selected, ``[B, max_det, 6]`` (x1, y1, x2, y2, score, class)
picked by top-k without NMS.
"""

from __future__ import annotations

import math
from typing import Sequence

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ppmulti.rank.models.ultra_blocks import DFL, Conv, DWConv, plain_conv

__all__ = ["UltraDetect", "make_anchors", "dist2bbox"]


def make_anchors(shapes: Sequence[tuple[int, int]], strides: Sequence[float], offset: float = 0.5,
                 dtype: str = "float32") -> tuple[paddle.Tensor, paddle.Tensor]:
    """Cell centres in grid units [N, 2] (x, y) and the stride of each [N, 1], level by level."""
    points, stride_rows = [], []
    for (h, w), stride in zip(shapes, strides):
        sx = paddle.arange(w, dtype=dtype) + offset
        sy = paddle.arange(h, dtype=dtype) + offset
        gy, gx = paddle.meshgrid(sy, sx)
        points.append(paddle.stack([gx, gy], axis=-1).reshape([-1, 2]))
        stride_rows.append(paddle.full([h * w, 1], stride, dtype=dtype))
    return paddle.concat(points), paddle.concat(stride_rows)


def dist2bbox(distance: paddle.Tensor, anchors: paddle.Tensor, xywh: bool = True, axis: int = -1) -> paddle.Tensor:
    """Distances (left, top, right, bottom) from anchor points -> boxes (xywh or xyxy)."""
    lt, rb = paddle.split(distance, 2, axis=axis)
    x1y1, x2y2 = anchors - lt, anchors + rb
    if xywh:
        return paddle.concat([(x1y1 + x2y2) / 2, x2y2 - x1y1], axis=axis)
    return paddle.concat([x1y1, x2y2], axis=axis)


class UltraDetect(nn.Layer):
    """ultralytics' Detect: per level a box branch (cv2) and a class branch (cv3), optionally their one-to-one twins.

    Args:
        nc: number of classes.
        reg_max: DFL bins per box side (16 for YOLOv8/11, 1 for YOLO26: direct distances).
        end2end: build YOLO26's one-to-one branches (``one2one_cv2`` / ``one2one_cv3``).
        ch: input channels per level.
        legacy: YOLOv8's class branch (two 3x3 Conv); otherwise YOLO11's (depth-wise 3x3 + 1x1, twice).
        strides: stride of each level.
    """

    def __init__(self, nc: int = 80, reg_max: int = 16, end2end: bool = False, ch: Sequence[int] = (),
                 legacy: bool = False, strides: Sequence[float] = (8.0, 16.0, 32.0)):
        super().__init__()
        self.nc = nc
        self.nl = len(ch)
        self.reg_max = reg_max
        self.no = nc + 4 * reg_max
        self.legacy = legacy
        self.stride = [float(s) for s in strides]
        self.max_det = 300
        self.xyxy = False
        self.keep_raw = False   # engine.val_loss sets it: an eval forward keeps its raw outputs in ``raw``
        self.raw = None
        self.cv2, self.cv3 = self._branches(ch, True, True)
        self.dfl = DFL(reg_max) if reg_max > 1 else nn.Identity()
        self._end2end = bool(end2end)
        if end2end:
            # each of ultralytics' two deep copies holds its own copy of the shared SiLU (one more layer each)
            self.one2one_cv2, self.one2one_cv3 = self._branches(ch, nn.Silu(), nn.Silu())
            # ultralytics deep-copies the one-to-many branches: both start from the same weights
            self.one2one_cv2.set_state_dict(self.cv2.state_dict())
            self.one2one_cv3.set_state_dict(self.cv3.state_dict())
        else:
            self.one2one_cv2 = self.one2one_cv3 = None
        self.bias_init()

    def _branches(self, ch: Sequence[int], box_act, cls_act) -> tuple[nn.LayerList, nn.LayerList]:
        c2 = max(16, ch[0] // 4, self.reg_max * 4)
        c3 = max(ch[0], min(self.nc, 100))
        a, b = box_act, cls_act
        box = nn.LayerList([nn.Sequential(Conv(x, c2, 3, act=a), Conv(c2, c2, 3, act=a),
                                          plain_conv(c2, 4 * self.reg_max)) for x in ch])
        if self.legacy:
            cls = nn.LayerList([nn.Sequential(Conv(x, c3, 3, act=b), Conv(c3, c3, 3, act=b), plain_conv(c3, self.nc))
                                for x in ch])
        else:
            cls = nn.LayerList([nn.Sequential(nn.Sequential(DWConv(x, x, 3, act=b), Conv(x, c3, 1, act=b)),
                                              nn.Sequential(DWConv(c3, c3, 3, act=b), Conv(c3, c3, 1, act=b)),
                                              plain_conv(c3, self.nc))
                                for x in ch])
        return box, cls

    @property
    def end2end(self) -> bool:
        """Whether inference reads the one-to-one branch (top-k, no NMS)."""
        return self.one2one_cv2 is not None and self._end2end

    @end2end.setter
    def end2end(self, value: bool) -> None:
        self._end2end = bool(value)

    def bias_init(self) -> None:
        """ultralytics' priors: box logits 2.0; class logits for ~5 objects per 640x640 image over nc classes."""
        pairs = [(self.cv2, self.cv3)]
        if self.one2one_cv2 is not None:
            pairs.append((self.one2one_cv2, self.one2one_cv3))
        for box_head, cls_head in pairs:
            for box, cls, stride in zip(box_head, cls_head, self.stride):
                box[-1].bias.set_value(paddle.full_like(box[-1].bias, 2.0))
                prior = math.log(5 / self.nc / (640 / stride) ** 2)
                cls[-1].bias.set_value(paddle.full_like(cls[-1].bias, prior))

    def forward_head(self, feats: Sequence[paddle.Tensor], box_head: nn.LayerList,
                     cls_head: nn.LayerList) -> dict:
        # 0: the batch as it comes (unknown in an exported graph with a dynamic batch)
        boxes = paddle.concat([box_head[i](feats[i]).reshape([0, 4 * self.reg_max, -1])
                               for i in range(self.nl)], axis=-1)
        scores = paddle.concat([cls_head[i](feats[i]).reshape([0, self.nc, -1]) for i in range(self.nl)], axis=-1)
        return {"boxes": boxes, "scores": scores, "feats": list(feats)}

    def forward(self, feats: Sequence[paddle.Tensor]):
        preds = self.forward_head(feats, self.cv2, self.cv3)
        if self.one2one_cv2 is not None:
            detached = [f.detach() for f in feats] if self.training else feats
            preds = {"one2many": preds, "one2one": self.forward_head(detached, self.one2one_cv2, self.one2one_cv3)}
        if self.training:
            return preds
        if self.keep_raw:   # the validation loss reads them, as ultralytics' eval returns them beside its y
            self.raw = preds
        branch = preds if self.one2one_cv2 is None else preds["one2one" if self.end2end else "one2many"]
        y = self.inference(branch)
        if self.end2end:
            y = self.topk(y.transpose([0, 2, 1]))
        return y

    def inference(self, branch: dict) -> paddle.Tensor:
        """[B, 4 + nc, N]: decoded boxes in input pixels, sigmoid class scores."""
        shapes = [tuple(f.shape[2:]) for f in branch["feats"]]
        anchors, strides = make_anchors(shapes, self.stride, 0.5, dtype=branch["boxes"].dtype)
        dist = self.dfl(branch["boxes"])
        xywh = not self.end2end and not self.xyxy
        boxes = dist2bbox(dist, anchors.transpose([1, 0]).unsqueeze(0), xywh=xywh, axis=1) * strides.transpose([1, 0])
        return paddle.concat([boxes, F.sigmoid(branch["scores"])], axis=1)

    def topk(self, preds: paddle.Tensor) -> paddle.Tensor:
        """YOLO26's selection: the max_det anchors with the best class score, then the best (anchor, class) pairs
        among them; [B, k, 6] = x1, y1, x2, y2, score, class."""
        boxes, scores = preds[..., :4], preds[..., 4:4 + self.nc]
        k = min(self.max_det, scores.shape[1])
        _, anchor_idx = paddle.topk(scores.max(axis=-1), k, axis=1)                      # [B, k]
        scores = paddle.take_along_axis(scores, anchor_idx.unsqueeze(-1).expand([-1, -1, self.nc]), axis=1)
        best, flat = paddle.topk(scores.flatten(1), k, axis=1)                             # [B, k]
        labels = (flat % self.nc).astype(preds.dtype)
        picked = paddle.take_along_axis(anchor_idx, flat // self.nc, axis=1)
        boxes = paddle.take_along_axis(boxes, picked.unsqueeze(-1).expand([-1, -1, 4]), axis=1)
        return paddle.concat([boxes, best.unsqueeze(-1), labels.unsqueeze(-1)], axis=-1)
