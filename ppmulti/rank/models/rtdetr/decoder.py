"""RT-DETR's decoder (PaddleDetection release/2.7's ``RTDETRTransformer``): IoU-aware query selection of the
top-k encoder tokens, contrastive denoising queries in training, and deformable-attention decoder layers that
refine boxes layer by layer. ppdet 2.6.0's MSDeformableAttention, MLP and initialisers are reused; the sampling
takes the level shapes as Python lists (one set per batch), so it exports without a shape tensor."""

from __future__ import annotations

import copy
from typing import Sequence

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle import ParamAttr
from paddle.regularizer import L2Decay
from ppdet.modeling.heads.detr_head import MLP
from ppdet.modeling.initializer import bias_init_with_prob, constant_, linear_init_, xavier_uniform_
from ppdet.modeling.layers import MultiHeadAttention
from ppdet.modeling.transformers.deformable_transformer import MSDeformableAttention

from ppmulti.rank.models.yolov5 import register_once

__all__ = ["RTDETRTransformer", "inverse_sigmoid", "denoising_queries", "deformable_sample"]


def _no_decay() -> ParamAttr:
    return ParamAttr(regularizer=L2Decay(0.0))


def inverse_sigmoid(x, eps: float = 1e-5):
    """log(x / (1 - x)) with both terms clipped at ``eps`` (release/2.7's form: finite at 0 and 1)."""
    return paddle.log(x.clip(min=eps) / (1 - x).clip(min=eps))


def deformable_sample(value, shapes: Sequence[Sequence[int]], locations, weights):
    """Multi-scale deformable attention's core in plain Paddle ops.

    value [b, len_v, heads, d]; shapes [(h, w)] per level; locations [b, len_q, heads, levels, points, 2] in [0, 1];
    weights [b, len_q, heads, levels, points]. Returns [b, len_q, heads * d]."""
    b, _, heads, d = value.shape
    _, len_q, _, levels, points, _ = locations.shape
    per_level = value.split([int(h) * int(w) for h, w in shapes], axis=1)
    grids = 2 * locations - 1           # grid_sample's [-1, 1]
    sampled = []
    for level, (h, w) in enumerate(shapes):
        v = per_level[level].flatten(2).transpose([0, 2, 1]).reshape([b * heads, d, int(h), int(w)])
        g = grids[:, :, :, level].transpose([0, 2, 1, 3, 4]).flatten(0, 1)      # [b*heads, len_q, points, 2]
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    stacked = paddle.stack(sampled, axis=-2).flatten(-2)                       # [b*heads, d, len_q, levels*points]
    w = weights.transpose([0, 2, 1, 3, 4]).reshape([b * heads, 1, len_q, levels * points])
    out = (stacked * w).sum(-1).reshape([b, heads * d, len_q])
    return out.transpose([0, 2, 1])


class DeformableCrossAttention(MSDeformableAttention):
    """ppdet's MSDeformableAttention (its parameters and their initialisation) with box (4-d) or point (2-d)
    reference points and list level shapes; no learning-rate scaling of the offsets (release/2.7 passes 1.0)."""

    def forward(self, query, reference_points, value, value_spatial_shapes, value_level_start_index=None,
                value_mask=None):
        b, len_q = query.shape[:2]
        len_v = value.shape[1]
        value = self.value_proj(value)
        if value_mask is not None:
            value = value * value_mask.astype(value.dtype).unsqueeze(-1)
        value = value.reshape([b, len_v, self.num_heads, self.head_dim])
        offsets = self.sampling_offsets(query).reshape(
            [b, len_q, self.num_heads, self.num_levels, self.num_points, 2])
        weights = F.softmax(self.attention_weights(query).reshape(
            [b, len_q, self.num_heads, self.num_levels * self.num_points])).reshape(
            [b, len_q, self.num_heads, self.num_levels, self.num_points])
        if reference_points.shape[-1] == 2:
            normalizer = paddle.to_tensor([[w, h] for h, w in value_spatial_shapes], dtype=query.dtype)
            locations = (reference_points.reshape([b, len_q, 1, self.num_levels, 1, 2])
                         + offsets / normalizer.reshape([1, 1, 1, self.num_levels, 1, 2]))
        elif reference_points.shape[-1] == 4:
            # offsets move within the reference box: a point's reach is half the box over num_points
            locations = (reference_points[:, :, None, :, None, :2]
                         + offsets / self.num_points * reference_points[:, :, None, :, None, 2:] * 0.5)
        else:
            raise ValueError(f"reference points end in 2 or 4 values, not {reference_points.shape[-1]}")
        return self.output_proj(deformable_sample(value, value_spatial_shapes, locations, weights))


class DecoderLayer(nn.Layer):
    """Self-attention among queries, deformable cross-attention into the encoder's tokens, feed-forward."""

    def __init__(self, d_model: int = 256, n_head: int = 8, dim_feedforward: int = 1024, dropout: float = 0.,
                 activation: str = "relu", n_levels: int = 4, n_points: int = 4):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_head, dropout=dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model, weight_attr=_no_decay(), bias_attr=_no_decay())
        self.cross_attn = DeformableCrossAttention(d_model, n_head, n_levels, n_points, 1.0)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, weight_attr=_no_decay(), bias_attr=_no_decay())
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.activation = getattr(F, activation)
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(d_model, weight_attr=_no_decay(), bias_attr=_no_decay())
        for linear in (self.linear1, self.linear2):
            linear_init_(linear)
            xavier_uniform_(linear.weight)

    def forward(self, tgt, reference_points, memory, shapes, attn_mask=None, memory_mask=None, query_pos=None):
        qk = tgt if query_pos is None else tgt + query_pos
        if attn_mask is not None:
            # True = may attend; MultiHeadAttention adds the mask to the logits
            attn_mask = paddle.where(attn_mask.astype("bool"), paddle.zeros(attn_mask.shape, tgt.dtype),
                                     paddle.full(attn_mask.shape, float("-inf"), tgt.dtype))
        tgt = self.norm1(tgt + self.dropout1(self.self_attn(qk, qk, value=tgt, attn_mask=attn_mask)))
        q = tgt if query_pos is None else tgt + query_pos
        tgt = self.norm2(tgt + self.dropout2(self.cross_attn(q, reference_points, memory, shapes, None, memory_mask)))
        ffn = self.linear2(self.dropout3(self.activation(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout4(ffn))


def denoising_queries(gt_class: list, gt_bbox: list, num_classes: int, num_queries: int, class_embed,
                      num_denoising: int = 100, label_noise_ratio: float = 0.5, box_noise_scale: float = 1.0):
    """Contrastive denoising groups (DINO's, as RT-DETR uses them): each group holds every ground-truth box twice,
    a positive copy jittered within half its size and a negative copy jittered further, with some labels flipped.

    Returns (query features [b, n, d], unactivated boxes [b, n, 4], attention mask [n+q, n+q] (True = may
    attend), meta) or four Nones when there is nothing to denoise."""
    if num_denoising <= 0:
        return None, None, None, None
    counts = [int(len(c)) for c in gt_class]
    most = max(counts) if counts else 0
    if most == 0:
        return None, None, None, None
    groups = max(num_denoising // most, 1)
    bs = len(counts)
    labels = paddle.full([bs, most], num_classes, dtype="int32")
    boxes = paddle.zeros([bs, most, 4])
    present = paddle.zeros([bs, most])
    for i, n in enumerate(counts):
        if n:
            labels[i, :n] = gt_class[i].squeeze(-1).astype("int32")
            boxes[i, :n] = gt_bbox[i]
            present[i, :n] = 1
    labels = labels.tile([1, 2 * groups])
    boxes = boxes.tile([1, 2 * groups, 1])
    present = present.tile([1, 2 * groups])
    negative = paddle.concat([paddle.zeros([bs, most, 1]), paddle.ones([bs, most, 1])], axis=1).tile([1, groups, 1])
    positive_idx = paddle.nonzero((1 - negative.squeeze(-1)) * present)[:, 1]
    positive_idx = paddle.split(positive_idx, [n * groups for n in counts])
    total = int(most * 2 * groups)
    if label_noise_ratio > 0:
        flat_labels = labels.flatten()
        flip = (paddle.rand(flat_labels.shape) < label_noise_ratio * 0.5).astype("float32") * present.flatten()
        chosen = paddle.nonzero(flip).squeeze(-1)
        if chosen.shape[0] > 0:
            flat_labels = paddle.scatter(flat_labels, chosen,
                                         paddle.randint(0, num_classes, chosen.shape, dtype="int32"))
        labels = flat_labels.reshape([bs, total])
    if box_noise_scale > 0:
        xyxy = paddle.concat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], axis=-1)
        half = boxes[..., 2:].tile([1, 1, 2]) * 0.5 * box_noise_scale
        sign = paddle.randint(0, 2, boxes.shape).astype("float32") * 2.0 - 1.0
        part = paddle.rand(boxes.shape)
        part = (part + 1.0) * negative + part * (1 - negative)
        xyxy = (xyxy + sign * part * half).clip(min=0.0, max=1.0)
        boxes = paddle.concat([(xyxy[..., :2] + xyxy[..., 2:]) / 2, xyxy[..., 2:] - xyxy[..., :2]], axis=-1)
        boxes = inverse_sigmoid(boxes)
    table = paddle.concat([class_embed, paddle.zeros([1, class_embed.shape[-1]], class_embed.dtype)])
    features = paddle.gather(table, labels.flatten(), axis=0).reshape([bs, total, -1])
    size = total + num_queries
    blocked = paddle.zeros([size, size], dtype="bool")
    blocked[total:, :total] = True          # matching queries do not see the denoising ones
    span = most * 2
    for g in range(groups):                 # a denoising group sees only itself
        lo, hi = span * g, span * (g + 1)
        if hi < total:
            blocked[lo:hi, hi:total] = True
        if lo > 0:
            blocked[lo:hi, :lo] = True
    meta = {"dn_positive_idx": positive_idx, "dn_num_group": groups, "dn_num_split": [total, num_queries]}
    return features, boxes, ~blocked, meta


@register_once
class RTDETRTransformer(nn.Layer):
    """The ``transformer`` RT-DETR configs name; returns (boxes per layer, logits per layer, the encoder's top-k
    boxes, their logits, denoising meta), what ppdet's DINOHead takes."""

    __shared__ = ["num_classes", "hidden_dim", "eval_size"]

    def __init__(self, num_classes: int = 80, hidden_dim: int = 256, num_queries: int = 300,
                 position_embed_type: str = "sine", backbone_feat_channels: Sequence[int] = (512, 1024, 2048),
                 feat_strides: Sequence[int] = (8, 16, 32), num_levels: int = 3, num_decoder_points: int = 4,
                 nhead: int = 8, num_decoder_layers: int = 6, dim_feedforward: int = 1024, dropout: float = 0.,
                 activation: str = "relu", num_denoising: int = 100, label_noise_ratio: float = 0.5,
                 box_noise_scale: float = 1.0, learnt_init_query: bool = True, query_pos_head_inv_sig: bool = False,
                 eval_size=None, eval_idx: int = -1, eps: float = 1e-2):
        super().__init__()
        if position_embed_type not in ("sine", "learned"):
            raise ValueError(f"RTDETRTransformer.position_embed_type is sine or learned, not {position_embed_type}")
        channels = list(backbone_feat_channels)
        strides = list(feat_strides)
        if len(channels) > num_levels or len(strides) != len(channels):
            raise ValueError(f"RTDETRTransformer: {len(channels)} input maps, {len(strides)} strides and "
                             f"num_levels {num_levels} do not fit together")
        while len(strides) < num_levels:
            strides.append(strides[-1] * 2)
        self.hidden_dim, self.nhead, self.feat_strides = hidden_dim, nhead, strides
        self.num_levels, self.num_classes, self.num_queries = num_levels, num_classes, num_queries
        self.eps, self.num_decoder_layers, self.eval_size = eps, num_decoder_layers, eval_size
        self.eval_idx = eval_idx if eval_idx >= 0 else num_decoder_layers + eval_idx
        self.num_denoising, self.label_noise_ratio, self.box_noise_scale = (num_denoising, label_noise_ratio,
                                                                            box_noise_scale)
        self.learnt_init_query, self.query_pos_head_inv_sig = learnt_init_query, query_pos_head_inv_sig

        def norm():
            return nn.BatchNorm2D(hidden_dim, weight_attr=_no_decay(), bias_attr=_no_decay())

        self.input_proj = nn.LayerList(
            [nn.Sequential(("conv", nn.Conv2D(c, hidden_dim, kernel_size=1, bias_attr=False)), ("norm", norm()))
             for c in channels])
        extra_in = channels[-1]
        for _ in range(num_levels - len(channels)):
            self.input_proj.append(nn.Sequential(
                ("conv", nn.Conv2D(extra_in, hidden_dim, kernel_size=3, stride=2, padding=1, bias_attr=False)),
                ("norm", norm())))
            extra_in = hidden_dim
        layer = DecoderLayer(hidden_dim, nhead, dim_feedforward, dropout, activation, num_levels, num_decoder_points)
        # release/2.7's parameter names (transformer.decoder.layers.N...), so its checkpoints load as they are
        self.decoder = nn.Layer()
        self.decoder.layers = nn.LayerList([copy.deepcopy(layer) for _ in range(num_decoder_layers)])
        self.denoising_class_embed = nn.Embedding(num_classes, hidden_dim,
                                                  weight_attr=ParamAttr(initializer=nn.initializer.Normal()))
        if learnt_init_query:
            self.tgt_embed = nn.Embedding(num_queries, hidden_dim)
        self.query_pos_head = MLP(4, 2 * hidden_dim, hidden_dim, num_layers=2)
        self.enc_output = nn.Sequential(nn.Linear(hidden_dim, hidden_dim),
                                        nn.LayerNorm(hidden_dim, weight_attr=_no_decay(), bias_attr=_no_decay()))
        self.enc_score_head = nn.Linear(hidden_dim, num_classes)
        self.enc_bbox_head = MLP(hidden_dim, hidden_dim, 4, num_layers=3)
        self.dec_score_head = nn.LayerList([nn.Linear(hidden_dim, num_classes) for _ in range(num_decoder_layers)])
        self.dec_bbox_head = nn.LayerList([MLP(hidden_dim, hidden_dim, 4, num_layers=3)
                                           for _ in range(num_decoder_layers)])
        self._init_weights()

    def _init_weights(self) -> None:
        prior = bias_init_with_prob(0.01)
        for score, box in [(self.enc_score_head, self.enc_bbox_head),
                           *zip(self.dec_score_head, self.dec_bbox_head)]:
            linear_init_(score)
            constant_(score.bias, prior)
            constant_(box.layers[-1].weight)
            constant_(box.layers[-1].bias)
        linear_init_(self.enc_output[0])
        xavier_uniform_(self.enc_output[0].weight)
        if self.learnt_init_query:
            xavier_uniform_(self.tgt_embed.weight)
        xavier_uniform_(self.query_pos_head.layers[0].weight)
        xavier_uniform_(self.query_pos_head.layers[1].weight)
        for proj in self.input_proj:
            xavier_uniform_(proj[0].weight)
        if self.eval_size:
            self.anchors, self.valid_mask = self._anchors()

    @classmethod
    def from_config(cls, cfg, input_shape):
        return {"backbone_feat_channels": [s.channels for s in input_shape]}

    def _tokens(self, feats):
        maps = [proj(feat) for proj, feat in zip(self.input_proj, feats)]
        for i in range(len(maps), self.num_levels):
            maps.append(self.input_proj[i](feats[-1] if i == len(feats) else maps[-1]))
        shapes = [[int(m.shape[2]), int(m.shape[3])] for m in maps]
        return paddle.concat([m.flatten(2).transpose([0, 2, 1]) for m in maps], axis=1), shapes

    def _anchors(self, shapes=None, grid_size: float = 0.05, dtype: str = "float32"):
        """Unactivated anchor boxes at every token (cx, cy at the cell centre, w = h = grid_size * 2^level); those
        too near the border are +inf and masked out."""
        if shapes is None:
            shapes = [[int(self.eval_size[0] / s), int(self.eval_size[1] / s)] for s in self.feat_strides]
        anchors = []
        for level, (h, w) in enumerate(shapes):
            gy, gx = paddle.meshgrid(paddle.arange(end=h, dtype=dtype), paddle.arange(end=w, dtype=dtype))
            xy = (paddle.stack([gx, gy], -1).unsqueeze(0) + 0.5) / paddle.to_tensor([w, h], dtype=dtype)
            wh = paddle.ones_like(xy) * grid_size * (2.0 ** level)
            anchors.append(paddle.concat([xy, wh], -1).reshape([-1, h * w, 4]))
        anchors = paddle.concat(anchors, 1)
        valid = ((anchors > self.eps).astype("int32") * (anchors < 1 - self.eps).astype("int32")).min(
            -1, keepdim=True).astype("bool")
        anchors = paddle.log(anchors / (1 - anchors))
        anchors = paddle.where(valid, anchors, paddle.full_like(anchors, float("inf")))
        return anchors, valid

    def _decoder_input(self, memory, shapes, dn_class=None, dn_boxes=None, is_teacher=False):
        bs = memory.shape[0]
        if self.training or self.eval_size is None or is_teacher:
            anchors, valid = self._anchors(shapes)
        else:
            anchors, valid = self.anchors, self.valid_mask
        memory = paddle.where(valid, memory, paddle.zeros_like(memory))
        out_memory = self.enc_output(memory)
        enc_logits = self.enc_score_head(out_memory)
        enc_boxes_unact = self.enc_bbox_head(out_memory) + anchors
        # IoU-aware query selection: the tokens with the highest class score become the queries
        _, top = paddle.topk(enc_logits.max(-1), self.num_queries, axis=1)
        batch = paddle.arange(end=bs, dtype=top.dtype).unsqueeze(-1).tile([1, self.num_queries])
        top = paddle.stack([batch, top], axis=-1)
        ref_unact = paddle.gather_nd(enc_boxes_unact, top)
        enc_top_boxes = F.sigmoid(ref_unact)
        if dn_boxes is not None:
            ref_unact = paddle.concat([dn_boxes, ref_unact], 1)
        if self.training:
            ref_unact = ref_unact.detach()
        enc_top_logits = paddle.gather_nd(enc_logits, top)
        if self.learnt_init_query:
            target = self.tgt_embed.weight.unsqueeze(0).tile([bs, 1, 1])
        else:
            target = paddle.gather_nd(out_memory, top)
            if self.training:
                target = target.detach()
        if dn_class is not None:
            target = paddle.concat([dn_class, target], 1)
        return target, ref_unact, enc_top_boxes, enc_top_logits

    def _decode(self, target, ref_unact, memory, shapes, attn_mask):
        boxes, logits = [], []
        ref = F.sigmoid(ref_unact)
        prev_undetached = None
        output = target
        for i, layer in enumerate(self.decoder.layers):
            pos = self.query_pos_head(inverse_sigmoid(ref) if self.query_pos_head_inv_sig else ref)
            output = layer(output, ref.unsqueeze(2), memory, shapes, attn_mask, None, pos)
            refined = F.sigmoid(self.dec_bbox_head[i](output) + inverse_sigmoid(ref))
            if self.training:
                logits.append(self.dec_score_head[i](output))
                # later layers' boxes keep the gradient through the previous layer's (undetached) box
                boxes.append(refined if i == 0 else
                             F.sigmoid(self.dec_bbox_head[i](output) + inverse_sigmoid(prev_undetached)))
            elif i == self.eval_idx:
                logits.append(self.dec_score_head[i](output))
                boxes.append(refined)
                break
            prev_undetached = refined
            ref = refined.detach() if self.training else refined
        return paddle.stack(boxes), paddle.stack(logits)

    def forward(self, feats, pad_mask=None, gt_meta=None, is_teacher=False):
        memory, shapes = self._tokens(feats)
        if self.training:
            dn_class, dn_boxes, attn_mask, dn_meta = denoising_queries(
                gt_meta["gt_class"], gt_meta["gt_bbox"], self.num_classes, self.num_queries,
                self.denoising_class_embed.weight, self.num_denoising, self.label_noise_ratio, self.box_noise_scale)
        else:
            dn_class = dn_boxes = attn_mask = dn_meta = None
        target, ref_unact, enc_boxes, enc_logits = self._decoder_input(memory, shapes, dn_class, dn_boxes,
                                                                       is_teacher)
        out_boxes, out_logits = self._decode(target, ref_unact, memory, shapes, attn_mask)
        return out_boxes, out_logits, enc_boxes, enc_logits, dn_meta
