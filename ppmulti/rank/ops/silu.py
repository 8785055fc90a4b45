"""oneDNN SiLU for CPU runs: YOLOv5's fused and ultralytics' conv+BN+SiLU layers call the op library's swish, and in
evaluation its convolution with the BatchNorm folded in and SiLU as a post-op."""

# Why: Paddle's CPU silu and its gradient are single-threaded Eigen loops, about 70 ms of a 520 ms YOLOv5n
# training step (256 px, batch 16, 2 threads); oneDNN's eltwise swish, in the library that already holds the
# convolution op (one build serves both), is vectorised and threaded, several times faster.
# In evaluation (eval mode, no gradient) the BatchNorm is a fixed per-channel affine: folded into the convolution's
# weights and bias, the layer is one oneDNN primitive with SiLU as its post-op, one pass over its output instead of
# three (bench/eval_fold.py measures the forward pass both ways).

from __future__ import annotations

import sys
import types

from ppmulti.rank import compat
from ppmulti.rank.ops import conv

OP_NAME = "ppmulti_onednn_silu"
EVAL_OP_NAME = "ppmulti_onednn_conv2d_bias_silu"   # silu(conv(x, w) + b), forward only
# the modules whose conv+BN+SiLU layers are swapped, and their function listing those layers
_SILU_LAYERS = (("ppmulti.rank.models.yolov5", "fused_silu_layers"),
                ("ppmulti.rank.models.ultra_blocks", "silu_conv_layers"))

_op = None   # the registered op's caller, once loaded
_eval_op = None   # the evaluation op's runner, once loaded


def load_op():
    """The op's caller ``f(x) -> x * sigmoid(x)`` for a contiguous float32 CPU tensor, building and
    registering the op library first if needed (the same one as the convolution's).

    Raises conv.OpUnavailable with the reason when this machine cannot build or load it.
    """
    global _op, _eval_op
    if _op is None:
        conv.load_op()
        runner = compat.custom_op_runner(OP_NAME)

        def run(x):
            return runner(x)[0]

        _eval_op = compat.custom_op_runner(EVAL_OP_NAME)
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


def fold_bn(conv_layer, bn):
    """(weight, bias) of one convolution computing ``bn(conv_layer(x))`` with ``bn``'s running statistics:
    the weight scaled per output channel by gamma / sqrt(var + eps), the bias beta - mean x that scale (plus the
    convolution's own bias, scaled)."""
    import paddle

    mean, variance = compat.batchnorm_running_stats(bn)
    scale = bn.weight * paddle.rsqrt(variance + compat.batchnorm_eps_momentum(bn)[0])
    weight = conv_layer.weight * scale.reshape([-1, 1, 1, 1])
    bias = bn.bias - mean * scale
    if conv_layer.bias is not None:
        bias = bias + conv_layer.bias * scale
    return weight, bias


def _folds(self, x) -> bool:
    """Whether this forward is evaluation the folded op computes (to rounding): eval mode without gradients, in
    dygraph (export traces Paddle's own layers), a float32 CPU NCHW input whose channels fit, a convolution the
    oneDNN op takes, a BatchNorm on its running statistics."""
    import paddle

    bn = self.bn
    return (_eval_op is not None and not self.training and not bn.training and paddle.in_dynamic_mode()
            and not paddle.is_grad_enabled() and x.dtype == paddle.float32 and x.place.is_cpu_place()
            and x.ndim == 4 and x.shape[1] == self.conv.weight.shape[1] * compat.conv2d_facts(self.conv).groups
            and 0 not in x.shape and conv.eligible(self.conv) and compat.batchnorm_uses_running_stats(bn)
            and compat.batchnorm_data_format(bn) == "NCHW")


def _conv_bn_onednn_silu(self, x):
    if _folds(self, x):
        if not x.is_contiguous():
            x = x.contiguous()
        facts = compat.conv2d_facts(self.conv)
        weight, bias = fold_bn(self.conv, self.bn)
        return _eval_op(x, weight, bias, list(facts.stride), list(facts.padding), int(facts.groups))[0]
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
