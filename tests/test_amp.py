"""Mixed precision: flags and keys, the device's say, Paddle's O1 lists, GradScaler state and resume, CPU bf16."""

from __future__ import annotations

import json
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from conftest import DEMO_CONFIG, demo_overrides, run_tool

from ppmulti.common import train_flags
from ppmulti.rank import compat
from ppmulti.common.cpus import cpu_flags
from ppmulti.common.errors import UserError
from ppmulti.rank.engine.hooks import amp

CPU_HAS_BF16 = bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


# ----------------------------------------------------------------------------- the mapping (pure)
# (--amp flag, config amp, config amp_level, device, YOLOv5-style run) -> (on, level, source contains)
REQUESTS = [
    ((None, None, None, "gpu", False), (False, "O1", "")),                     # ppdet-style: off unless asked
    ((None, None, None, "cpu", True), (False, "O1", "")),                      # YOLOv5 default is for CUDA only
    ((None, None, None, "gpu", True), (True, "O1", "YOLOv5-style")),           # YOLOv5-style on GPUs: on
    ((False, None, None, "gpu", True), (False, "O1", "--no-amp")),             # ... and --no-amp turns it off
    ((None, False, None, "gpu", True), (False, "O1", "amp: false")),           # ... as does amp: false
    ((True, None, None, "cpu", False), (True, "O1", "--amp")),
    ((None, True, None, "cpu", False), (True, "O1", "amp: true")),             # -o amp=true now does something
    ((None, True, "O2", "gpu", False), (True, "O2", "amp: true")),             # ppdet's amp_level
    ((None, True, "o2", "gpu", False), (True, "O2", "amp: true")),
    ((True, False, None, "gpu", False), (True, "O1", "--amp")),                # the flag beats the config
    ((False, True, None, "gpu", False), (False, "O1", "--no-amp")),
]


@pytest.mark.parametrize("args,expected", REQUESTS)
def test_request_table(args, expected):
    req = amp.request(*args)
    assert (req.on, req.level) == expected[:2]
    assert expected[2] in req.source


@pytest.mark.parametrize("cfg_amp,level,needle", [("yes", None, "amp: 'yes' is not true or false"),
                                                   (True, "O3", "amp_level 'O3' is not O1 or O2")])
def test_bad_keys_are_one_line_errors(cfg_amp, level, needle):
    with pytest.raises(UserError, match=needle):
        amp.request(None, cfg_amp, level, "gpu", False)


def test_flags_parse_both_ways():
    assert train_flags.parse(["-c", "x.yml", "--amp"]).amp is True
    assert train_flags.parse(["-c", "x.yml", "--no-amp"]).amp is False
    assert train_flags.parse(["-c", "x.yml"]).amp is None


def test_options_carry_the_flag_and_the_yolov5_default():
    from ppmulti.rank.entry import resolve

    ppdet = resolve(train_flags.parse(["-c", str(DEMO_CONFIG), "--amp"]))
    assert (ppdet.amp, ppdet.amp_default) == (True, False)
    yolo = resolve(train_flags.parse(["--cfg", "yolov5n", "--no-amp"]))
    assert (yolo.amp, yolo.amp_default) == (False, True)


def test_plan_on_each_device():
    on = amp.AmpRequest(True, "O1", "--amp")
    assert amp.plan(on, "gpu", lambda: "never asked").mode == "float16"
    cpu = amp.plan(on, "cpu", lambda: None)
    assert cpu.mode == "bfloat16" and "bfloat16" in cpu.note
    nothing = amp.plan(on, "cpu", lambda: "this CPU has no AVX512-BF16 or AMX")
    assert nothing.mode == "off" and nothing.note.startswith("--amp has no effect here: this CPU has no AVX512-BF16")
    assert "\n" not in nothing.note
    assert amp.plan(amp.AmpRequest(False, "O1", ""), "gpu", lambda: None).note == ""


def test_cpu_flags_and_bf16_problem(monkeypatch):
    text = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert cpu_flags(text) == frozenset({"fpu", "sse2", "avx512f", "avx512_bf16"})
    assert "no AVX512-BF16 or AMX" in amp.cpu_bf16_problem(frozenset({"avx512f"}))
    monkeypatch.setenv("PPMULTI_CPU_CONV", "paddle")
    assert "PPMULTI_CPU_CONV=paddle" in amp.cpu_bf16_problem(frozenset({"amx_bf16"}))
    monkeypatch.delenv("PPMULTI_CPU_CONV")
    if CPU_HAS_BF16:   # this machine (AMD EPYC, AVX512-BF16): oneDNN agrees, bf16 runs
        assert amp.cpu_bf16_problem() is None


# ----------------------------------------------------------------------------- Paddle's O1 lists
def test_o1_casts_the_convolutions_and_honours_custom_lists():
    """Which layers O1 computes in float16, against Paddle's own lists: every conv of YOLOv5n; none when a
    config's custom_black_list names conv2d; batch norm and activations never (not on the white list)."""
    import paddle
    from paddle.amp import amp_lists

    from ppmulti.rank import config as config_mod
    from ppmulti.rank.yolo_config import resolve_cfg
    from ppdet.core.workspace import create

    white, black = amp_lists.white_list()["float16"]["O1"], amp_lists.black_list()["float16"]["O1"]
    assert "conv2d" in white and "batch_norm" not in white and "sigmoid" not in white and "exp" in black
    cfg = config_mod.load(resolve_cfg("yolov5n").config, ["num_classes=3"])
    model = create(cfg.architecture)
    convs = {n for n, layer in model.named_sublayers() if type(layer) is paddle.nn.Conv2D}
    cast = amp.o1_float16_ops(model)
    assert set(cast) == convs and len(convs) == 60 and set(cast.values()) == {"conv2d"}
    assert amp.o1_float16_ops(model, custom_black_list=["conv2d"]) == {}
    assert not any(isinstance(dict(model.named_sublayers())[n], paddle.nn.BatchNorm2D) for n in cast)


# ----------------------------------------------------------------------------- GradScaler on CPU
# Paddle enables GradScaler only on GPU places and only under a float16 autocast. These two patches let its
# real dynamic loss scaling (Paddle's own check_finite_and_unscale and update code) run on CPU in float32.
GPU_LIKE_SCALER = textwrap.dedent("""
    import contextlib, types
    import ppmulti.rank   # ppmulti's order before paddle (compat.before_paddle_import: zlib first)
    import paddle.amp.grad_scaler as gs

    _tracer = gs._dygraph_tracer

    class _Place:
        def __init__(self, place): self.place = place
        def is_gpu_place(self): return True
        def __getattr__(self, name): return getattr(self.place, name)

    class _Tracer:
        def __init__(self, tracer): self.tracer, self._expected_place = tracer, _Place(tracer._expected_place)
        def __getattr__(self, name): return getattr(self.tracer, name)

    gs._dygraph_tracer = lambda: _Tracer(_tracer())
    gs.amp_global_state = lambda: types.SimpleNamespace(amp_dtype="float16")
""")


@pytest.fixture
def cpu_scaler(monkeypatch):
    import paddle.amp.grad_scaler as gs

    for name in ("_dygraph_tracer", "amp_global_state"):   # put back after the test
        monkeypatch.setattr(gs, name, getattr(gs, name))
    exec(GPU_LIKE_SCALER, {})   # noqa: S102 - the same text patches the training process below
    return gs


def _float16_hook(init_scale=1024.0):
    hook = amp.MixedPrecisionHook(amp.AmpRequest(True, "O1", "--amp"))
    trainer = types.SimpleNamespace(cfg={"init_loss_scaling": init_scale}, device="gpu", model=None, optimizer=None)
    hook.setup(trainer)
    assert hook.mode == "float16" and hook.scaler is not None and hook.scaler.is_enable()
    return hook


def test_skipped_steps_and_scale_survive_a_checkpoint(cpu_scaler, tmp_path):
    import paddle

    from ppmulti.rank.engine import checkpoint as ckpt

    from ppmulti.rank.engine.optim_step import OptimStep

    hook = _float16_hook()
    layer = paddle.nn.Linear(2, 1)
    opt = paddle.optimizer.SGD(0.1, parameters=layer.parameters())
    step = OptimStep(opt, scaler=hook.scaler)   # the Trainer's step, given the hook's scaler
    trainer = types.SimpleNamespace(optim=step, optimizer_stepped=True)
    hook.before_epoch(None, 0)
    for factor in (1.0, float("inf"), 1.0, float("nan")):
        before = layer.weight.numpy().copy()
        step.backward(layer(paddle.to_tensor([[1.0, 2.0]]) * factor).mean())
        assert step.step() is bool(np.isfinite(factor))
        hook.after_step(trainer, 0, 0, None, 0.1, 0.0)
        assert np.isfinite(layer.weight.numpy()).all() and not layer.weight.grad.numpy().any()
        if not np.isfinite(factor):
            np.testing.assert_array_equal(layer.weight.numpy(), before)   # the step was skipped
    stats = types.SimpleNamespace(epoch=0, amp=None)
    hook.after_epoch(None, stats)
    assert stats.amp == {"skipped_steps": 2, "loss_scale": 256.0}
    saved = hook.state_dict()
    assert saved["skipped_steps"] == 2 and saved["scaler"]["decr_count"] == 0

    state = ckpt.TrainState(epoch=1, global_step=4, world_size=2, global_batch=8)
    ckpt.save(tmp_path / "last", layer, layer.state_dict(), opt, None, state, {"amp": saved})
    payload = ckpt.load_state(tmp_path / ("last" + ckpt.STATE))
    fresh = _float16_hook(init_scale=65536.0)
    fresh.load_state_dict(ckpt.hook_states(payload)["amp"])
    assert fresh.loss_scale() == 256.0 and fresh.skipped_total == 2
    assert fresh.state_dict()["scaler"]["incr_count"] == saved["scaler"]["incr_count"]


def test_paddle3_scaler_update_bug_is_worked_around(cpu_scaler):
    """Paddle 3.3 + numpy >= 2.5: GradScaler.update() raises on the first overflow (it prints float() of a
    shape-[1] tensor); compat.scaler_update gets past it. Paddle 2.6 never had the bug."""
    import paddle

    def overflowed():
        hook = _float16_hook()
        layer = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(0.1, parameters=layer.parameters())
        hook.scaler.scale(layer(paddle.to_tensor([[float("inf"), 1.0]])).mean()).backward()
        hook.scaler.step(opt)
        return hook.scaler

    numpy_refuses = False
    try:
        float(np.array([1.0]))
    except TypeError:
        numpy_refuses = True
    if compat.paddle3() and numpy_refuses:
        with pytest.raises(TypeError, match="0-dimensional"):
            overflowed().update()
    scaler = overflowed()
    compat.scaler_update(scaler)
    assert float(np.asarray(scaler.state_dict()["scale"]).reshape(-1)[0]) == 512.0
    assert list(scaler._scale.shape) == [1]


def test_cpu_without_bf16_trains_float32_and_says_so(monkeypatch):
    hook = amp.MixedPrecisionHook(amp.AmpRequest(True, "O1", "--amp"))
    monkeypatch.setattr(amp, "cpu_bf16_problem", lambda: "this CPU has no AVX512-BF16 or AMX")
    hook.setup(types.SimpleNamespace(cfg={}, device="cpu"))
    assert hook.mode == "off" and hook.scaler is None and hook.state_dict() is None
    hook.load_state_dict({"scaler": {"scale": np.array([8.0])}, "skipped_steps": 3})   # from a GPU run
    assert hook.state_dict()["skipped_steps"] == 3      # carried on for the next GPU resume


# ----------------------------------------------------------------------------- real trainings
def _demo_args(small_demo, out, *extra):
    return ["tools/train.py", "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo),
            "PPYOLOEHead.static_assigner_epoch=1", "--output", str(out), *extra]


@pytest.mark.seam
@pytest.mark.slow
@pytest.mark.skipif(not CPU_HAS_BF16, reason="this CPU has no AVX512-BF16/AMX: --amp has no effect (tested above)")
def test_cpu_bf16_training_runs_and_its_loss_falls(small_demo, tmp_path):
    out = tmp_path / "bf16"
    proc = run_tool(_demo_args(small_demo, out, "--amp", "--epochs", "4"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "train.log").read_text()
    assert "oneDNN bfloat16 (float32 accumulation and weights) for 95 conv layers" in log
    assert "AMP on CPU: convolutions in bfloat16" in log
    import csv

    with open(out / "results.csv", newline="") as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f)]
    assert losses[-1] < losses[0], losses
    import paddle

    weights = paddle.load(str(out / "weights" / "last.pdparams"))
    assert {str(v.dtype) for v in weights.values() if "float" in str(v.dtype)} == {"paddle.float32"}


@pytest.mark.seam
@pytest.mark.slow
def test_amp_without_bf16_convolutions_says_so_and_trains_float32(small_demo, tmp_path):
    out = tmp_path / "noeffect"
    proc = run_tool(_demo_args(small_demo, out, "-o", "amp=true", "--epochs", "1"), env={"PPMULTI_CPU_CONV": "paddle"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in (out / "train.log").read_text().splitlines() if "amp" in line.lower()]
    # the first reason cpu_bf16_problem finds: on a CPU without AVX512-BF16/AMX the CPU's, before the op choice's
    why = "PPMULTI_CPU_CONV=paddle" if CPU_HAS_BF16 else "this CPU has no AVX512-BF16 or AMX"
    assert len(lines) == 1 and f"WARNING amp: true in the config has no effect here: {why}" in lines[0], lines


SCALER_RUN = GPU_LIKE_SCALER + textwrap.dedent("""
    import runpy, sys
    from ppmulti.rank.engine.hooks import amp
    amp.plan = lambda req, device, problem: amp.AmpPlan("float16" if req.on else "off", req.level, "GradScaler on CPU")
    from ppmulti.rank.engine.optim_step import OptimStep
    OptimStep.autocast = lambda self: contextlib.nullcontext()   # no float16 kernels on CPU
    _backward, _calls = OptimStep.backward, [0]

    def backward(self, loss):   # steps 2 and 5 of each process overflow, as float16 steps do (no accumulation here)
        _calls[0] += 1
        return _backward(self, loss * float("inf") if _calls[0] in (2, 5) else loss)

    OptimStep.backward = backward
    sys.argv = ["tools/train.py", *sys.argv[1:]]
    runpy.run_path("tools/train.py", run_name="__main__")
""")


def _amp_state(run: Path) -> tuple[float, int]:
    import paddle

    state = paddle.load(str(run / "weights" / "last.pdstate"))["hooks"]["amp"]
    return float(np.asarray(state["scaler"]["scale"]).reshape(-1)[0]), int(state["skipped_steps"])


@pytest.mark.seam
@pytest.mark.slow
def test_scaler_state_resumes_from_last_pdstate(small_demo, tmp_path):
    """The float16 path's loop with Paddle's GradScaler (computing in float32 on CPU, two overflowing steps per
    process): the skipped steps in the log and the checkpoint, and --resume continuing the scaler's scale."""
    out = tmp_path / "scaled"
    first = run_tool(["-c", SCALER_RUN, *_demo_args(small_demo, out, "--amp", "--epochs", "2")[1:]])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert _amp_state(out) == (256.0, 2)     # 1024 halved twice, two steps skipped
    log = (out / "train.log").read_text()
    assert "AMP skipped 2 steps, loss scale 256" in log and "2 steps of epoch 1 skipped (inf/nan gradients)" in log

    again = run_tool(["-c", SCALER_RUN, *_demo_args(small_demo, out, "--amp", "--epochs", "3")[1:],
                      "--resume", str(out)])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _amp_state(out) == (64.0, 4)      # from the saved 256, not a fresh 1024; the count carried on
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 3
