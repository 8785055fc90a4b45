"""The oneDNN SiLU op: same values and gradients as F.silu, which layers it takes, PPMULTI_CPU_CONV=paddle."""

from __future__ import annotations

import numpy as np
import pytest

import ppmulti.rank.models  # noqa: F401  registers the YOLOv5 modules (and imports ppdet quietly)
import paddle
import paddle.nn.functional as F

from ppmulti.rank.models.yolov5 import YOLOv5CSPDarkNet, YOLOv5CSPPAN, fused_silu_layers
from ppmulti.rank.ops import conv as ops_conv
from ppmulti.rank.ops import cpu as ops_cpu
from toys import sgd_losses
from ppmulti.rank.ops import silu as ops_silu


@pytest.fixture(scope="module")
def op():
    return ops_silu.load_op()   # the convolution's library: built once per machine (~/.cache/ppmulti/ops)


def _close(a, b, rtol=2e-6):
    scale = float(b.abs().max()) or 1.0
    assert float((a - b).abs().max()) / scale < rtol


@pytest.mark.parametrize("shape", [
    (2, 3, 5, 7),        # odd sizes
    (4, 16, 32, 32),
    (1, 8, 17, 13),
    (3, 64, 9, 9),
    (7,),                # any rank
    (3, 5),
    (2, 3, 4, 5, 6),
])
def test_values_and_gradients_match_paddle(op, shape):
    paddle.seed(0)
    x = paddle.randn(shape) * 4
    x.stop_gradient = False
    y = op(x)
    ref = F.silu(x)
    assert y.shape == ref.shape and y.dtype == paddle.float32
    _close(y, ref)
    g = paddle.randn(shape)
    (dx,) = paddle.grad(y, [x], g)
    (rdx,) = paddle.grad(ref, [x], g)
    _close(dx, rdx)


def test_extreme_inputs_stay_finite(op):
    """Exact values and gradients far out on both sides (float64 reference): oneDNN's gradient stays finite
    where Paddle 3.3.1's own silu gradient is NaN (x <= -100 gives inf * 0 there)."""
    values = np.array([-1e4, -100.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 100.0, 1e4], "float32")
    x = paddle.to_tensor(values)
    x.stop_gradient = False
    y = op(x)
    (dx,) = paddle.grad(y, [x], paddle.ones_like(x))
    v = values.astype("float64")
    sig = np.exp(-np.logaddexp(0.0, -v))   # sigmoid without overflow
    np.testing.assert_allclose(y.numpy(), v * sig, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(dx.numpy(), sig * (1 + v * (1 - sig)), rtol=1e-5, atol=1e-6)


def test_non_contiguous_input_and_its_gradient(op):
    full = paddle.randn([2, 6, 8, 8])
    full.stop_gradient = False
    view = full[:, 1:5]
    assert not view.is_contiguous()
    y = ops_silu.silu(view)
    ref = F.silu(view)
    _close(y, ref)
    g = paddle.randn(ref.shape)
    (dfull,) = paddle.grad(y, [full], g)
    (rdfull,) = paddle.grad(ref, [full], g)
    _close(dfull, rdfull)
    assert float(dfull[:, 0].abs().max()) == 0.0


def test_what_the_op_cannot_take_goes_to_paddle(op):
    x64 = paddle.randn([2, 3, 4, 4], dtype="float64")
    np.testing.assert_allclose(ops_silu.silu(x64).numpy(), F.silu(x64).numpy())
    empty = paddle.randn([0, 3])
    assert ops_silu.silu(empty).shape == [0, 3]


def _yolov5_neck():
    """YOLOv5n's backbone and neck (its conv+BN+SiLU layers), as ppmulti builds them."""
    paddle.seed(2)
    backbone = YOLOv5CSPDarkNet(depth_mult=0.33, width_mult=0.25)
    neck = YOLOv5CSPPAN(depth_mult=0.33, in_channels=[c.channels for c in backbone.out_shape])
    return paddle.nn.LayerList([backbone, neck])


def _forward(model, x):
    backbone, neck = model
    return neck(backbone({"image": x}))


def _five_sgd_losses(convert) -> list[float]:
    """Five SGD steps on one fixed batch (``convert(model)`` first, when given): the losses. A small step and
    4 images: with larger steps or BatchNorm over fewer values, rounding differences alone grow to 1e-3."""
    model = _yolov5_neck()
    if convert is not None:
        convert(model)
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((4, 3, 64, 64)).astype("float32"))
    return sgd_losses(model, lambda m, x: sum(((o - 1) ** 2).mean() for o in _forward(m, x)), [x] * 5, lr=0.001)


def test_yolov5_layers_are_swapped_and_nothing_else(op):
    model = _yolov5_neck()
    fused = fused_silu_layers(model)
    assert len(fused) > 20
    keys = list(model.state_dict())
    x = paddle.randn([2, 3, 64, 64])
    model.eval()   # BN on running statistics: the same output twice
    before = _forward(model, x)
    assert ops_silu.use_onednn_silus(model) == len(fused)
    assert fused_silu_layers(model) == []
    for out, ref in zip(_forward(model, x), before):
        _close(out, ref, rtol=1e-5)
    assert list(model.state_dict()) == keys     # checkpoints are unchanged


def test_a_model_without_the_pattern_is_untouched(op):
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3, bias_attr=False), paddle.nn.BatchNorm2D(8),
                                 paddle.nn.Silu())
    assert ops_silu.use_onednn_silus(model) == 0
    assert not any("forward" in layer.__dict__ for layer in model.sublayers())


def test_training_steps_follow_paddle_kernels(op, monkeypatch):
    """Five SGD steps of YOLOv5n's backbone and neck: the same losses with the SiLU op alone, and with
    the trainer's whole CPU set-up (oneDNN convolutions and SiLU), as with Paddle's kernels."""
    monkeypatch.delenv("PPMULTI_CPU_CONV", raising=False)
    notes = []
    paddle_losses = _five_sgd_losses(None)
    silu_losses = _five_sgd_losses(ops_silu.use_onednn_silus)
    both_losses = _five_sgd_losses(lambda m: notes.append(ops_cpu.setup_cpu_ops(m)))
    np.testing.assert_allclose(silu_losses, paddle_losses, rtol=1e-4)
    np.testing.assert_allclose(both_losses, paddle_losses, rtol=1e-4)
    assert all(b < a for a, b in zip(paddle_losses, paddle_losses[1:]))
    n = len(fused_silu_layers(_yolov5_neck()))
    assert notes[0].startswith("oneDNN float32 for ") and notes[0].endswith(f"; oneDNN SiLU in {n} layers")


def test_choice_paddle_keeps_paddle_silu(monkeypatch):
    monkeypatch.setenv("PPMULTI_CPU_CONV", "paddle")
    model = _yolov5_neck()
    n = len(fused_silu_layers(model))
    assert "PPMULTI_CPU_CONV=paddle" in ops_cpu.setup_cpu_ops(model)
    assert len(fused_silu_layers(model)) == n
    assert not any(getattr(layer.__dict__.get("forward"), "__func__", None) is ops_silu._conv_bn_onednn_silu
                   for layer in model.sublayers())


def _tensors(out) -> list:
    """Every tensor in a head's output (a tensor, or dicts and lists of them)."""
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return [out]


def test_ultralytics_conv_layers_are_swapped_and_give_paddles_gradients(op, monkeypatch):
    """YOLO11n's conv+BN+SiLU layers take the op (those without SiLU keep their own forward), and with the
    trainer's CPU set-up (oneDNN convolutions, depth-wise and biased ones included, and SiLU) the whole model
    gives Paddle's kernels' loss and gradients, every parameter's to rounding."""
    from ppmulti.rank.models.ultra_blocks import Conv, silu_conv_layers
    from ppmulti.rank.models.ultra_model import UltraDetectionModel

    monkeypatch.delenv("PPMULTI_CPU_CONV", raising=False)

    def build():
        paddle.seed(3)
        return UltraDetectionModel("yolo11n.yaml", nc=3)

    model = build()
    convs = [layer for layer in model.sublayers() if isinstance(layer, Conv)]
    with_silu = silu_conv_layers(model)
    assert 0 < len(with_silu) < len(convs)   # some Conv layers have no activation (act=False)
    assert ops_silu.use_onednn_silus(model) == len(with_silu) and silu_conv_layers(model) == []
    assert not any("forward" in layer.__dict__ for layer in convs if layer not in with_silu)

    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 96, 96)).astype("float32"))

    def loss_and_grads(convert):
        net = build()
        if convert is not None:
            convert(net)
        loss = sum((o ** 2).mean() for o in _tensors(net(x)))
        loss.backward()
        return float(loss), {name: p.grad.numpy() for name, p in net.named_parameters() if p.grad is not None}

    notes = []
    loss, grads = loss_and_grads(None)
    op_loss, op_grads = loss_and_grads(lambda m: notes.append(ops_cpu.setup_cpu_ops(m)))
    n_convs = sum(isinstance(layer, paddle.nn.Conv2D) for layer in build().sublayers())
    assert notes[0] == f"oneDNN float32 for {n_convs} conv layers; oneDNN SiLU in {len(with_silu)} layers"
    assert abs(op_loss - loss) / loss < 1e-5 and grads.keys() == op_grads.keys()
    for name, g in grads.items():   # a gradient that is zero in exact arithmetic is rounding on both sides
        assert np.abs(op_grads[name] - g).max() <= 1e-3 * np.abs(g).max() + 1e-7, name


def _with_running_statistics(model, seed: int = 0) -> None:
    """Every BatchNorm given statistics and an affine transform far from the identity, so that folding them into
    the convolutions changes every weight."""
    rng = np.random.default_rng(seed)
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            n = layer._mean.shape[0]
            for tensor, values in ((layer._mean, rng.normal(0, 0.5, n)), (layer._variance, rng.uniform(0.3, 2, n)),
                                   (layer.weight, rng.uniform(0.5, 1.5, n)), (layer.bias, rng.normal(0, 0.2, n))):
                tensor.set_value(paddle.to_tensor(values.astype("float32")))


@pytest.mark.parametrize("name", ["yolo11n.yaml", "yolov8n.yaml"])
def test_fused_inference_gives_the_models_eval_outputs(op, name, monkeypatch):
    """In eval mode under ``fused_for_inference`` every swapped conv+BN+SiLU layer (depth-wise and strided ones
    included) runs as one inference convolution with BatchNorm folded in and SiLU fused: the model's outputs equal
    its unfused eval outputs to rounding. On exit nothing of it is left, and training mode never takes it."""
    from ppmulti.rank.models.ultra_model import UltraDetectionModel

    monkeypatch.delenv("PPMULTI_CPU_CONV", raising=False)
    paddle.seed(5)
    model = UltraDetectionModel(name, nc=3)
    _with_running_statistics(model)
    swapped = ops_silu.use_onednn_silus(model)
    ops_conv.use_onednn_convs(model)
    model.eval()
    x = paddle.to_tensor(np.random.default_rng(1).random((3, 3, 96, 128)).astype("float32"))
    with paddle.no_grad():
        want = _tensors(model(x))
        with ops_silu.fused_for_inference(model) as fused:
            got = _tensors(model(x))
            assert all("_fused_inference" in layer.__dict__ for layer in model.sublayers()
                       if getattr(layer.__dict__.get("forward"), "__func__", None) is ops_silu._conv_bn_onednn_silu)
        assert not any("_fused_inference" in layer.__dict__ for layer in model.sublayers())
        again = _tensors(model(x))
    assert fused == swapped > 50
    for a, b in zip(got, want):
        _close(a, b, rtol=2e-5)
    for a, b in zip(again, want):
        assert float((a - b).abs().max()) == 0.0


def test_fused_inference_gives_yolov5s_eval_outputs(op, monkeypatch):
    """YOLOv5's fused conv+BN+SiLU layers (backbone and neck) fold the same way: eval outputs to rounding."""
    monkeypatch.delenv("PPMULTI_CPU_CONV", raising=False)
    model = _yolov5_neck()
    _with_running_statistics(model, seed=3)
    swapped = ops_silu.use_onednn_silus(model)
    ops_conv.use_onednn_convs(model)
    model.eval()
    x = paddle.randn([2, 3, 64, 96])
    with paddle.no_grad():
        want = _forward(model, x)
        with ops_silu.fused_for_inference(model) as fused:
            got = _forward(model, x)
    assert fused == swapped > 20
    for a, b in zip(got, want):
        _close(a, b, rtol=2e-5)


def test_fused_inference_leaves_training_and_paddle_convolutions_alone(op, monkeypatch):
    """A model in training mode inside the block computes its unfused training outputs (batch statistics), and
    layers whose convolution is not oneDNN's float32 op (here Paddle's kernel; the same check refuses bf16's)
    are not fused."""
    from ppmulti.rank.models.ultra_model import UltraDetectionModel

    monkeypatch.delenv("PPMULTI_CPU_CONV", raising=False)
    paddle.seed(6)
    model = UltraDetectionModel("yolo11n.yaml", nc=3)
    ops_silu.use_onednn_silus(model)   # SiLU swapped, convolutions left to Paddle
    with ops_silu.fused_for_inference(model) as fused:
        assert fused == 0
    ops_conv.use_onednn_convs(model)
    model.train()
    x = paddle.to_tensor(np.random.default_rng(2).random((2, 3, 64, 64)).astype("float32"))
    want = _tensors(model(x))
    with ops_silu.fused_for_inference(model) as fused:
        assert fused > 0
        got = _tensors(model(x))
    for a, b in zip(got, want):
        assert float((a - b).abs().max()) == 0.0


@pytest.mark.parametrize("k,stride,pad,groups,silu", [(3, 1, 1, 1, True), (3, 2, 1, 1, False), (3, 1, 1, 8, True),
                                                      (1, 1, 0, 1, True), (5, 2, 2, 4, False)])
def test_inference_op_is_conv_bias_and_silu(op, k, stride, pad, groups, silu):
    """The inference op alone: Paddle's conv2d with the bias, then F.silu when asked, to rounding."""
    rng = np.random.default_rng(k * 10 + groups)
    x = paddle.to_tensor(rng.standard_normal((2, 8, 13, 11)).astype("float32"))
    w = paddle.to_tensor(rng.standard_normal((16, 8 // groups, k, k)).astype("float32"))
    b = paddle.to_tensor(rng.standard_normal(16).astype("float32"))
    run = ops_silu.compat.custom_op_runner(ops_silu.INFER_OP_NAME)
    got = run(x, w, b, [stride, stride], [pad, pad], groups, silu)[0]
    want = F.conv2d(x, w, b, stride=stride, padding=pad, groups=groups)
    _close(got, F.silu(want) if silu else want, rtol=2e-6)
