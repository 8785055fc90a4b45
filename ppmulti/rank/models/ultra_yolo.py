"""UltraYOLO: ppdet's architecture for YOLOv8 / YOLO11 / YOLO26, built from an ultralytics-form model description.

Training calls the injected loss as ``loss(head_outputs, inputs)``: ``head_outputs`` is what ultralytics 8.4's
Detect returns in training mode (see ultra_head.py), ``inputs`` the reader's batch dict (``image``, ``gt_bbox``
x1y1x2y2 in input pixels, ``gt_class``, ``pad_gt_mask``); the loss returns a dict with ``loss`` and its parts.
Evaluation decodes the boxes and returns ppdet's ``bbox`` [N, 6] (class, score, x1, y1, x2, y2 in original-image
pixels) and ``bbox_num`` [B]: through the injected NMS for YOLOv8/11 (and YOLO26 with ``end2end: false``), or
YOLO26's one-to-one top-k without NMS.
"""

from __future__ import annotations

import logging

import paddle
from ppdet.core.workspace import serializable
from ppdet.modeling.architectures.meta_arch import BaseArch

from ppmulti.rank.models.ultra_model import build_layers, load_spec, model_summary, run_layers
from ppmulti.rank.models.yolov5 import register_once

__all__ = ["UltraYOLO"]

log = logging.getLogger("ppmulti")


@register_once
@serializable
class UltraYOLO(BaseArch):
    """YOLOv8 / YOLO11 / YOLO26 detection.

    Args:
        model (str): model description: a shipped name (``yolo11n.yaml``, ``yolov8s``, ``yolo26m``) or the path of
            an ultralytics-form model yaml; the scale is read from the file name as ultralytics does.
        num_classes (int): classes; overrides the description's ``nc``.
        loss (object): the training loss (``UltraDetectionLoss``; ``UltraE2ELoss`` for YOLO26).
        nms (object): ppdet's ``MultiClassNMS``; its score_threshold and keep_top_k also bound YOLO26's top-k.
        end2end (bool): YOLO26 only: true reads the one-to-one branch by top-k without NMS; false reads the
            one-to-many branch through the NMS (ultralytics' ``nms=False`` / default); ``None`` keeps the model's.
        exclude_nms (bool): return decoded boxes (original pixels) and scores [B, C, N] without NMS.
        exclude_post_process (bool): return [B, N, 4 + C] (x1, y1, x2, y2 in input pixels, scores) for export.
    """

    __category__ = "architecture"
    __shared__ = ["num_classes", "exclude_nms", "exclude_post_process"]
    __inject__ = ["loss", "nms"]

    def __init__(self, model: str = "yolo11n.yaml", num_classes: int = 80, loss="UltraDetectionLoss",
                 nms="MultiClassNMS", end2end: bool | None = None, exclude_nms: bool = False,
                 exclude_post_process: bool = False, data_format: str = "NCHW", verbose: bool = True):
        super().__init__(data_format=data_format)
        self.spec = load_spec(model, num_classes)
        self.model, self.save, self.froms, self.strides = build_layers(self.spec)
        self.loss = loss
        self.nms = nms
        self.exclude_nms = exclude_nms
        self.exclude_post_process = exclude_post_process
        if end2end is not None:
            self.head.end2end = end2end
        if verbose:
            log.info(model_summary(self, self.spec.name)[0])

    @property
    def head(self):
        return self.model[-1]

    @property
    def num_classes(self) -> int:
        return self.head.nc

    def _net(self, image: paddle.Tensor):
        return run_layers(self.model, self.save, self.froms, image)

    def get_loss(self) -> dict:
        if self.loss is None or isinstance(self.loss, str):
            raise ValueError(f"UltraYOLO: no training loss built (loss: {self.loss!r}); "
                             f"name UltraDetectionLoss or UltraE2ELoss under UltraYOLO.loss")
        return self.loss(self._net(self.inputs["image"]), self.inputs)

    def get_pred(self) -> dict:
        y = self._net(self.inputs["image"])
        # a centred letterbox (tools/eval.py --rect) hands its margin and the images' sizes too
        bbox, bbox_num = self.post_process(y, self.inputs["scale_factor"], self.inputs.get("pad_offset"),
                                           self.inputs.get("orig_shape"))
        return {"bbox": bbox, "bbox_num": bbox_num}

    def _limits(self) -> tuple[float, int]:
        conf = float(getattr(self.nms, "score_threshold", 0.001))
        max_det = int(getattr(self.nms, "keep_top_k", 300))
        return conf, max_det

    @staticmethod
    def _xyxy_rows(hw: paddle.Tensor) -> paddle.Tensor:
        """[B, 2] (h, w) pairs as [B, 1, 4] (w, h, w, h) rows, to meet x1, y1, x2, y2 boxes."""
        h, w = paddle.split(hw, 2, axis=-1)
        return paddle.concat([w, h, w, h], axis=-1).reshape([-1, 1, 4])

    def _to_image(self, boxes: paddle.Tensor, scale: paddle.Tensor, offset, orig) -> paddle.Tensor:
        """Boxes [B, N, 4] in the input's pixels -> the original image's: the letterbox margin (``offset`` [B, 2]
        top, left; None: none) taken off, divided by the gain, and, with ``orig`` [B, 2] (h, w), clipped to the
        image as ultralytics' val does."""
        if offset is not None:
            boxes = boxes - self._xyxy_rows(offset.astype(boxes.dtype))
        boxes = boxes / scale
        if orig is not None:
            boxes = paddle.minimum(paddle.maximum(boxes, paddle.zeros_like(boxes)),
                                   self._xyxy_rows(orig.astype(boxes.dtype)))
        return boxes

    def post_process(self, y: paddle.Tensor, scale_factor: paddle.Tensor, pad_offset=None, orig_shape=None):
        """The head's eval output -> (bbox [N, 6], bbox_num [B]) in original-image pixels; ``pad_offset`` and
        ``orig_shape`` ([B, 2] each) when the input was letterboxed centred (RectLetterbox)."""
        scale_y, scale_x = paddle.split(scale_factor, 2, axis=-1)
        scale = paddle.concat([scale_x, scale_y, scale_x, scale_y], axis=-1).reshape([-1, 1, 4])
        if self.head.end2end:
            return self._topk_boxes(y, scale, pad_offset, orig_shape)
        boxes = y[:, :4].transpose([0, 2, 1])                          # [B, N, 4]
        if not self.head.xyxy:
            boxes = paddle.concat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1)
        scores = y[:, 4:]                                              # [B, C, N]
        if self.exclude_post_process:
            return paddle.concat([boxes, scores.transpose([0, 2, 1])], axis=-1), None
        boxes = self._to_image(boxes, scale, pad_offset, None)   # clipped after NMS, as ultralytics' val does
        if self.exclude_nms:
            return boxes, scores
        bbox, bbox_num, _ = self.nms(boxes, scores)
        return self._clip_rows(bbox, bbox_num, orig_shape), bbox_num

    def _clip_rows(self, bbox: paddle.Tensor, bbox_num: paddle.Tensor, orig) -> paddle.Tensor:
        """NMS's rows [N, 6] (class, score, x1, y1, x2, y2) with their boxes clipped to their image's ``orig``
        [B, 2] (h, w); as they are without ``orig`` or when they are ppdet's one dummy row of no detection."""
        if orig is None or bbox.shape[0] != int(bbox_num.sum()):
            return bbox
        limits = paddle.repeat_interleave(self._xyxy_rows(orig.astype(bbox.dtype)).reshape([-1, 4]),
                                          bbox_num.astype("int64"), axis=0)
        boxes = paddle.minimum(paddle.maximum(bbox[:, 2:], paddle.zeros_like(bbox[:, 2:])), limits)
        return paddle.concat([bbox[:, :2], boxes], axis=-1)

    def _topk_boxes(self, y: paddle.Tensor, scale: paddle.Tensor, pad_offset=None, orig_shape=None):
        """YOLO26: the head's top-k rows [B, k, 6] kept above the confidence, as ppdet's rows."""
        conf, max_det = self._limits()
        y = y[:, :max_det]
        if self.exclude_post_process:
            return y, None
        boxes = self._to_image(y[..., :4], scale, pad_offset, orig_shape)
        rows = paddle.concat([y[..., 5:6], y[..., 4:5], boxes], axis=-1)   # class, score, x1, y1, x2, y2
        keep = y[..., 4] > conf                                           # [B, k]
        bbox_num = keep.astype("int32").sum(axis=1)
        bbox = paddle.masked_select(rows, keep.unsqueeze(-1).expand(rows.shape)).reshape([-1, 6])
        if bbox.shape[0] == 0:   # ppdet's metrics expect at least one row (MultiClassNMS gives a dummy too)
            bbox = paddle.to_tensor([[-1.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype=rows.dtype)
        return bbox, bbox_num
