"""SyncBatchNorm where Paddle has no kernel for it (CPU ranks over gloo): its forward, backward and conversion."""

from __future__ import annotations

import logging
import math

import paddle
import paddle.distributed as pdist
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.autograd import PyLayer

from ppmulti.rank import compat

log = logging.getLogger("ppmulti")

__all__ = ["CollectiveSyncBatchNorm", "convert_sync_batchnorm"]


def _channel_axis(data_format: str, ndim: int) -> int:
    return ndim - 1 if data_format.startswith("N") and data_format.endswith("C") and ndim > 2 else 1


def _channel_sum(t, axis: int):
    """Per-channel sum, reduced along contiguous axes (a reduction over [0, 2, 3] at once is slower on CPU)."""
    if axis == 1:
        return t.reshape([t.shape[0], t.shape[1], -1]).sum(-1).sum(0)
    return t.reshape([-1, t.shape[-1]]).sum(0)


_UNIT_EPS = 1e-5


def _affine(t, scale, shift, data_format: str):
    """``t * scale + shift`` per channel, as one inference-mode batch_norm: Paddle's broadcast of a [1, C, 1, 1]
    operand is about ten times slower on CPU than its fused BatchNorm kernel."""
    c = scale.shape[0]
    return F.batch_norm(t, paddle.zeros([c], dtype=t.dtype), paddle.ones([c], dtype=t.dtype),
                        weight=scale * _UNIT_SCALE, bias=shift, training=False, epsilon=_UNIT_EPS,
                        data_format=data_format)


_UNIT_SCALE = (1.0 + _UNIT_EPS) ** 0.5   # undoes batch_norm's 1/sqrt(1 + eps) on a unit variance


class _SyncBatchNormFn(PyLayer):
    """Batch statistics of all ranks' batches together: one float64 all-reduce of [sum, sum of squares, count] per
    channel in forward, one of [sum dy, sum dy*xhat] in backward (the two terms the input gradient needs from
    every rank). The weight and bias gradients stay local: the data-parallel wrapper averages them as it
    averages every other gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        w_fixed, b_fixed, w_dtype = weight.stop_gradient, bias.stop_gradient, weight.dtype
        fmt = compat.batchnorm_data_format(layer)
        eps, momentum = compat.batchnorm_eps_momentum(layer)
        running_mean, running_var = compat.batchnorm_running_stats(layer)
        axis = _channel_axis(fmt, x.ndim)
        channels = x.shape[axis]
        in_dtype = x.dtype
        if in_dtype != paddle.float32:   # statistics in float32, as Paddle's kernels keep them
            x, weight, bias = x.astype("float32"), weight.astype("float32"), bias.astype("float32")
        # each rank's own mean and centred sum of squares (two passes, as Paddle's BatchNorm kernels), combined
        # across ranks in float64: E[x^2] - E[x]^2 summed in float32 loses the variance of a channel whose mean
        # is far from zero next to its spread
        local_n = math.prod(x.shape) // channels
        local_mean = _channel_sum(x, axis) / float(local_n)
        centred = _affine(x, paddle.ones([channels], dtype="float32"), -local_mean, fmt)
        local_m2 = _channel_sum(paddle.square(centred), axis).astype("float64")
        local_mean = local_mean.astype("float64")
        stats = paddle.concat([local_mean * local_n, local_m2 + local_mean * local_mean * local_n,
                               paddle.full([1], local_n, dtype="float64")])
        pdist.all_reduce(stats)
        n = stats[2 * channels]
        mean64 = stats[:channels] / n
        # clipped so that rounding never makes it negative
        var = paddle.clip(stats[channels:2 * channels] / n - mean64 * mean64, min=0.0).astype("float32")
        mean, n = mean64.astype("float32"), n.astype("float32")
        y = F.batch_norm(x, mean, var, weight=weight, bias=bias, training=False, epsilon=eps, data_format=fmt)
        # Paddle's running statistics, as its batch_norm and sync_batch_norm kernels keep them: the weight of the
        # old value is the momentum, and the variance is the biased one that normalised the batch
        momentum = float(momentum)
        with paddle.no_grad():
            paddle.assign(running_mean * momentum + mean * (1.0 - momentum), running_mean)
            paddle.assign(running_var * momentum + var * (1.0 - momentum), running_var)
        invstd = paddle.rsqrt(var + eps)
        ctx.save_for_backward(x, mean, invstd, weight)
        ctx.facts = (fmt, axis, channels, n, in_dtype, w_dtype, w_fixed, b_fixed)
        return y if in_dtype == paddle.float32 else y.astype(in_dtype)

    @staticmethod
    def backward(ctx, dy):
        x, mean, invstd, weight = ctx.saved_tensor()
        fmt, axis, channels, n, in_dtype, w_dtype, w_fixed, b_fixed = ctx.facts
        if dy.dtype != paddle.float32:
            dy = dy.astype("float32")
        xhat = _affine(x, invstd, -mean * invstd, fmt)
        sum_dy = _channel_sum(dy, axis)
        sum_dy_xhat = _channel_sum(dy * xhat, axis)
        terms = paddle.concat([sum_dy, sum_dy_xhat])
        pdist.all_reduce(terms)
        # dx = w * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), the means over every rank's batch
        scale = weight * invstd
        dx = (_affine(dy, scale, -scale * terms[:channels] / n, fmt)
              + _affine(xhat, -scale * terms[channels:] / n, paddle.zeros_like(scale), fmt))
        if in_dtype != paddle.float32:
            dx, sum_dy_xhat, sum_dy = dx.astype(in_dtype), sum_dy_xhat.astype(w_dtype), sum_dy.astype(w_dtype)
        return dx, None if w_fixed else sum_dy_xhat, None if b_fixed else sum_dy


class CollectiveSyncBatchNorm(nn.SyncBatchNorm):
    """``paddle.nn.SyncBatchNorm`` computed from Paddle's collectives instead of its GPU-only kernel: in training
    every rank normalises with the mean and variance of all ranks' batches and updates its running statistics
    with them (so they stay equal on every rank); in evaluation it is plain BatchNorm on the running statistics,
    without communication. Parameters and state-dict keys are those of the BatchNorm it replaces."""

    def forward(self, x):
        self._check_data_format()
        if not self.training or pdist.get_world_size() <= 1:
            eps, momentum = compat.batchnorm_eps_momentum(self)
            return F.batch_norm(x, *compat.batchnorm_running_stats(self), weight=self.weight, bias=self.bias,
                                training=self.training, momentum=momentum, epsilon=eps,
                                data_format=compat.batchnorm_data_format(self))
        weight, bias = self.weight, self.bias
        channels = self._num_features
        if weight is None:   # built with weight_attr=False: a fixed scale of one
            weight = paddle.ones([channels], dtype="float32")
        if bias is None:
            bias = paddle.zeros([channels], dtype="float32")
        return _SyncBatchNormFn.apply(x, weight, bias, self)


def _is_batchnorm(layer) -> bool:
    from paddle.nn.layer.norm import _BatchNormBase

    return isinstance(layer, _BatchNormBase) and not isinstance(layer, CollectiveSyncBatchNorm)


def _converted(bn) -> CollectiveSyncBatchNorm:
    eps, momentum = compat.batchnorm_eps_momentum(bn)
    new = CollectiveSyncBatchNorm(bn._num_features, momentum, eps, data_format=compat.batchnorm_data_format(bn),
                                  weight_attr=False if bn.weight is None else None,
                                  bias_attr=False if bn.bias is None else None)
    # the same parameter objects: the optimizer, EMA and checkpoints see no difference
    if bn.weight is not None:
        new.weight = bn.weight
    if bn.bias is not None:
        new.bias = bn.bias
    compat.share_batchnorm_running_stats(bn, new)
    new.training = bn.training
    return new


def convert_sync_batchnorm(model: nn.Layer) -> int:
    """Replace, in place, every BatchNorm below ``model`` (``nn.BatchNorm1D/2D/3D``, Paddle's ``SyncBatchNorm``,
    and the ppdet layers built on them) by a ``CollectiveSyncBatchNorm`` sharing its parameters and statistics;
    returns how many were replaced. ``model`` itself must not be a BatchNorm."""
    count = 0
    for parent in model.sublayers(include_self=True):
        for name, child in list(parent.named_children()):
            if _is_batchnorm(child):
                setattr(parent, name, _converted(child))
                count += 1
    legacy = [name for name, sub in model.named_sublayers() if isinstance(sub, nn.BatchNorm)]
    if legacy:   # the fluid-style layer, not a _BatchNormBase: none of ppmulti's or ppdet's YOLO models use it
        log.warning("--sync-bn: %d paddle.nn.BatchNorm layer(s) stay per rank (%s)", len(legacy), legacy[0])
    return count
