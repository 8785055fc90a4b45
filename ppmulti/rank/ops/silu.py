"""oneDNN SiLU for CPU training: YOLOv5's fused and ultralytics' conv+BN+SiLU layers call the op library's swish,
and in evaluation each such layer runs as one convolution with BatchNorm folded in and SiLU fused."""

# Why: Paddle's CPU silu and its gradient are single-threaded Eigen loops, about 70 ms of a 520 ms YOLOv5n
# training step (256 px, batch 16, 2 threads); oneDNN's eltwise swish, in the library that already holds the
# convolution op (one build serves both), is vectorised and threaded, several times faster.

from __future__ import annotations

import contextlib
import sys
import types

from ppmulti.rank import compat
from ppmulti.rank.ops import conv

OP_NAME = "ppmulti_onednn_silu"
INFER_OP_NAME = "ppmulti_onednn_conv2d_infer"   # conv + bias, SiLU as a post-op; no gradient
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
    fused = self.__dict__.get("_fused_inference")   # set by fused_for_inference only
    if fused is not None and not self.training:
        return fused(x)
    return silu(self.bn(self.conv(x)))


def _foldable(layer) -> bool:
    """A swapped conv+BN+SiLU layer whose convolution is the float32 oneDNN op and whose BatchNorm (Paddle's,
    SyncBatchNorm included) normalises NCHW with an affine weight and bias: it folds into the convolution."""
    from paddle.nn.layer.norm import _BatchNormBase

    bn = getattr(layer, "bn", None)
    return (conv.swapped_precision(layer.conv) == "float32" and isinstance(bn, _BatchNormBase)
            and bn.weight is not None and bn.bias is not None and compat.batchnorm_data_format(bn) == "NCHW")


def _fused_caller(runner, layer):
    """The layer in eval mode as one call of the inference op: its BatchNorm's running statistics and affine
    folded into the convolution's weight and bias now (the weights as they stand), SiLU as the op's post-op."""
    import paddle

    bn, c = layer.bn, layer.conv
    facts = compat.conv2d_facts(c)
    mean, variance = compat.batchnorm_running_stats(bn)
    scale = bn.weight / paddle.sqrt(variance + float(compat.batchnorm_eps_momentum(bn)[0]))
    weight = (c.weight * scale.reshape([-1, 1, 1, 1])).contiguous()
    bias = bn.bias - mean * scale
    if c.bias is not None:
        bias = bias + c.bias * scale
    strides, paddings, groups = list(facts.stride), list(facts.padding), int(facts.groups)

    def run(x):
        if not x.is_contiguous():
            x = x.contiguous()
        return runner(x, weight, bias, strides, paddings, groups, True)[0]

    return run


@contextlib.contextmanager
def fused_for_inference(model):
    """Within the block, each conv+BN+SiLU layer of ``model`` that ``use_onednn_silus`` swapped (float32 oneDNN
    convolution) runs in eval mode as one oneDNN convolution: BatchNorm folded into its weight and bias, SiLU
    fused (what ultralytics' ``fuse()`` does for its val and predict, here without changing the model). Folded
    on entry from the weights as they stand, dropped on exit: use it around a pass without gradients whose
    weights do not change (an evaluation). Yields how many layers it fused (0: none here, nothing changed)."""
    import paddle

    layers = [layer for layer in model.sublayers(include_self=True)
              if getattr(layer.__dict__.get("forward"), "__func__", None) is _conv_bn_onednn_silu
              and _foldable(layer)]
    if layers:
        runner = compat.custom_op_runner(INFER_OP_NAME)
        with paddle.no_grad():
            for layer in layers:
                layer._fused_inference = _fused_caller(runner, layer)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            layer.__dict__.pop("_fused_inference", None)


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
