"""oneDNN SiLU for CPU training: YOLOv5's fused and ultralytics' conv+BN+SiLU layers call the op library's swish."""

# Why: Paddle's CPU silu and its gradient are single-threaded Eigen loops, about 70 ms of a 520 ms YOLOv5n
# training step (256 px, batch 16, 2 threads); oneDNN's eltwise swish, in the library that already holds the
# convolution op (one build serves both), is vectorised and threaded, several times faster.

from __future__ import annotations

import sys
import types

from ppmulti.rank import compat
from ppmulti.rank.ops import conv

OP_NAME = "ppmulti_onednn_silu"
# the modules whose conv+BN+SiLU layers are swapped, and their function listing those layers
_SILU_LAYERS = (("ppmulti.rank.models.yolov5", "fused_silu_layers"),
                ("ppmulti.rank.models.ultra_blocks", "silu_conv_layers"))

_op = None   # the registered op's caller, once loaded


def load_op():
    """The op's caller ``f(x) -> x * sigmoid(x)`` for a contiguous float32 CPU tensor, building and
    registering the op library first if needed (the same one as the convolution's).

    Raises conv.OpUnavailable with the reason when this machine cannot build or load it.
    """
    global _op
    if _op is None:
        conv.load_op()
        runner = compat.custom_op_runner(OP_NAME)

        def run(x):
            return runner(x)[0]

        _op = run
    return _op


def silu(x):
    """``F.silu(x)``, through the oneDNN op where it applies (dygraph, float32, CPU, not empty) and Paddle's
    otherwise (Paddle rejects a custom op's empty output as uninitialised)."""
    import paddle

    if (_op is None or not paddle.in_dynamic_mode() or x.dtype != paddle.float32 or not x.place.is_cpu_place()
            or 0 in x.shape):
        return paddle.nn.functional.silu(x)
    if not x.is_contiguous():
        x = x.contiguous()
    return _op(x)


def _conv_bn_onednn_silu(self, x):
    return silu(self.bn(self.conv(x)))


def use_onednn_silus(model) -> int:
    """Make every layer of ``model`` that YOLOv5's ``fuse_silu`` fused, and every conv+BN+SiLU of an ultralytics
    model, apply SiLU through the oneDNN op; returns how many. Other activations (PP-YOLOE's, ppdet's unfused
    BaseConv) keep Paddle's kernels.

    Only the layers' forward changes: parameters, state dicts and checkpoints stay as they are.
    """
    layers = []
    for name, lister in _SILU_LAYERS:
        module = sys.modules.get(name)   # the layers are made by that module: without it there are none
        if module is not None:
            layers += getattr(module, lister)(model)
    if not layers:
        return 0
    load_op()
    for layer in layers:
        layer.forward = types.MethodType(_conv_bn_onednn_silu, layer)
    return len(layers)
