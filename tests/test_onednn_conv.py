"""The oneDNN convolution op: same values and gradients as Paddle's conv2d, which layers it takes, fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import paddle
import pytest

from ppmulti.rank.ops import conv as ops_conv
from ppmulti.rank.ops import cpu as ops_cpu
from toys import sgd_losses


@pytest.fixture(scope="module")
def op():
    return ops_conv.load_op()   # builds once per machine (cached under ~/.cache/ppmulti/ops)


def _close(a, b, rtol=2e-5):
    scale = float(b.abs().max()) or 1.0
    assert float((a - b).abs().max()) / scale < rtol


@pytest.mark.parametrize("shape,out_ch,k,stride,pad", [
    ((2, 3, 32, 32), 8, 6, 2, 2),     # YOLOv5's stem
    ((2, 8, 17, 13), 16, 3, 2, 1),    # odd sizes, stride 2
    ((3, 16, 10, 10), 16, 3, 1, 1),
    ((2, 16, 9, 9), 32, 1, 1, 0),     # 1x1
    ((1, 4, 7, 7), 4, 5, 1, 2),
])
def test_values_and_gradients_match_paddle(op, shape, out_ch, k, stride, pad):
    paddle.seed(0)
    x = paddle.randn(shape)
    x.stop_gradient = False
    w = paddle.randn([out_ch, shape[1], k, k]) * 0.1
    w.stop_gradient = False
    y = op(x, w, [stride, stride], [pad, pad])
    ref = paddle.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    assert y.shape == ref.shape
    _close(y, ref)
    g = paddle.randn(ref.shape)
    dx, dw = paddle.grad(y, [x, w], g)
    rdx, rdw = paddle.grad(ref, [x, w], g)
    _close(dx, rdx)
    _close(dw, rdw)


def test_non_contiguous_input_is_made_contiguous(op):
    conv = paddle.nn.Conv2D(4, 8, 3, padding=1, bias_attr=False)
    full = paddle.randn([2, 6, 8, 8])
    view = full[:, 1:5]
    assert not view.is_contiguous()
    ref = conv(view)
    assert ops_conv.use_onednn_convs(conv) == 1
    _close(conv(view), ref)


def _mixed_model():
    paddle.seed(1)
    return paddle.nn.Sequential(
        paddle.nn.Conv2D(3, 8, 3, padding=1, bias_attr=False),              # taken
        paddle.nn.Conv2D(8, 8, 3, stride=2, padding=1, bias_attr=False),    # taken
        paddle.nn.Conv2D(8, 8, 1, bias_attr=True),                          # bias: Paddle's kernel
        paddle.nn.Conv2D(8, 8, 3, padding=1, groups=2, bias_attr=False),    # grouped
        paddle.nn.Conv2D(8, 8, 3, padding=2, dilation=2, bias_attr=False),  # dilated
        paddle.nn.Conv2D(8, 8, 3, padding=[1, 0, 1, 0], bias_attr=False),   # asymmetric padding
        paddle.nn.Conv2D(8, 8, 3, padding="SAME", bias_attr=False),         # padding algorithm
    )


def _five_sgd_losses(convert) -> list[float]:
    """Five SGD steps of the mixed model (``convert(model)`` first, when given) on fixed inputs: the losses."""
    model = _mixed_model()
    if convert is not None:
        convert(model)
    rng = np.random.default_rng(0)
    inputs = [paddle.to_tensor(rng.standard_normal((4, 3, 16, 16)).astype("float32")) for _ in range(5)]
    return sgd_losses(model, lambda m, x: (m(x) ** 2).mean(), inputs, lr=0.05)


def test_only_layers_it_computes_exactly_are_swapped(op):
    model = _mixed_model()
    x = paddle.randn([2, 3, 16, 16])
    before = model(x)
    keys = list(model.state_dict())
    assert ops_conv.use_onednn_convs(model) == 2
    swapped = [layer for layer in model.sublayers() if "forward" in layer.__dict__]
    assert swapped == [model[0], model[1]]
    _close(model(x), before)
    assert list(model.state_dict()) == keys     # checkpoints are unchanged


def test_a_channel_mismatch_is_paddles_error_not_an_abort(op):
    """A config whose channels disagree (e.g. a shrunk backbone) gets Paddle's ValueError; oneDNN aborts the rank."""
    conv = paddle.nn.Conv2D(8, 4, 3, bias_attr=False)
    assert ops_conv.use_onednn_convs(conv) == 1
    with pytest.raises(ValueError, match="channel"):
        conv(paddle.randn([1, 6, 9, 9]))


def test_training_steps_follow_paddle_kernel(op):
    """Five SGD steps with the op give the losses Paddle's kernel gives."""
    def losses(use_op: bool):
        return _five_sgd_losses(ops_conv.use_onednn_convs if use_op else None)

    np.testing.assert_allclose(losses(True), losses(False), rtol=1e-4)


def test_choice_paddle_keeps_paddle_kernel(monkeypatch):
    monkeypatch.setenv("PPMULTI_CPU_CONV", "paddle")
    model = _mixed_model()
    assert "PPMULTI_CPU_CONV=paddle" in ops_cpu.setup_cpu_ops(model)
    assert not any("forward" in layer.__dict__ for layer in model.sublayers())


def test_bad_choice_is_one_clear_error(monkeypatch):
    from ppmulti.common.errors import UserError

    monkeypatch.setenv("PPMULTI_CPU_CONV", "mkl")
    with pytest.raises(UserError, match="PPMULTI_CPU_CONV='mkl' is not one of onednn, paddle"):
        ops_cpu.setup_cpu_ops(_mixed_model())


def test_unbuildable_op_falls_back_with_one_warning(monkeypatch, tmp_path):
    """No headers (or no compiler): training goes on with Paddle's kernel, and one warning says why."""
    monkeypatch.delenv("PPMULTI_CPU_CONV", raising=False)
    monkeypatch.setattr(ops_conv, "_op", None)
    monkeypatch.setattr(ops_conv, "_failure", None)
    monkeypatch.setattr(ops_conv, "cache_root", lambda: tmp_path)   # nothing built there yet

    def no_headers():
        raise ops_conv.OpUnavailable("oneDNN 3 headers not found; pip install onednn-devel-cpu-gomp==2023.2.0")

    monkeypatch.setattr(ops_conv, "_include_dir", no_headers)
    model = _mixed_model()
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    log = logging.getLogger("ppmulti")   # read here: it may or may not propagate to the root logger
    log.addHandler(handler)
    try:
        note = ops_cpu.setup_cpu_ops(model)
        ops_cpu.setup_cpu_ops(_mixed_model())     # a second model: the failure is remembered
    finally:
        log.removeHandler(handler)
    assert "unavailable" in note
    warnings = [r.getMessage() for r in records]
    assert len(warnings) == 2 and "headers not found" in warnings[0]
    assert not any("forward" in layer.__dict__ for layer in model.sublayers())


# ----------------------------------------------------------------------------- the bf16 variant (--amp on CPU)
BF16_RTOL = 1.5e-2   # bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4%); sums accumulate in float32


@pytest.fixture(scope="module")
def bf16_op(op):
    return ops_conv.load_bf16_op()


@pytest.mark.parametrize("shape,out_ch,k,stride,pad", [
    ((2, 3, 32, 32), 8, 6, 2, 2),
    ((2, 8, 17, 13), 16, 3, 2, 1),
    ((3, 16, 10, 10), 16, 3, 1, 1),
    ((2, 16, 9, 9), 32, 1, 1, 0),
])
def test_bf16_values_and_gradients_are_close_to_paddle_float32(bf16_op, shape, out_ch, k, stride, pad):
    """float32 in and out; within bf16's precision of Paddle's float32 conv2d, and really computed in bf16
    (further from it than the float32 op is)."""
    paddle.seed(0)
    x = paddle.randn(shape)
    x.stop_gradient = False
    w = paddle.randn([out_ch, shape[1], k, k]) * 0.1
    w.stop_gradient = False
    y = bf16_op(x, w, [stride, stride], [pad, pad])
    ref = paddle.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    assert y.dtype == paddle.float32 and y.shape == ref.shape
    g = paddle.randn(ref.shape)
    dx, dw = paddle.grad(y, [x, w], g)
    rdx, rdw = paddle.grad(ref, [x, w], g)
    assert dx.dtype == paddle.float32 and dw.dtype == paddle.float32
    for got, want in ((y, ref), (dx, rdx), (dw, rdw)):
        _close(got, want, rtol=BF16_RTOL)
        assert float((got - want).abs().max()) / float(want.abs().max()) > 1e-5   # not float32 in disguise


def test_bf16_swap_keeps_float32_weights_and_state(bf16_op):
    model = _mixed_model()
    keys = {k: v.dtype for k, v in model.state_dict().items()}
    assert ops_conv.use_onednn_convs(model, bf16=True) == 2
    out = model(paddle.randn([2, 3, 16, 16]))
    assert out.dtype == paddle.float32
    assert {k: v.dtype for k, v in model.state_dict().items()} == keys


def test_bf16_training_steps_follow_float32(bf16_op):
    """Five SGD steps with the bf16 op stay within bf16's precision of Paddle's float32 losses."""
    def losses(bf16: bool):
        return _five_sgd_losses((lambda m: ops_conv.use_onednn_convs(m, bf16=True)) if bf16 else None)

    float32, bf16 = losses(False), losses(True)
    np.testing.assert_allclose(bf16, float32, rtol=3e-2)
    assert bf16[-1] < bf16[0]


def test_bf16_support_reports_what_onednn_dispatches(op):
    """oneDNN's own answer matches the CPU's flags: native bf16 where /proc/cpuinfo lists AVX512-BF16 or AMX."""
    from ppmulti.common.cpus import cpu_flags

    native, optimized = ops_conv.bf16_support()
    assert native == bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
    if native:
        assert optimized
