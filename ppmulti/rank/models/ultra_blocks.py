"""The building blocks of ultralytics' YOLOv8 / YOLO11 / YOLO26 detectors, in Paddle, with its layer names.

Each block keeps the attribute names of its ultralytics counterpart (``cv1``, ``m``, ``attn.qkv``...), so a
state dict written by ultralytics maps onto these layers by renaming BatchNorm's running statistics alone.
"""

from __future__ import annotations

import math
from typing import Sequence

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle import ParamAttr
from paddle.regularizer import L2Decay

__all__ = ["BN_EPS", "BN_MOMENTUM", "autopad", "make_divisible", "Conv", "DWConv", "Bottleneck", "C2f", "C3",
           "C3k", "C3k2", "SPPF", "Attention", "PSABlock", "C2PSA", "Concat", "Upsample", "DFL", "plain_conv"]

# ultralytics' initialize_weights sets every BatchNorm to eps 1e-3 and PyTorch momentum 0.03; Paddle's momentum
# is the weight of the running value, so the same update is 0.97.
BN_EPS = 1e-3
BN_MOMENTUM = 0.97

# One activation object shared by every Conv, as ultralytics' Conv.default_act is: its layer count (leaf modules,
# each object once) counts it once.
_SHARED_SILU = nn.Silu()


def _no_decay() -> ParamAttr:
    # ultralytics' optimizer puts BatchNorm weights and every bias in groups without weight decay.
    return ParamAttr(regularizer=L2Decay(0.0))


def autopad(k: int | Sequence[int], p: int | None = None, d: int = 1) -> int | list[int]:
    """'Same' padding for a kernel k with dilation d, unless p is given."""
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


def make_divisible(x: float, divisor: int = 8) -> int:
    """The smallest multiple of divisor that is at least x."""
    return int(math.ceil(x / divisor) * divisor)


def _torch_default(fan_in: int, decay: bool = True) -> ParamAttr:
    # PyTorch's default convolution init, which ultralytics keeps: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the
    # weight (kaiming_uniform with a=sqrt(5)) and the bias; given as the initializer so nothing is drawn twice
    bound = 1 / math.sqrt(fan_in)
    return ParamAttr(initializer=nn.initializer.Uniform(-bound, bound),
                     regularizer=None if decay else L2Decay(0.0))


def plain_conv(c1: int, c2: int, k: int = 1, bias: bool = True) -> nn.Conv2D:
    """A bare convolution initialised as PyTorch's default (which ultralytics keeps)."""
    fan_in = c1 * k * k
    return nn.Conv2D(c1, c2, k, weight_attr=_torch_default(fan_in),
                     bias_attr=_torch_default(fan_in, decay=False) if bias else False)


class Conv(nn.Layer):
    """Convolution (no bias), BatchNorm, then SiLU (``act=True``) or nothing (``act=False``)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1, d: int = 1,
                 act: bool | nn.Layer = True):
        super().__init__()
        kh, kw = (k, k) if isinstance(k, int) else k
        self.conv = nn.Conv2D(c1, c2, k, s, autopad(k, p, d), dilation=d, groups=g, bias_attr=False,
                              weight_attr=_torch_default(c1 // g * kh * kw))
        self.bn = nn.BatchNorm2D(c2, momentum=BN_MOMENTUM, epsilon=BN_EPS, weight_attr=_no_decay(),
                                 bias_attr=_no_decay())
        self.set_act(act)

    def set_act(self, act: bool | nn.Layer) -> None:
        """SiLU (True), none (False) or a given layer."""
        self.act = _SHARED_SILU if act is True else act if isinstance(act, nn.Layer) else nn.Identity()
        self._silu = isinstance(self.act, nn.Silu)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = self.bn(self.conv(x))
        return F.silu(y) if self._silu else self.act(y)


def silu_conv_layers(layer: nn.Layer) -> list[Conv]:
    """The ``Conv`` layers below ``layer`` that compute conv, BN, ``F.silu`` (ppmulti/rank/ops/silu.py routes
    their SiLU through oneDNN on CPU)."""
    return [sub for sub in layer.sublayers(include_self=True)
            if isinstance(sub, Conv) and sub._silu and "forward" not in sub.__dict__]


class DWConv(Conv):
    """Depth-wise convolution: groups = gcd(c1, c2)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, d: int = 1, act: bool | nn.Layer = True):
        super().__init__(c1, c2, k, s, g=math.gcd(c1, c2), d=d, act=act)


class Bottleneck(nn.Layer):
    """Two convolutions (kernels k[0], k[1]) with a residual when shapes allow."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, k: Sequence = (3, 3),
                 e: float = 0.5):
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, k[0], 1)
        self.cv2 = Conv(hidden, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Layer):
    """CSP with two convolutions: split cv1's output in halves, chain n blocks on the second, concat all."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = False, g: int = 1, e: float = 0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.LayerList([Bottleneck(self.c, self.c, shortcut, g, k=(3, 3), e=1.0) for _ in range(n)])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        ys = list(paddle.split(self.cv1(x), 2, axis=1))
        for block in self.m:
            ys.append(block(ys[-1]))
        return self.cv2(paddle.concat(ys, axis=1))


class C3(nn.Layer):
    """CSP bottleneck with three convolutions."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5,
                 k: Sequence = (1, 3)):
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(c1, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c2, 1)
        self.m = nn.Sequential(*[Bottleneck(hidden, hidden, shortcut, g, k=k, e=1.0) for _ in range(n)])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.cv3(paddle.concat([self.m(self.cv1(x)), self.cv2(x)], axis=1))


class C3k(C3):
    """C3 whose bottlenecks use k x k kernels in both convolutions."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5,
                 k: int = 3):
        super().__init__(c1, c2, n, shortcut, g, e, k=(k, k))


class C3k2(C2f):
    """C2f whose inner blocks are Bottlenecks, C3k blocks (``c3k``) or a Bottleneck + PSABlock pair (``attn``)."""

    def __init__(self, c1: int, c2: int, n: int = 1, c3k: bool = False, e: float = 0.5, attn: bool = False,
                 g: int = 1, shortcut: bool = True):
        super().__init__(c1, c2, n, shortcut, g, e)
        c = self.c

        def inner() -> nn.Layer:
            if attn:
                return nn.Sequential(Bottleneck(c, c, shortcut, g),
                                     PSABlock(c, attn_ratio=0.5, num_heads=max(c // 64, 1)))
            if c3k:
                return C3k(c, c, 2, shortcut, g)
            return Bottleneck(c, c, shortcut, g)

        self.m = nn.LayerList([inner() for _ in range(n)])


class SPPF(nn.Layer):
    """Spatial pyramid pooling (fast): n chained max-pools of kernel k, concatenated; YOLO26's form adds a residual
    and leaves cv1 without activation."""

    def __init__(self, c1: int, c2: int, k: int = 5, n: int = 3, shortcut: bool = False):
        super().__init__()
        hidden = c1 // 2
        self.cv1 = Conv(c1, hidden, 1, 1, act=False)
        self.cv2 = Conv(hidden * (n + 1), c2, 1, 1)
        self.m = nn.MaxPool2D(kernel_size=k, stride=1, padding=k // 2)
        self.n = n
        self.add = shortcut and c1 == c2

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        ys = [self.cv1(x)]
        for _ in range(self.n):
            ys.append(self.m(ys[-1]))
        y = self.cv2(paddle.concat(ys, axis=1))
        return y + x if self.add else y


class Attention(nn.Layer):
    """Multi-head self-attention over the pixels, with a depth-wise positional convolution on the values."""

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, g=dim, act=False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        _, c, h, w = x.shape   # the batch stays 0 (as it comes) in the reshapes: unknown in an exported graph
        qkv = self.qkv(x).reshape([0, self.num_heads, 2 * self.key_dim + self.head_dim, h * w])
        q, k, v = paddle.split(qkv, [self.key_dim, self.key_dim, self.head_dim], axis=2)
        attn = F.softmax(paddle.matmul(q * self.scale, k, transpose_x=True), axis=-1)   # [b, heads, N, N]
        y = paddle.matmul(v, attn, transpose_y=True).reshape([0, c, h, w])
        return self.proj(y + self.pe(v.reshape([0, c, h, w])))


class PSABlock(nn.Layer):
    """Attention then a two-layer 1x1 feed-forward, each with a residual."""

    def __init__(self, c: int, attn_ratio: float = 0.5, num_heads: int = 4, shortcut: bool = True):
        super().__init__()
        self.attn = Attention(c, attn_ratio=attn_ratio, num_heads=num_heads)
        self.ffn = nn.Sequential(Conv(c, c * 2, 1), Conv(c * 2, c, 1, act=False))
        self.add = shortcut

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = x + self.attn(x) if self.add else self.attn(x)
        return x + self.ffn(x) if self.add else self.ffn(x)


class C2PSA(nn.Layer):
    """Split in halves, n PSABlocks on the second half, concat, 1x1 conv."""

    def __init__(self, c1: int, c2: int, n: int = 1, e: float = 0.5):
        super().__init__()
        if c1 != c2:
            raise ValueError(f"C2PSA keeps its channels: input {c1} and output {c2} must be equal")
        self.c = int(c1 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c1, 1)
        self.m = nn.Sequential(*[PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1))
                                 for _ in range(n)])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        a, b = paddle.split(self.cv1(x), [self.c, self.c], axis=1)
        return self.cv2(paddle.concat([a, self.m(b)], axis=1))


class Concat(nn.Layer):
    """Concatenate a list of tensors along one axis."""

    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, xs: Sequence[paddle.Tensor]) -> paddle.Tensor:
        return paddle.concat(list(xs), axis=self.d)


class Upsample(nn.Layer):
    """Resize by an integer factor (ultralytics' rows name torch's ``nn.Upsample``: size, scale, mode)."""

    def __init__(self, size=None, scale_factor: float = 2, mode: str = "nearest"):
        super().__init__()
        if size is not None:
            raise ValueError("nn.Upsample with a fixed size is not supported here; give [None, factor, mode]")
        self.scale_factor = scale_factor
        self.mode = mode

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return F.interpolate(x, scale_factor=self.scale_factor, mode=self.mode)


class DFL(nn.Layer):
    """Distribution focal loss' integral: softmax over reg_max bins per side, then the expected bin.

    The 1x1 convolution holding 0..reg_max-1 is a frozen parameter, as in ultralytics (it is in its state dict
    and counted among its parameters, not its gradients).
    """

    def __init__(self, c1: int = 16):
        super().__init__()
        self.conv = nn.Conv2D(c1, 1, 1, bias_attr=False)
        self.conv.weight.set_value(paddle.arange(c1, dtype="float32").reshape([1, c1, 1, 1]))
        self.conv.weight.stop_gradient = True
        self.conv.weight.trainable = False
        self.c1 = c1

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        # ultralytics' numbers (its 1x1 convolution over a softmax on the bins' axis) as a softmax on the last
        # axis and a product with the same weight: Paddle's CPU softmax on an inner axis took 3.6x as long
        probs = F.softmax(x.reshape([0, 4, self.c1, -1]).transpose([0, 1, 3, 2]), axis=-1)   # [b, 4, a, c1]
        return paddle.matmul(probs, self.conv.weight.reshape([self.c1, 1])).squeeze(-1)   # [b, 4, a]
