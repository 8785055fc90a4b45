"""RT-DETR's hybrid encoder (PaddleDetection release/2.7's ``HybridEncoder`` and ``TransformerLayer``): one
transformer layer over the coarsest feature map, then a top-down and bottom-up fusion of CSP blocks of RepVGG
convolutions. Built from ppdet 2.6.0's own parts (BaseConv, RepVggBlock, TransformerEncoder, MultiHeadAttention)."""

from __future__ import annotations

from typing import Sequence

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle import ParamAttr
from paddle.regularizer import L2Decay
from ppdet.core.workspace import serializable
from ppdet.modeling.backbones.csp_darknet import BaseConv
from ppdet.modeling.backbones.cspresnet import RepVggBlock
from ppdet.modeling.initializer import linear_init_
from ppdet.modeling.layers import MultiHeadAttention
from ppdet.modeling.ops import get_act_fn
from ppdet.modeling.shape_spec import ShapeSpec
from ppdet.modeling.transformers.detr_transformer import TransformerEncoder

from ppmulti.rank.models.yolov5 import register_once

__all__ = ["TransformerLayer", "HybridEncoder", "sincos_position_embedding"]


def _no_decay() -> ParamAttr:
    return ParamAttr(regularizer=L2Decay(0.0))


@register_once
class TransformerLayer(nn.Layer):
    """A post-norm (or pre-norm) self-attention + feed-forward layer; positions are added to queries and keys."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 1024, dropout: float = 0.,
                 activation: str = "relu", attn_dropout: float | None = None, act_dropout: float | None = None,
                 normalize_before: bool = False):
        super().__init__()
        self.normalize_before = normalize_before
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout if attn_dropout is None else attn_dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout if act_dropout is None else act_dropout, mode="upscale_in_train")
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout, mode="upscale_in_train")
        self.dropout2 = nn.Dropout(dropout, mode="upscale_in_train")
        self.activation = getattr(F, activation)
        linear_init_(self.linear1)
        linear_init_(self.linear2)

    def forward(self, src, src_mask=None, pos_embed=None):
        shortcut = src
        if self.normalize_before:
            src = self.norm1(src)
        qk = src if pos_embed is None else src + pos_embed
        src = shortcut + self.dropout1(self.self_attn(qk, qk, value=src, attn_mask=src_mask))
        if not self.normalize_before:
            src = self.norm1(src)
        shortcut = src
        if self.normalize_before:
            src = self.norm2(src)
        src = shortcut + self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(src)))))
        if not self.normalize_before:
            src = self.norm2(src)
        return src


class CSPRepLayer(nn.Layer):
    """Two 1x1 branches, one through ``num_blocks`` RepVGG blocks, summed, then projected to ``out_channels``."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int = 3, expansion: float = 1.0,
                 bias: bool = False, act="silu"):
        super().__init__()
        hidden = int(out_channels * expansion)
        self.conv1 = BaseConv(in_channels, hidden, ksize=1, stride=1, bias=bias, act=act)
        self.conv2 = BaseConv(in_channels, hidden, ksize=1, stride=1, bias=bias, act=act)
        self.bottlenecks = nn.Sequential(*[RepVggBlock(hidden, hidden, act=act) for _ in range(num_blocks)])
        self.conv3 = (BaseConv(hidden, out_channels, ksize=1, stride=1, bias=bias, act=act)
                      if hidden != out_channels else nn.Identity())

    def forward(self, x):
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


def sincos_position_embedding(w: int, h: int, dim: int = 256, temperature: float = 10000.):
    """[1, w*h, dim]: sin and cos of the x and y grid positions at dim/4 frequencies each (w-major order)."""
    if dim % 4:
        raise ValueError(f"the 2-D sin-cos position embedding needs a dimension divisible by 4, not {dim}")
    gw, gh = paddle.meshgrid(paddle.arange(int(w), dtype="float32"), paddle.arange(int(h), dtype="float32"))
    quarter = dim // 4
    omega = 1.0 / (temperature ** (paddle.arange(quarter, dtype="float32") / quarter))
    xs = gw.flatten().unsqueeze(-1) * omega.unsqueeze(0)
    ys = gh.flatten().unsqueeze(-1) * omega.unsqueeze(0)
    return paddle.concat([xs.sin(), xs.cos(), ys.sin(), ys.cos()], axis=1).unsqueeze(0)


@register_once
@serializable
class HybridEncoder(nn.Layer):
    """The neck RT-DETR configs name: input projections, an intra-scale transformer on ``use_encoder_idx`` and a
    cross-scale FPN + PAN of ``CSPRepLayer``; every output has ``hidden_dim`` channels."""

    __shared__ = ["depth_mult", "act", "trt", "eval_size"]
    __inject__ = ["encoder_layer"]

    def __init__(self, in_channels: Sequence[int] = (512, 1024, 2048), feat_strides: Sequence[int] = (8, 16, 32),
                 hidden_dim: int = 256, use_encoder_idx: Sequence[int] = (2,), num_encoder_layers: int = 1,
                 encoder_layer="TransformerLayer", pe_temperature: float = 10000, expansion: float = 1.0,
                 depth_mult: float = 1.0, act="silu", trt: bool = False, eval_size=None):
        super().__init__()
        self.in_channels = list(in_channels)
        self.feat_strides = list(feat_strides)
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = list(use_encoder_idx)
        self.num_encoder_layers = num_encoder_layers
        self.pe_temperature = pe_temperature
        self.eval_size = eval_size
        self.input_proj = nn.LayerList([
            nn.Sequential(nn.Conv2D(c, hidden_dim, kernel_size=1, bias_attr=False),
                          nn.BatchNorm2D(hidden_dim, weight_attr=_no_decay(), bias_attr=_no_decay()))
            for c in self.in_channels])
        self.encoder = nn.LayerList([TransformerEncoder(encoder_layer, num_encoder_layers)
                                     for _ in self.use_encoder_idx])
        if act is None or isinstance(act, (str, dict)):
            act = get_act_fn(act, trt=trt)
        blocks = round(3 * depth_mult)
        levels = len(self.in_channels)
        self.lateral_convs = nn.LayerList([BaseConv(hidden_dim, hidden_dim, 1, 1, act=act)
                                           for _ in range(levels - 1)])
        self.fpn_blocks = nn.LayerList([CSPRepLayer(hidden_dim * 2, hidden_dim, blocks, act=act, expansion=expansion)
                                        for _ in range(levels - 1)])
        self.downsample_convs = nn.LayerList([BaseConv(hidden_dim, hidden_dim, 3, stride=2, act=act)
                                              for _ in range(levels - 1)])
        self.pan_blocks = nn.LayerList([CSPRepLayer(hidden_dim * 2, hidden_dim, blocks, act=act, expansion=expansion)
                                        for _ in range(levels - 1)])
        if eval_size:
            # a fixed eval size: the encoder's position embeddings are made once (and exported as constants)
            for idx in self.use_encoder_idx:
                stride = self.feat_strides[idx]
                setattr(self, f"pos_embed{idx}", sincos_position_embedding(
                    eval_size[1] // stride, eval_size[0] // stride, hidden_dim, pe_temperature))

    def forward(self, feats, for_mot=False, is_teacher=False):
        if len(feats) != len(self.in_channels):
            raise ValueError(f"HybridEncoder takes {len(self.in_channels)} feature maps, got {len(feats)}")
        proj = [layer(feat) for layer, feat in zip(self.input_proj, feats)]
        if self.num_encoder_layers > 0:
            for encoder, idx in zip(self.encoder, self.use_encoder_idx):
                h, w = proj[idx].shape[2:]
                tokens = proj[idx].flatten(2).transpose([0, 2, 1])
                pos = None
                if not (self.training or self.eval_size is None or is_teacher):
                    pos = getattr(self, f"pos_embed{idx}", None)
                if pos is None:
                    pos = sincos_position_embedding(w, h, self.hidden_dim, self.pe_temperature)
                proj[idx] = encoder(tokens, pos_embed=pos).transpose([0, 2, 1]).reshape([-1, self.hidden_dim, h, w])
        levels = len(self.in_channels)
        # top-down: from the coarsest map, each step upsampled and fused with the next finer one
        inner = [proj[-1]]
        for step, idx in enumerate(range(levels - 1, 0, -1)):
            top = self.lateral_convs[step](inner[0])
            inner[0] = top
            up = F.interpolate(top, scale_factor=2., mode="nearest")
            inner.insert(0, self.fpn_blocks[step](paddle.concat([up, proj[idx - 1]], axis=1)))
        # bottom-up
        outs = [inner[0]]
        for step in range(levels - 1):
            down = self.downsample_convs[step](outs[-1])
            outs.append(self.pan_blocks[step](paddle.concat([down, inner[step + 1]], axis=1)))
        return outs

    @classmethod
    def from_config(cls, cfg, input_shape):
        return {"in_channels": [s.channels for s in input_shape], "feat_strides": [s.stride for s in input_shape]}

    @property
    def out_shape(self):
        return [ShapeSpec(channels=self.hidden_dim, stride=s) for s in self.feat_strides]
