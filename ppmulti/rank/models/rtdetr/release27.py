"""What PaddleDetection release/2.7 changed in modules and transforms that ppdet 2.6.0 already registers, as
subclasses that keep 2.6.0's behaviour for every 2.6 config and add 2.7's keys: ``DETR`` with a ``neck`` and
release/2.7's 4-argument post-process, ``ResNet(freeze_stem_only=...)``, ``DINOLoss(use_vfl=...)``,
``RandomDistort(prob=...)`` (then 2.7's colour operations) and ``RandomCrop(prob=...)``; and ``DETRPostProcess``,
2.7's new name for DETR's box decoding. ``rtdetr.release27_overrides`` puts them into ppdet's workspace under
the names the configs use."""

from __future__ import annotations

import inspect
import random

import numpy as np
import paddle
import paddle.nn.functional as F
from PIL import Image, ImageEnhance
from ppdet.core.workspace import create, serializable
from ppdet.data.transform import operators as ops
from ppdet.modeling.architectures.detr import DETR as DETR26
from ppdet.modeling.backbones.resnet import ResNet as ResNet26
from ppdet.modeling.losses.detr_loss import DINOLoss as DINOLoss26
from ppdet.modeling.transformers import bbox_cxcywh_to_xyxy, sigmoid_focal_loss

__all__ = ["DETR", "ResNet", "DINOLoss", "DETRPostProcess", "RandomDistort", "RandomCrop", "OVERRIDES",
           "TRANSFORM_OVERRIDES"]


class DETR(DETR26):
    """ppdet 2.6.0's DETR plus release/2.7's ``neck`` (RT-DETR's HybridEncoder, between backbone and transformer)
    and its post-processes that take the padded image shape and return a mask too. Without a neck, and with
    2.6.0's DETRBBoxPostProcess, it is 2.6.0's DETR."""

    __category__ = "architecture"
    __inject__ = ["post_process"]
    __shared__ = ["exclude_post_process"]

    def __init__(self, backbone, transformer, detr_head, neck=None, post_process="DETRBBoxPostProcess",
                 exclude_post_process=False):
        super().__init__(backbone, transformer, detr_head, post_process, exclude_post_process)
        self.neck = neck

    @classmethod
    def from_config(cls, cfg, *args, **kwargs):
        backbone = create(cfg["backbone"])
        shape = backbone.out_shape
        neck = create(cfg["neck"], input_shape=shape) if cfg.get("neck") else None
        if neck is not None:
            shape = neck.out_shape
        transformer = create(cfg["transformer"], input_shape=shape)
        detr_head = create(cfg["detr_head"], hidden_dim=transformer.hidden_dim, nhead=transformer.nhead,
                           input_shape=shape)
        return {"backbone": backbone, "neck": neck, "transformer": transformer, "detr_head": detr_head}

    def _forward(self):
        feats = self.backbone(self.inputs)
        if self.neck is not None:
            feats = self.neck(feats)
        pad_mask = self.inputs.get("pad_mask", None) if self.training else None
        out = self.transformer(feats, pad_mask, self.inputs)
        if self.training:
            return self.detr_head(out, feats, self.inputs)
        preds = self.detr_head(out, feats)
        if self.exclude_post_process:
            return preds[0], preds[1]
        post = self.post_process
        if len(inspect.signature(post.__call__).parameters) >= 4:      # release/2.7's (..., pad_shape)
            result = post(preds, self.inputs["im_shape"], self.inputs["scale_factor"],
                          paddle.shape(self.inputs["image"])[2:])
        else:
            result = post(preds, self.inputs["im_shape"], self.inputs["scale_factor"])
        return result[0], result[1]


@serializable
class ResNet(ResNet26):
    """ppdet 2.6.0's ResNet with release/2.7's ``freeze_stem_only``: ``freeze_at >= 0`` then freezes the stem
    only, not the stages up to ``freeze_at`` (RT-DETR's ResNet-vd backbones train every stage)."""

    __shared__ = ["norm_type"]

    def __init__(self, depth=50, ch_in=64, variant="b", lr_mult_list=[1.0, 1.0, 1.0, 1.0], groups=1,
                 base_width=64, norm_type="bn", norm_decay=0, freeze_norm=True, freeze_at=0,
                 return_idx=[0, 1, 2, 3], dcn_v2_stages=[-1], num_stages=4, std_senet=False,
                 freeze_stem_only=False):
        super().__init__(depth=depth, ch_in=ch_in, variant=variant, lr_mult_list=lr_mult_list, groups=groups,
                         base_width=base_width, norm_type=norm_type, norm_decay=norm_decay, freeze_norm=freeze_norm,
                         freeze_at=-1 if freeze_stem_only else freeze_at, return_idx=return_idx,
                         dcn_v2_stages=dcn_v2_stages, num_stages=num_stages, std_senet=std_senet)
        if freeze_stem_only and freeze_at >= 0:
            self._freeze_parameters(self.conv1)


def _iou(a, b):
    """IoU of paired xyxy boxes [n, 4] -> [n]."""
    lt = paddle.maximum(a[:, :2], b[:, :2])
    rb = paddle.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clip(min=0).prod(-1)
    union = (a[:, 2:] - a[:, :2]).prod(-1) + (b[:, 2:] - b[:, :2]).prod(-1) - inter
    return inter / (union + 1e-9)


def varifocal_loss(logits, score, label, normalizer):
    """Varifocal loss (alpha 0.75, gamma 2): positives weighted by their IoU target, negatives by p^2."""
    p = F.sigmoid(logits)
    weight = 0.75 * p.pow(2.0) * (1 - label) + score * label
    return F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="none").mean(1).sum() / normalizer


class DINOLoss(DINOLoss26):
    """ppdet 2.6.0's DINOLoss plus release/2.7's ``use_vfl``: the class loss becomes a varifocal loss whose
    target at a matched query is the IoU of its box with the matched ground truth (RT-DETR's "IoU-aware"
    training). ``use_vfl: false`` (the default) is 2.6.0's loss exactly."""

    __shared__ = ["num_classes", "use_focal_loss"]
    __inject__ = ["matcher"]

    def __init__(self, num_classes=80, matcher="HungarianMatcher",
                 loss_coeff={"class": 1, "bbox": 5, "giou": 2, "no_object": 0.1, "mask": 1, "dice": 1},
                 aux_loss=True, use_focal_loss=False, use_vfl=False, use_uni_match=False, uni_match_ind=0):
        super().__init__(num_classes=num_classes, matcher=matcher, loss_coeff=dict(loss_coeff), aux_loss=aux_loss,
                         use_focal_loss=use_focal_loss)
        if use_uni_match:
            raise ValueError("DINOLoss.use_uni_match (release/2.7) is not implemented in ppmulti; remove it")
        self.use_vfl = use_vfl

    def forward(self, boxes, logits, gt_bbox, gt_class, masks=None, gt_mask=None, postfix="", dn_out_bboxes=None,
                dn_out_logits=None, dn_meta=None, **kwargs):
        if not self.use_vfl:
            return super().forward(boxes, logits, gt_bbox, gt_class, masks=masks, gt_mask=gt_mask, postfix=postfix,
                                   dn_out_bboxes=dn_out_bboxes, dn_out_logits=dn_out_logits, dn_meta=dn_meta,
                                   **kwargs)
        num_gts = paddle.to_tensor([float(sum(len(a) for a in gt_class))], dtype="float32")
        if paddle.distributed.get_world_size() > 1:
            paddle.distributed.all_reduce(num_gts)
            num_gts = num_gts / paddle.distributed.get_world_size()
        num_gts = paddle.clip(num_gts, min=1.)
        loss = self._layers(boxes, logits, gt_bbox, gt_class, num_gts, None, "")
        if dn_meta is not None:
            positive, groups = dn_meta["dn_positive_idx"], dn_meta["dn_num_group"]
            dn_indices = []
            for i, classes in enumerate(gt_class):
                n = len(classes)
                if n:
                    dn_indices.append((positive[i], paddle.arange(end=n, dtype="int64").tile([groups])))
                else:
                    dn_indices.append((paddle.zeros([0], "int64"), paddle.zeros([0], "int64")))
            loss.update(self._layers(dn_out_bboxes, dn_out_logits, gt_bbox, gt_class, num_gts * groups, dn_indices,
                                     "_dn"))
        else:
            loss.update({k + "_dn": paddle.to_tensor([0.]) for k in list(loss)})
        return loss

    def _layers(self, boxes, logits, gt_bbox, gt_class, num_gts, fixed_indices, postfix):
        """The last layer's class/bbox/giou losses and, with aux_loss, the other layers' summed as *_aux."""
        last = self._one_layer(boxes[-1], logits[-1], gt_bbox, gt_class, num_gts, fixed_indices)
        out = {f"loss_{k}{postfix}": v for k, v in last.items()}
        if self.aux_loss:
            aux = [self._one_layer(b, lg, gt_bbox, gt_class, num_gts, fixed_indices)
                   for b, lg in zip(boxes[:-1], logits[:-1])]
            for key in ("class", "bbox", "giou"):
                out[f"loss_{key}_aux{postfix}"] = paddle.add_n([a[key] for a in aux])
        return out

    def _one_layer(self, boxes, logits, gt_bbox, gt_class, num_gts, fixed_indices):
        indices = fixed_indices if fixed_indices is not None else self.matcher(boxes, logits, gt_bbox, gt_class)
        bs, nq = logits.shape[:2]
        has_gt = sum(len(a) for a in gt_class) > 0
        label = paddle.full([bs, nq], self.num_classes, dtype="int64")
        score = paddle.zeros([bs * nq, 1])
        if has_gt:
            index, updates = self._get_index_updates(nq, gt_class, indices)
            label = paddle.scatter(label.reshape([-1, 1]), index, updates.astype("int64")).reshape([bs, nq])
            src, tgt = self._get_src_target_assign(boxes.detach(), gt_bbox, indices)
            iou = _iou(bbox_cxcywh_to_xyxy(src), bbox_cxcywh_to_xyxy(tgt)).unsqueeze(-1)
            score = paddle.scatter(score, index, iou)
        onehot = F.one_hot(label, self.num_classes + 1)[..., :-1]
        if has_gt:
            cls = varifocal_loss(logits, score.reshape([bs, nq, 1]) * onehot, onehot, num_gts / nq)
        else:
            cls = sigmoid_focal_loss(logits, onehot, num_gts / nq)
        box = self._get_loss_bbox(boxes, gt_bbox, indices, num_gts)
        return {"class": self.loss_coeff["class"] * cls, "bbox": box["loss_bbox"], "giou": box["loss_giou"]}


class DETRPostProcess:
    """release/2.7's DETR box decoding (the name its DETR configs use): the top ``num_top_queries`` (query,
    class) pairs by score, boxes scaled to the original image (``bbox_decode_type: origin``) or to the padded
    one (``pad``). Returns (bbox [n, 6] as class, score, x1, y1, x2, y2; count per image; None)."""

    __shared__ = ["num_classes", "use_focal_loss", "with_mask"]
    __inject__ = []

    def __init__(self, num_classes=80, num_top_queries=100, dual_queries=False, dual_groups=0, use_focal_loss=False,
                 with_mask=False, mask_threshold=0.5, use_avg_mask_score=False, bbox_decode_type="origin"):
        if bbox_decode_type not in ("origin", "pad"):
            raise ValueError(f"DETRPostProcess.bbox_decode_type is origin or pad, not {bbox_decode_type}")
        if with_mask:
            raise ValueError("DETRPostProcess.with_mask (Mask DINO, release/2.7) is not implemented in ppmulti")
        self.num_classes, self.num_top_queries = num_classes, num_top_queries
        self.dual_queries, self.dual_groups = dual_queries, dual_groups
        self.use_focal_loss, self.bbox_decode_type = use_focal_loss, bbox_decode_type

    def __call__(self, head_out, im_shape, scale_factor, pad_shape):
        boxes, logits = head_out[0], head_out[1]
        if self.dual_queries:
            keep = int(logits.shape[1] // (self.dual_groups + 1))
            boxes, logits = boxes[:, :keep], logits[:, :keep]
        origin = paddle.floor(im_shape / scale_factor + 0.5)                 # [b, 2] as h, w
        if self.bbox_decode_type == "pad":
            origin = pad_shape / im_shape * origin
        scale = origin.flip(1).tile([1, 2]).unsqueeze(1)                      # [b, 1, 4] as w, h, w, h
        xyxy = bbox_cxcywh_to_xyxy(boxes) * scale
        bs = logits.shape[0]
        k = self.num_top_queries
        if self.use_focal_loss:
            scores, index = paddle.topk(F.sigmoid(logits).flatten(1), k, axis=-1)
            labels = index % self.num_classes
            query = index // self.num_classes
        else:
            probs = F.softmax(logits)[:, :, :-1]
            scores, labels = probs.max(-1), probs.argmax(-1)
            k = min(k, int(scores.shape[1]))
            scores, query = paddle.topk(scores, k, axis=-1)
            labels = paddle.take_along_axis(labels, query, axis=1)
        batch = paddle.arange(end=bs).unsqueeze(-1).tile([1, k]).astype(query.dtype)
        xyxy = paddle.gather_nd(xyxy, paddle.stack([batch, query], axis=-1))
        bbox = paddle.concat([labels.unsqueeze(-1).astype("float32"), scores.unsqueeze(-1), xyxy], axis=-1)
        bbox_num = paddle.to_tensor(k, dtype="int32").tile([bs])
        return bbox.reshape([-1, 6]), bbox_num, None


class RandomDistort(ops.RandomDistort):
    """release/2.7's RandomDistort when a config gives its ``prob`` (a key 2.6.0 lacks; release/2.7's RT-DETR
    readers set it), else 2.6.0's exactly (2.6 configs, the demo, keep their images). With ``prob``: the image is
    distorted at all with that probability; then its colour operations work on an 8-bit RGB PIL image, as 2.7 does
    them (2.6.0's work on floats in OpenCV's HSV). Each of ``hue``, ``saturation``, ``contrast`` and ``brightness``
    is ``[low, high, p]``, ``p`` being the chance the operation is left out; the factor (hue: a shift on PIL's
    0-255 hue circle) is drawn uniformly in ``[low, high)``. ``random_apply``: ``count`` of the four in a random
    order, else brightness, contrast (before or after the colour ones, at random), saturation, hue and, with
    ``random_channel``, a random channel swap. The draws are numpy's global generator's in 2.7's order, so a seed
    gives 2.7's images."""

    def __init__(self, hue=[-18, 18, 0.5], saturation=[0.5, 1.5, 0.5], contrast=[0.5, 1.5, 0.5],
                 brightness=[0.5, 1.5, 0.5], random_apply=True, count=4, random_channel=False, prob=None):
        super().__init__(hue=hue, saturation=saturation, contrast=contrast, brightness=brightness,
                         random_apply=random_apply, count=count, random_channel=random_channel)
        self.prob = prob

    @staticmethod
    def _factor(setting):
        """The drawn factor of ``[low, high, skip probability]``, or None when the operation is skipped."""
        low, high, skip = setting
        if np.random.uniform(0., 1.) < skip:
            return None
        return np.random.uniform(low, high)

    def _hue(self, img):
        shift = self._factor(self.hue)
        if shift is None:
            return img
        hsv = np.array(img.convert("HSV"))
        # the shifted hue wraps around the 8-bit circle (a float cast back to uint8 truncates toward zero)
        hsv[..., 0] = np.mod(np.trunc(hsv[..., 0] + shift).astype(np.int64), 256).astype(np.uint8)
        return Image.fromarray(hsv, mode="HSV").convert("RGB")

    def _enhance(self, img, setting, enhancer):
        factor = self._factor(setting)
        return img if factor is None else enhancer(img).enhance(factor)

    def _saturation(self, img):
        return self._enhance(img, self.saturation, ImageEnhance.Color)

    def _contrast(self, img):
        return self._enhance(img, self.contrast, ImageEnhance.Contrast)

    def _brightness(self, img):
        return self._enhance(img, self.brightness, ImageEnhance.Brightness)

    def apply(self, sample, context=None):
        if self.prob is None:
            return super().apply(sample, context)
        if random.random() > self.prob:
            return sample
        # 8-bit as 2.7 casts it (a float image out of 0-255 wraps; decoded images are in range)
        img = Image.fromarray(np.asarray(sample["image"]).astype(np.uint8))
        if self.random_apply:
            steps = (self._brightness, self._contrast, self._saturation, self._hue)
            for i in np.random.permutation(len(steps))[:self.count]:
                img = steps[i](img)
            sample["image"] = np.asarray(img).astype(np.float32)
            return sample
        img = self._brightness(img)
        contrast_first = np.random.randint(0, 2)
        if contrast_first:
            img = self._contrast(img)
        img = self._hue(self._saturation(img))
        if not contrast_first:
            img = self._contrast(img)
        out = np.asarray(img).astype(np.float32)
        if self.random_channel and np.random.randint(0, 2):
            out = out[..., np.random.permutation(3)]
        sample["image"] = out
        return sample


class RandomCrop(ops.RandomCrop):
    """ppdet 2.6.0's RandomCrop plus release/2.7's ``prob``: the crop is tried with that probability."""

    def __init__(self, aspect_ratio=[.5, 2.], thresholds=[.0, .1, .3, .5, .7, .9], scaling=[.3, 1.],
                 num_attempts=50, allow_no_crop=True, cover_all_box=False, is_mask_crop=False, prob=1.0):
        super().__init__(aspect_ratio=aspect_ratio, thresholds=thresholds, scaling=scaling,
                         num_attempts=num_attempts, allow_no_crop=allow_no_crop, cover_all_box=cover_all_box,
                         is_mask_crop=is_mask_crop)
        self.prob = prob

    def apply(self, sample, context=None):
        if random.random() > self.prob:
            return sample
        return super().apply(sample, context)


# ppdet 2.6.0 names these modules already (the override replaces its schema) ...
OVERRIDES = (DETR, ResNet, DINOLoss)
# ... and these reader ops (ppdet's reader looks an op up by name in ppdet.data.transform)
TRANSFORM_OVERRIDES = (RandomDistort, RandomCrop)
