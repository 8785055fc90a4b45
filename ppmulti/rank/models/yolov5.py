"""YOLOv5 (v6.0) backbone and neck: ppdet's CSPDarkNet and YOLOCSPPAN with YOLOv5's BatchNorm settings."""

from __future__ import annotations

import types
from typing import Sequence

import paddle.nn as nn
import paddle.nn.functional as F
from ppdet.core.config.schema import SchemaDict
from ppdet.core.workspace import global_config, register, serializable
from ppdet.modeling.backbones.csp_darknet import BaseConv, CSPDarkNet
from ppdet.modeling.necks.yolo_fpn import YOLOCSPPAN

from ppmulti.rank import compat

__all__ = ["register_once", "set_batchnorm", "fuse_silu", "fused_silu_layers", "YOLOv5CSPDarkNet", "YOLOv5CSPPAN"]

# YOLOv5 builds every BatchNorm with eps 1e-3 and PyTorch momentum 0.03; Paddle's momentum is the
# weight of the running value, so the same update is 0.97. ppdet's BaseConv keeps Paddle's
# defaults (1e-5, 0.9): BN statistics would follow the last few batches ten times faster.
YOLOV5_BN_EPS = 1e-3
YOLOV5_BN_MOMENTUM = 0.97
_BATCH_NORMS = (nn.BatchNorm1D, nn.BatchNorm2D, nn.BatchNorm3D, nn.SyncBatchNorm)


def register_once(cls: type) -> type:
    """ppdet's ``register``, safe to run again for the same class.

    ppdet raises when a name is registered twice, which a module reload (or a test that
    re-imports) would trigger. A name that ppdet itself (or another module) owns is
    still an error: silently keeping the other class would build the wrong model.
    """
    existing = global_config.get(cls.__name__)
    if isinstance(existing, SchemaDict):
        owner = getattr(existing.pymodule, "__name__", None)
        if owner == cls.__module__:
            return cls  # create() looks the class up on the module, so it finds the newest one
        raise ValueError(f"{cls.__name__} is already registered by {owner}; rename the ppmulti class")
    # A config loaded before this import left the section as a plain dict: keep its values.
    values = global_config.pop(cls.__name__, None)
    register(cls)
    if isinstance(values, dict):
        global_config[cls.__name__].update(values)
    return cls


def set_batchnorm(layer: nn.Layer, eps: float, momentum: float) -> int:
    """Give every BatchNorm below ``layer`` the given epsilon and (Paddle-convention) momentum.

    Returns how many BatchNorm layers were changed.
    """
    count = 0
    for sub in layer.sublayers(include_self=True):
        if isinstance(sub, _BATCH_NORMS):
            compat.set_batchnorm_eps_momentum(sub, eps, momentum)
            count += 1
    return count


def _conv_bn_silu(self, x):
    return F.silu(self.bn(self.conv(x)))


def fuse_silu(layer: nn.Layer) -> int:
    """Make every ppdet BaseConv below ``layer`` apply SiLU as Paddle's one fused op.

    ppdet's BaseConv computes ``x * sigmoid(x)``: two forward and two backward ops with a temporary in
    between, where ``F.silu`` is one each (the same values). Returns how many layers were changed.
    """
    count = 0
    for sub in layer.sublayers(include_self=True):
        if type(sub) is BaseConv:
            sub.forward = types.MethodType(_conv_bn_silu, sub)
            count += 1
    return count


def fused_silu_layers(layer: nn.Layer) -> list[nn.Layer]:
    """The layers below ``layer`` that ``fuse_silu`` changed and that still compute conv, BN, ``F.silu``
    (ppmulti/rank/ops/silu.py routes their SiLU through oneDNN on CPU)."""
    return [sub for sub in layer.sublayers(include_self=True)
            if getattr(sub.__dict__.get("forward"), "__func__", None) is _conv_bn_silu]


@register_once
@serializable
class YOLOv5CSPDarkNet(CSPDarkNet):
    """ppdet's CSPDarkNet, whose arch 'P5' is YOLOv5 v6's backbone (6x6 stem, C3 blocks, SPPF), with YOLOv5's BN.

    Args:
        arch (str): 'P5' for YOLOv5 (strides 8/16/32), 'P6' for the P6 models.
        depth_mult (float): YOLOv5's depth_multiple (number of bottlenecks in each C3).
        width_mult (float): YOLOv5's width_multiple (channels).
        return_idx (list): stages whose outputs are returned; [2, 3, 4] are P3, P4, P5.
        bn_eps (float): BatchNorm epsilon.
        bn_momentum (float): BatchNorm momentum in Paddle's convention (1 - PyTorch's).
    """

    __shared__ = ["depth_mult", "width_mult", "act", "trt"]

    def __init__(self, arch: str = "P5", depth_mult: float = 1.0, width_mult: float = 1.0,
                 depthwise: bool = False, act: str = "silu", trt: bool = False,
                 return_idx: Sequence[int] = (2, 3, 4), bn_eps: float = YOLOV5_BN_EPS,
                 bn_momentum: float = YOLOV5_BN_MOMENTUM):
        super().__init__(arch=arch, depth_mult=depth_mult, width_mult=width_mult, depthwise=depthwise,
                         act=act, trt=trt, return_idx=list(return_idx))
        set_batchnorm(self, bn_eps, bn_momentum)
        fuse_silu(self)


@register_once
@serializable
class YOLOv5CSPPAN(YOLOCSPPAN):
    """ppdet's YOLOCSPPAN, which is YOLOv5 v6's PAN head path, with YOLOv5's BN.

    Top-down: 1x1 lateral conv, nearest upsample, concat, C3 (shortcut off); bottom-up: 3x3
    stride-2 conv, concat with the lateral output, C3 — YOLOv5's layers 10-23.

    Args:
        depth_mult (float): YOLOv5's depth_multiple (bottlenecks per C3: round(3 * depth_mult)).
        in_channels (list): channels of P3, P4, P5 (taken from the backbone).
        bn_eps (float): BatchNorm epsilon.
        bn_momentum (float): BatchNorm momentum in Paddle's convention.
    """

    __shared__ = ["depth_mult", "data_format", "act", "trt"]

    def __init__(self, depth_mult: float = 1.0, in_channels: Sequence[int] = (256, 512, 1024),
                 depthwise: bool = False, data_format: str = "NCHW", act: str = "silu",
                 trt: bool = False, bn_eps: float = YOLOV5_BN_EPS,
                 bn_momentum: float = YOLOV5_BN_MOMENTUM):
        super().__init__(depth_mult=depth_mult, in_channels=list(in_channels), depthwise=depthwise,
                         data_format=data_format, act=act, trt=trt)
        set_batchnorm(self, bn_eps, bn_momentum)
        fuse_silu(self)
