"""YOLOv5's Detect head for ppdet: per-level 1x1 convs, anchor decoding, and ppdet's NMS contract."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle import ParamAttr
from paddle.regularizer import L2Decay
from ppdet.modeling.initializer import conv_init_

from ppmulti.rank.models.yolov5 import register_once

__all__ = ["YOLOv5Head", "YOLOV5_ANCHORS"]

# YOLOv5's COCO anchors (w, h in pixels) for P3/8, P4/16, P5/32.
YOLOV5_ANCHORS = [[[10, 13], [16, 30], [33, 23]],
                  [[30, 61], [62, 45], [59, 119]],
                  [[116, 90], [156, 198], [373, 326]]]


@register_once
class YOLOv5Head(nn.Layer):
    """YOLOv5's Detect layer.

    Training returns the injected loss on the raw outputs; evaluation returns the raw
    outputs, and ``post_process`` decodes them (xy = (2 sigmoid - 0.5 + grid) * stride,
    wh = (2 sigmoid)^2 * anchor, score = obj * cls), maps the boxes back to the original
    image with ``scale_factor`` and runs the injected NMS, as ppdet's PPYOLOEHead does.

    Args:
        in_channels (list): channels of each input level (taken from the neck).
        num_classes (int): number of classes.
        anchors (list): per level, a list of [w, h] anchors in input pixels.
        strides (list): stride of each level.
        loss (object): the training loss, ``YOLOv5Loss``.
        nms (object): ppdet's ``MultiClassNMS`` (or another NMS with the same call).
        objects_per_image (float): objectness bias prior, YOLOv5's 8 objects per 640x640 image.
        exclude_nms (bool): return decoded boxes and scores without NMS (benchmarks).
        exclude_post_process (bool): return decoded boxes in input pixels with the scores (export).
    """

    __shared__ = ["num_classes", "trt", "exclude_nms", "exclude_post_process"]
    __inject__ = ["loss", "nms"]

    def __init__(self, in_channels: Sequence[int] = (256, 512, 1024), num_classes: int = 80,
                 anchors: Sequence = YOLOV5_ANCHORS, strides: Sequence[int] = (8, 16, 32),
                 loss="YOLOv5Loss", nms="MultiClassNMS", objects_per_image: float = 8.0,
                 trt: bool = False, exclude_nms: bool = False, exclude_post_process: bool = False):
        super().__init__()
        if len(anchors) != len(strides) or len(in_channels) != len(strides):
            raise ValueError(f"YOLOv5Head: {len(in_channels)} input levels, {len(anchors)} anchor "
                             f"levels and {len(strides)} strides must agree")
        self.num_classes = num_classes
        self.num_outputs = num_classes + 5
        self.anchors = [np.asarray(a, dtype=np.float32).reshape(-1, 2) for a in anchors]
        self.num_anchors = len(self.anchors[0])
        self.strides = [float(s) for s in strides]
        self.loss = loss
        self.nms = nms
        if trt and hasattr(nms, "trt"):
            self.nms.trt = trt
        self.exclude_nms = exclude_nms
        self.exclude_post_process = exclude_post_process
        # Biases are not weight-decayed in YOLOv5 (its third parameter group).
        self.convs = nn.LayerList([
            nn.Conv2D(c, self.num_anchors * self.num_outputs, 1,
                      bias_attr=ParamAttr(regularizer=L2Decay(0.0)))
            for c in in_channels])
        self._init_biases(objects_per_image)

    @classmethod
    def from_config(cls, cfg, input_shape):
        return {"in_channels": [i.channels for i in input_shape]}

    def _init_biases(self, objects_per_image: float) -> None:
        """YOLOv5's priors: objectness ~objects_per_image per 640x640 image, classes 0.6/(nc - 0.99)."""
        for conv, stride in zip(self.convs, self.strides):
            conv_init_(conv)  # PyTorch's default init, which YOLOv5 keeps for the Detect convs
            bias = conv.bias.numpy().reshape(self.num_anchors, self.num_outputs)
            bias[:, 4] += math.log(objects_per_image / (640 / stride) ** 2)
            bias[:, 5:] += math.log(0.6 / (self.num_classes - 0.99))
            conv.bias.set_value(bias.reshape(-1).astype("float32"))

    def forward(self, feats: Sequence[paddle.Tensor], targets: dict | None = None):
        """Raw outputs per level ([B, na*(5+nc), H, W]); in training, the loss dict instead."""
        if len(feats) != len(self.convs):
            raise ValueError(f"YOLOv5Head expects {len(self.convs)} feature levels, got {len(feats)}")
        outs = [conv(feat) for conv, feat in zip(self.convs, feats)]
        if self.training:
            return self.loss(outs, targets, self.anchors, self.strides)
        return outs

    def decode(self, head_outs: Sequence[paddle.Tensor]) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Boxes [B, N, 4] (x1, y1, x2, y2, input pixels) and scores [B, N, nc] = obj * cls."""
        na, no = self.num_anchors, self.num_outputs
        boxes, scores = [], []
        for out, anchor, stride in zip(head_outs, self.anchors, self.strides):
            height, width = out.shape[2], out.shape[3]
            pred = F.sigmoid(out.reshape([-1, na, no, height, width]).transpose([0, 1, 3, 4, 2]))
            gy, gx = paddle.meshgrid(paddle.arange(height, dtype=pred.dtype),
                                     paddle.arange(width, dtype=pred.dtype))
            grid = paddle.stack([gx, gy], axis=-1).reshape([1, 1, height, width, 2])
            anchor_grid = paddle.to_tensor(anchor, dtype=pred.dtype).reshape([1, na, 1, 1, 2])
            xy = (pred[..., 0:2] * 2 - 0.5 + grid) * stride
            wh = (pred[..., 2:4] * 2) ** 2 * anchor_grid
            boxes.append(paddle.concat([xy - wh / 2, xy + wh / 2], axis=-1).reshape([-1, na * height * width, 4]))
            scores.append((pred[..., 5:] * pred[..., 4:5]).reshape([-1, na * height * width, self.num_classes]))
        return paddle.concat(boxes, axis=1), paddle.concat(scores, axis=1)

    def post_process(self, head_outs: Sequence[paddle.Tensor], scale_factor: paddle.Tensor):
        """ppdet's contract: (bbox [N, 6] class, score, x1, y1, x2, y2 in original pixels, bbox_num [B], keep_idx)."""
        pred_bboxes, pred_scores = self.decode(head_outs)
        if self.exclude_post_process:
            return paddle.concat([pred_bboxes, pred_scores], axis=-1), None, None
        scale_y, scale_x = paddle.split(scale_factor, 2, axis=-1)
        scale = paddle.concat([scale_x, scale_y, scale_x, scale_y], axis=-1).reshape([-1, 1, 4])
        pred_bboxes = pred_bboxes / scale
        pred_scores = pred_scores.transpose([0, 2, 1])  # NMS takes [B, C, N]
        if self.exclude_nms:
            return pred_bboxes, pred_scores, None
        bbox_pred, bbox_num, keep_idx = self.nms(pred_bboxes, pred_scores)
        return bbox_pred, bbox_num, keep_idx
