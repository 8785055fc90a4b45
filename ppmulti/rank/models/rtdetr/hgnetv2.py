"""PP-HGNetV2, the backbone of RT-DETR-L and -X (PaddleDetection release/2.7's ``PPHGNetV2``, arch 'L' or 'X'): a
two-branch stem, then four stages of HG blocks that concatenate every light conv's output and squeeze it. Parameter
names follow release/2.7, so its pretrained and trained weights load as they are."""

from __future__ import annotations

from typing import Sequence

import paddle
import paddle.nn as nn
from paddle import ParamAttr
from paddle.nn.initializer import Constant, KaimingNormal
from paddle.regularizer import L2Decay
from ppdet.core.workspace import serializable
from ppdet.modeling.shape_spec import ShapeSpec

from ppmulti.rank.models.yolov5 import register_once

__all__ = ["PPHGNetV2", "ARCHS"]

# per arch: stem channels (in, mid, out), then each stage as
# (in, mid, out, blocks, downsample, light_block, kernel, layers per block): release/2.7's table
ARCHS = {
    "L": ((3, 32, 48), ((48, 48, 128, 1, False, False, 3, 6), (128, 96, 512, 1, True, False, 3, 6),
                        (512, 192, 1024, 3, True, True, 5, 6), (1024, 384, 2048, 1, True, True, 5, 6))),
    "X": ((3, 32, 64), ((64, 64, 128, 1, False, False, 3, 6), (128, 128, 512, 2, True, False, 3, 6),
                        (512, 256, 1024, 5, True, True, 5, 6), (1024, 512, 2048, 2, True, True, 5, 6))),
}


class LearnableAffineBlock(nn.Layer):
    """y = scale * x + bias, two learnt scalars (trained at lab_lr x the stage's rate)."""

    def __init__(self, scale_value: float = 1.0, bias_value: float = 0.0, lr_mult: float = 1.0,
                 lab_lr: float = 0.01):
        super().__init__()
        attr = ParamAttr(learning_rate=lr_mult * lab_lr)
        self.scale = self.create_parameter([1], attr=attr, default_initializer=Constant(scale_value))
        self.bias = self.create_parameter([1], attr=ParamAttr(learning_rate=lr_mult * lab_lr),
                                          default_initializer=Constant(bias_value))

    def forward(self, x):
        return self.scale * x + self.bias


class ConvBNAct(nn.Layer):
    """Conv (no bias) + BatchNorm (no decay) [+ ReLU [+ affine]]."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, padding=1,
                 groups: int = 1, use_act: bool = True, use_lab: bool = False, lr_mult: float = 1.0):
        super().__init__()
        self.use_act, self.use_lab = use_act, use_lab
        pad = padding if isinstance(padding, str) else (kernel_size - 1) // 2
        self.conv = nn.Conv2D(in_channels, out_channels, kernel_size, stride, padding=pad, groups=groups,
                              weight_attr=ParamAttr(learning_rate=lr_mult), bias_attr=False)
        self.bn = nn.BatchNorm2D(out_channels,
                                 weight_attr=ParamAttr(regularizer=L2Decay(0.0), learning_rate=lr_mult),
                                 bias_attr=ParamAttr(regularizer=L2Decay(0.0), learning_rate=lr_mult))
        if use_act:
            self.act = nn.ReLU()
            if use_lab:
                self.lab = LearnableAffineBlock(lr_mult=lr_mult)

    def forward(self, x):
        x = self.bn(self.conv(x))
        if self.use_act:
            x = self.act(x)
            if self.use_lab:
                x = self.lab(x)
        return x


class LightConvBNAct(nn.Layer):
    """A 1x1 projection without activation, then a depthwise k x k conv with one."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1,
                 use_lab: bool = False, lr_mult: float = 1.0):
        super().__init__()
        self.conv1 = ConvBNAct(in_channels, out_channels, 1, use_act=False, use_lab=use_lab, lr_mult=lr_mult)
        self.conv2 = ConvBNAct(out_channels, out_channels, kernel_size, groups=out_channels, use_act=True,
                               use_lab=use_lab, lr_mult=lr_mult)

    def forward(self, x):
        return self.conv2(self.conv1(x))


class StemBlock(nn.Layer):
    """Stride 4: a 3x3/2 conv, then a max-pool branch beside two 2x2 convs, concatenated, a 3x3/2 and a 1x1."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, use_lab: bool = False,
                 lr_mult: float = 1.0):
        super().__init__()
        kw = {"use_lab": use_lab, "lr_mult": lr_mult}
        self.stem1 = ConvBNAct(in_channels, mid_channels, 3, 2, **kw)
        self.stem2a = ConvBNAct(mid_channels, mid_channels // 2, 2, 1, padding="SAME", **kw)
        self.stem2b = ConvBNAct(mid_channels // 2, mid_channels, 2, 1, padding="SAME", **kw)
        self.stem3 = ConvBNAct(mid_channels * 2, mid_channels, 3, 2, **kw)
        self.stem4 = ConvBNAct(mid_channels, out_channels, 1, 1, **kw)
        self.pool = nn.MaxPool2D(kernel_size=2, stride=1, ceil_mode=True, padding="SAME")

    def forward(self, x):
        x = self.stem1(x)
        x = paddle.concat([self.pool(x), self.stem2b(self.stem2a(x))], 1)
        return self.stem4(self.stem3(x))


class HG_Block(nn.Layer):
    """``layer_num`` convs in a chain; the input and every output are concatenated, squeezed to half of
    ``out_channels`` and expanded back (plus the input when ``identity``)."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, kernel_size: int = 3,
                 layer_num: int = 6, identity: bool = False, light_block: bool = True, use_lab: bool = False,
                 lr_mult: float = 1.0):
        super().__init__()
        self.identity = identity
        block = LightConvBNAct if light_block else ConvBNAct
        self.layers = nn.LayerList([
            block(in_channels if i == 0 else mid_channels, mid_channels, kernel_size=kernel_size, stride=1,
                  use_lab=use_lab, lr_mult=lr_mult) for i in range(layer_num)])
        total = in_channels + layer_num * mid_channels
        self.aggregation_squeeze_conv = ConvBNAct(total, out_channels // 2, 1, 1, use_lab=use_lab, lr_mult=lr_mult)
        self.aggregation_excitation_conv = ConvBNAct(out_channels // 2, out_channels, 1, 1, use_lab=use_lab,
                                                     lr_mult=lr_mult)

    def forward(self, x):
        outs = [x]
        y = x
        for layer in self.layers:
            y = layer(y)
            outs.append(y)
        y = self.aggregation_excitation_conv(self.aggregation_squeeze_conv(paddle.concat(outs, axis=1)))
        return y + x if self.identity else y


class HG_Stage(nn.Layer):
    """An optional depthwise 3x3/2 downsample, then ``block_num`` HG blocks (all but the first residual)."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, block_num: int, layer_num: int = 6,
                 downsample: bool = True, light_block: bool = True, kernel_size: int = 3, use_lab: bool = False,
                 lr_mult: float = 1.0):
        super().__init__()
        self.downsample = (ConvBNAct(in_channels, in_channels, 3, 2, groups=in_channels, use_act=False,
                                     use_lab=use_lab, lr_mult=lr_mult) if downsample else None)
        self.blocks = nn.Sequential(*[
            HG_Block(in_channels if i == 0 else out_channels, mid_channels, out_channels, kernel_size, layer_num,
                     identity=i > 0, light_block=light_block, use_lab=use_lab, lr_mult=lr_mult)
            for i in range(block_num)])

    def forward(self, x):
        if self.downsample is not None:
            x = self.downsample(x)
        return self.blocks(x)


def _frozen_norm(bn: nn.BatchNorm2D) -> nn.BatchNorm2D:
    """A BatchNorm with the same width that uses its running statistics and learns nothing."""
    attr = {"learning_rate": 0., "regularizer": L2Decay(0.), "trainable": False}
    norm = nn.BatchNorm2D(bn._num_features, weight_attr=ParamAttr(**attr), bias_attr=ParamAttr(**attr),
                          use_global_stats=True)
    for p in norm.parameters():
        p.stop_gradient = True
    return norm


def _freeze_norms(layer: nn.Layer) -> None:
    for name, child in list(layer.named_children()):
        if isinstance(child, nn.BatchNorm2D):
            setattr(layer, name, _frozen_norm(child))
        else:
            _freeze_norms(child)


@register_once
@serializable
class PPHGNetV2(nn.Layer):
    """The backbone RT-DETR-L/X configs name; outputs the stages in ``return_idx`` (strides 4, 8, 16, 32)."""

    def __init__(self, arch: str, use_lab: bool = False, lr_mult_list: Sequence[float] = (1.0, 1.0, 1.0, 1.0, 1.0),
                 return_idx: Sequence[int] = (1, 2, 3), freeze_stem_only: bool = True, freeze_at: int = 0,
                 freeze_norm: bool = True):
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(f"PPHGNetV2.arch is one of {sorted(ARCHS)}, not {arch!r}")
        stem, stages = ARCHS[arch]
        self.use_lab, self.return_idx = use_lab, list(return_idx)
        self._out_strides = [4, 8, 16, 32]
        self._out_channels = [s[2] for s in stages]
        self.stem = StemBlock(*stem, use_lab=use_lab, lr_mult=lr_mult_list[0])
        self.stages = nn.LayerList([
            HG_Stage(cin, mid, cout, blocks, layers, down, light, k, use_lab, lr_mult=lr_mult_list[i + 1])
            for i, (cin, mid, cout, blocks, down, light, k, layers) in enumerate(stages)])
        if freeze_at >= 0:
            frozen = [self.stem] + ([] if freeze_stem_only else list(self.stages[:freeze_at + 1]))
            for part in frozen:
                for p in part.parameters():
                    p.stop_gradient = True
        if freeze_norm:
            _freeze_norms(self)
        for m in self.sublayers():
            if isinstance(m, nn.Conv2D):
                KaimingNormal()(m.weight)
            elif isinstance(m, nn.BatchNorm2D):
                Constant(1.)(m.weight)
                Constant(0.)(m.bias)

    @property
    def out_shape(self):
        return [ShapeSpec(channels=self._out_channels[i], stride=self._out_strides[i]) for i in self.return_idx]

    def forward(self, inputs):
        x = self.stem(inputs["image"])
        outs = []
        for idx, stage in enumerate(self.stages):
            x = stage(x)
            if idx in self.return_idx:
                outs.append(x)
        return outs
