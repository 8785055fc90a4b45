"""SyncBatchNorm where Paddle has no kernel for it (CPU ranks over gloo): its forward, backward and conversion."""

from __future__ import annotations

import logging
import math

import paddle
import paddle.distributed as pdist
import paddle.nn as nn
from paddle.autograd import PyLayer

log = logging.getLogger("ppmulti")

__all__ = ["CollectiveSyncBatchNorm", "convert_sync_batchnorm"]


def _channel_axis(data_format: str, ndim: int) -> int:
    return ndim - 1 if data_format.startswith("N") and data_format.endswith("C") and ndim > 2 else 1


def _stat_shape(channel_axis: int, ndim: int, channels: int) -> list[int]:
    shape = [1] * ndim
    shape[channel_axis] = channels
    return shape


class _SyncBatchNormFn(PyLayer):
    """Batch statistics of all ranks' batches together: one all-reduce of [sum, sum of squares, count] per
    channel in forward, one of [sum dy, sum dy*xhat] in backward (the two terms the input gradient needs from
    every rank). The weight and bias gradients stay local: the data-parallel wrapper averages them as it
    averages every other gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        axis = _channel_axis(layer._data_format, x.ndim)
        axes = [d for d in range(x.ndim) if d != axis]
        channels = x.shape[axis]
        shape = _stat_shape(axis, x.ndim, channels)
        xf = x.astype("float32") if x.dtype != paddle.float32 else x
        count = paddle.full([1], math.prod(x.shape) // channels, dtype="float32")
        stats = paddle.concat([xf.sum(axis=axes), (xf * xf).sum(axis=axes), count])
        pdist.all_reduce(stats)
        n = stats[2 * channels]
        mean = stats[:channels] / n
        # E[x^2] - E[x]^2 in float32: the activations BatchNorm sees are not far enough from zero for the
        # cancellation to matter; clipped so that rounding never makes it negative
        var = paddle.clip(stats[channels:2 * channels] / n - mean * mean, min=0.0)
        invstd = paddle.rsqrt(var + layer._epsilon)
        xhat = (xf - mean.reshape(shape)) * invstd.reshape(shape)
        y = xhat * weight.astype("float32").reshape(shape) + bias.astype("float32").reshape(shape)
        # Paddle's running statistics, as its batch_norm and sync_batch_norm kernels keep them: the weight of the
        # old value is the momentum, and the variance is the biased one that normalised the batch
        momentum = float(layer._momentum)
        with paddle.no_grad():
            paddle.assign((layer._mean * momentum + mean.astype(layer._mean.dtype) * (1.0 - momentum)), layer._mean)
            paddle.assign((layer._variance * momentum + var.astype(layer._variance.dtype) * (1.0 - momentum)),
                          layer._variance)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.facts = (axes, shape, channels, n, x.dtype, weight.dtype, weight.stop_gradient, bias.stop_gradient)
        return y.astype(x.dtype) if x.dtype != paddle.float32 else y

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensor()
        axes, shape, channels, n, x_dtype, w_dtype, w_fixed, b_fixed = ctx.facts
        dyf = dy.astype("float32") if dy.dtype != paddle.float32 else dy
        sum_dy = dyf.sum(axis=axes)
        sum_dy_xhat = (dyf * xhat).sum(axis=axes)
        terms = paddle.concat([sum_dy, sum_dy_xhat])
        pdist.all_reduce(terms)
        mean_dy = (terms[:channels] / n).reshape(shape)
        mean_dy_xhat = (terms[channels:] / n).reshape(shape)
        scale = (weight.astype("float32") * invstd).reshape(shape)
        dx = (dyf - mean_dy - xhat * mean_dy_xhat) * scale
        dx = dx.astype(x_dtype) if x_dtype != paddle.float32 else dx
        dweight = None if w_fixed else sum_dy_xhat.astype(w_dtype)
        dbias = None if b_fixed else sum_dy.astype(w_dtype)
        return dx, dweight, dbias


class CollectiveSyncBatchNorm(nn.SyncBatchNorm):
    """``paddle.nn.SyncBatchNorm`` computed from Paddle's collectives instead of its GPU-only kernel: in training
    every rank normalises with the mean and variance of all ranks' batches and updates its running statistics
    with them (so they stay equal on every rank); in evaluation it is plain BatchNorm on the running statistics,
    without communication. Parameters and state-dict keys are those of the BatchNorm it replaces."""

    def forward(self, x):
        self._check_data_format()
        if not self.training or pdist.get_world_size() <= 1:
            return nn.functional.batch_norm(x, self._mean, self._variance, weight=self.weight, bias=self.bias,
                                            training=self.training, momentum=self._momentum,
                                            epsilon=self._epsilon, data_format=self._data_format)
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
    new = CollectiveSyncBatchNorm(bn._num_features, bn._momentum, bn._epsilon, data_format=bn._data_format,
                                  weight_attr=False if bn.weight is None else None,
                                  bias_attr=False if bn.bias is None else None)
    # the same parameter objects: the optimizer, EMA and checkpoints see no difference
    if bn.weight is not None:
        new.weight = bn.weight
    if bn.bias is not None:
        new.bias = bn.bias
    new._mean = bn._mean
    new._variance = bn._variance
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
