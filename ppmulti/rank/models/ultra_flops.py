"""GFLOPs as ultralytics 8.4 reports them (its get_flops: ultralytics-thop on the model in eval mode, x2).

thop counts convolutions (output elements x input channels / groups x kernel area), BatchNorms (4 per element)
and the attention's matrix products (output elements x the contracted length); activations, pooling, resizing,
softmax and the decoding count nothing. Measured here on one stride-sized image: convolution and BatchNorm
counts grow with the number of pixels, the attention's with its square, so both scale exactly to the size asked.
"""

from __future__ import annotations

from typing import Sequence

import paddle
import paddle.nn as nn

from ppmulti.rank import compat

__all__ = ["flops_at"]


def _conv_ops(layer: nn.Conv2D, inputs, output) -> int:
    # thop: output elements x (input channels / groups) x kernel area; the bias is not counted
    in_c = int(inputs[0].shape[1])
    kh, kw = layer.weight.shape[2:]
    return int(output.numel()) * (in_c // compat.conv2d_facts(layer).groups) * int(kh) * int(kw)


def _bn_ops(layer: nn.BatchNorm2D, inputs, output) -> int:
    # thop: 2 per element (normalise), twice that with the affine weight and bias
    return 4 * int(inputs[0].numel())


def _dfl_ops(layer, inputs, output) -> int:
    # thop counts DFL's 1x1 convolution (ultralytics calls it): output elements x bins; ppmulti's DFL computes
    # the same product without calling the layer
    return int(output.numel()) * layer.c1


def _attention_ops(layer, inputs, output) -> int:
    # q^T k: [b, heads, N, N] x key_dim, then v attn^T: [b, heads, head_dim, N] x N
    b, _, h, w = inputs[0].shape
    n = int(h) * int(w)
    return int(b) * layer.num_heads * n * n * (layer.key_dim + layer.head_dim)


_RULES = {nn.Conv2D: _conv_ops, nn.BatchNorm2D: _bn_ops}


def flops_at(model: nn.Layer, imgsz: int | Sequence[int] = 640, stride: int = 32) -> float:
    """GFLOPs of one image of size imgsz (an int or (h, w))."""
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else (int(imgsz[0]), int(imgsz[1]))
    from ppmulti.rank.models.ultra_blocks import DFL, Attention

    linear, quadratic = [0], [0]
    hooks = []

    def add(where, rule):
        return lambda lyr, inp, out: where.__setitem__(0, where[0] + rule(lyr, inp, out))

    for layer in model.sublayers(include_self=True):
        if type(layer) in _RULES:
            hooks.append(layer.register_forward_post_hook(add(linear, _RULES[type(layer)])))
        elif isinstance(layer, Attention):
            hooks.append(layer.register_forward_post_hook(add(quadratic, _attention_ops)))
        elif isinstance(layer, DFL):
            hooks.append(layer.register_forward_post_hook(add(linear, _dfl_ops)))
    was_training = model.training
    model.eval()   # running statistics stay as they are
    try:
        with paddle.no_grad():
            net = getattr(model, "_net", None) or model   # UltraYOLO's forward takes ppdet's batch dict
            net(paddle.zeros([1, 3, stride, stride]))
    finally:
        for hook in hooks:
            hook.remove()
        model.train() if was_training else model.eval()
    ratio = (h * w) / (stride * stride)
    return (linear[0] * ratio + quadratic[0] * ratio * ratio) * 2 / 1e9
