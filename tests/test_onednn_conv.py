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


def _inputs(shape, out_ch, k, groups, bias):
    """x, the weight and (``bias``) a bias, all needing gradients."""
    paddle.seed(0)
    x = paddle.randn(shape)
    w = paddle.randn([out_ch, shape[1] // groups, k, k]) * 0.1
    b = paddle.randn([out_ch]) if bias else None
    for t in (x, w, b):
        if t is not None:
            t.stop_gradient = False
    return x, w, b


def _with_paddle(run, x, w, b, stride, pad, groups):
    """``run``'s output and gradients beside Paddle's conv2d's, for one random output gradient."""
    y = run(x, w, [stride, stride], [pad, pad], groups, b)
    ref = paddle.nn.functional.conv2d(x, w, b, stride=stride, padding=pad, groups=groups)
    assert y.dtype == paddle.float32 and y.shape == ref.shape
    inputs = [t for t in (x, w, b) if t is not None]
    g = paddle.randn(ref.shape)
    return [y, *paddle.grad(y, inputs, g)], [ref, *paddle.grad(ref, inputs, g)]


CASES = [   # shape, out_ch, k, stride, pad, groups, bias
    ((2, 3, 32, 32), 8, 6, 2, 2, 1, False),      # YOLOv5's stem
    ((2, 8, 17, 13), 16, 3, 2, 1, 1, False),     # odd sizes, stride 2
    ((3, 16, 10, 10), 16, 3, 1, 1, 1, False),
    ((2, 16, 9, 9), 32, 1, 1, 0, 1, False),      # 1x1
    ((1, 4, 7, 7), 4, 5, 1, 2, 1, False),
    ((2, 16, 10, 10), 16, 3, 1, 1, 16, False),   # depth-wise (YOLO11's and YOLO26's heads, PSA)
    ((2, 16, 11, 11), 16, 3, 2, 1, 16, False),   # depth-wise, stride 2
    ((2, 16, 8, 8), 32, 3, 1, 1, 4, False),      # grouped, two outputs per group
    ((2, 16, 9, 9), 7, 1, 1, 0, 1, True),        # a detection head's last 1x1, with its bias
    ((2, 8, 10, 10), 8, 3, 1, 1, 8, True),       # depth-wise with a bias
]


@pytest.mark.parametrize("shape,out_ch,k,stride,pad,groups,bias", CASES)
def test_values_and_gradients_match_paddle(op, shape, out_ch, k, stride, pad, groups, bias):
    x, w, b = _inputs(shape, out_ch, k, groups, bias)
    got, want = _with_paddle(op, x, w, b, stride, pad, groups)
    for a, r in zip(got, want):
        _close(a, r)


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
        paddle.nn.Conv2D(8, 8, 1, bias_attr=True),                          # taken, with its bias
        paddle.nn.Conv2D(8, 8, 3, padding=1, groups=2, bias_attr=False),    # taken, grouped
        paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8, bias_attr=False),    # taken, depth-wise
        paddle.nn.Conv2D(8, 8, 3, padding=2, dilation=2, bias_attr=False),  # dilated: Paddle's kernel
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
    assert ops_conv.use_onednn_convs(model) == 5
    swapped = [layer for layer in model.sublayers() if "forward" in layer.__dict__]
    assert swapped == [model[i] for i in range(5)]
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
    """The bf16 op where this CPU runs it (what --amp on a CPU checks first); a CPU without AVX512-BF16 or AMX skips
    these tests with its reason: oneDNN has no bf16 convolution there, and creating one aborts the process."""
    from ppmulti.rank.engine.hooks.amp import cpu_bf16_problem

    problem = cpu_bf16_problem()
    if problem is not None:
        pytest.skip(f"bf16 convolutions cannot run here: {problem}")
    return ops_conv.load_bf16_op()


@pytest.mark.parametrize("shape,out_ch,k,stride,pad,groups,bias", [CASES[i] for i in (0, 1, 2, 3, 5, 8)])
def test_bf16_values_and_gradients_are_close_to_paddle_float32(bf16_op, shape, out_ch, k, stride, pad, groups, bias):
    """float32 in and out; within bf16's precision of Paddle's float32 conv2d, and really computed in bf16
    (further from it than the float32 op is)."""
    x, w, b = _inputs(shape, out_ch, k, groups, bias)
    got, want = _with_paddle(bf16_op, x, w, b, stride, pad, groups)
    for a, r in zip(got, want):
        assert a.dtype == paddle.float32
        _close(a, r, rtol=BF16_RTOL)
    for a, r in zip(got[:3], want[:3]):   # the bias gradient is a float32 sum of float32 gradients
        assert float((a - r).abs().max()) / float(r.abs().max()) > 1e-5   # not float32 in disguise


def test_bf16_swap_keeps_float32_weights_and_state(bf16_op):
    model = _mixed_model()
    keys = {k: v.dtype for k, v in model.state_dict().items()}
    assert ops_conv.use_onednn_convs(model, bf16=True) == 5
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
