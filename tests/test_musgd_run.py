"""MuSGD as a run's optimizer (engine/musgd_run.py): a tiny YOLO26n's groups, steps through OptimStep (clipping at
a global norm of 10, the schedule's lr x each group's gain) checked against MuSGD's arithmetic done by hand, the
warmup's momentum and bias factors, a checkpoint round trip, and optimizer=auto's config building it."""

from __future__ import annotations

import numpy as np
import pytest

import paddle  # noqa: E402 (installed with ppmulti)

from ppmulti.common.errors import UserError  # noqa: E402
from ppmulti.rank import compat  # noqa: E402
from ppmulti.rank.engine import ultra_recipe as R  # noqa: E402
from ppmulti.rank.engine.musgd import muon_update  # noqa: E402
from ppmulti.rank.engine.musgd_run import ScheduledMuSGD, from_config, model_groups, refuse_amp  # noqa: E402
from ppmulti.rank.engine.optim_step import OptimStep, take_clip  # noqa: E402


def _model(seed: int = 0):
    from ppmulti.rank.models.ultra_model import UltraDetectionModel

    paddle.seed(seed)
    return UltraDetectionModel("yolo26n.yaml", nc=3)


def _loss(model, scale: float):
    out = model(paddle.to_tensor(np.random.RandomState(1).rand(1, 3, 32, 32).astype("float32")))
    heads = out["one2many"] if isinstance(out, dict) and "one2many" in out else out
    tensors = [t for t in (heads.values() if isinstance(heads, dict) else heads) if isinstance(t, paddle.Tensor)]
    return sum((t * t).mean() for t in tensors) * scale


@pytest.fixture(scope="module")
def tiny():
    return _model()


def test_groups_as_ultralytics_makes_them(tiny):
    specs, named = model_groups(tiny, 5e-4)
    head = f"model.{len(tiny.model) - 1}."   # the Detect head: its class branches cv3 and one2one_cv3
    kinds = {(s.kind, s.lr_gain) for s in specs}
    assert kinds == {("muon", 3.0), ("muon", 1.0), ("bias", 3.0), ("bias", 1.0), ("bn", 3.0), ("bn", 1.0)}
    for s in specs:
        assert s.weight_decay == (5e-4 if s.kind == "muon" else 0.0)
        for n in s.names:
            assert (s.lr_gain == 3.0) == n.startswith((head + "cv3.", head + "one2one_cv3.")), n
            assert (s.kind == "muon") == (len(named[n].shape) in (2, 4)), n
    # every trainable parameter once; BatchNorm's running statistics (frozen) are not MuSGD's
    listed = [n for s in specs for n in s.names]
    assert len(listed) == len(set(listed)) == sum(1 for p in tiny.parameters() if not p.stop_gradient)


def _snapshot(opt):
    return {id(p): (p.numpy().copy(), None if p.grad is None else p.grad.numpy().copy())
            for p in opt._parameter_list}


def _expected_first_step(opt, clipped, lr, momentum):
    """MuSGD's first step by hand (zero buffers) on the gradients as clipped: per group, Muon (muon_update: buffer
    (1 - m) g, Nesterov look-ahead, Newton-Schulz, x sqrt(max(1, rows / cols))) at lr x gain x 0.2, then Nesterov
    SGD with L2 decay on the moved weights at lr x gain x 1; other groups the SGD part alone."""
    out = {}
    for group in opt.param_groups:
        glr = lr * group["lr_gain"]
        for p in group["params"]:
            w, g = clipped[id(p)]
            if g is None:
                continue
            if group["use_muon"]:
                upd = muon_update(paddle.to_tensor(g), paddle.zeros(g.shape), momentum).numpy()
                w = w - glr * 0.2 * upd
            g2 = g + group["weight_decay"] * w
            w = w - glr * (g2 + momentum * g2)   # SGD buffer after one step: g2; Nesterov: g2 + m x buf
            out[id(p)] = w
    return out


def test_steps_through_optim_step_as_musgd_by_hand():
    model = _model(1)
    sched = paddle.optimizer.lr.LinearWarmup(0.01, 4, 0.0, 0.01)
    sched.step()   # warmup batch 1: lr 0.0025
    opt = from_config({"clip_grad_by_norm": 10.0, "optimizer": {"type": "MuSGD", "momentum": 0.9,
                                                                 "use_nesterov": True},
                       "regularizer": {"type": "L2", "factor": 5e-4}}, sched, model)
    clip_norm, clip = take_clip(opt)
    assert clip_norm == 10.0 and opt._grad_clip is None   # the step clips once, over all groups
    step = OptimStep(opt, model=model, clip_norm=clip_norm, clip=clip)
    step.backward(_loss(model, 1e4))   # large enough for the global norm to pass 10
    raw = _snapshot(opt)
    clipped = {}
    inner_step = opt.step

    def watched():   # what MuSGD is handed: the gradients after OptimStep's clipping
        clipped.update(_snapshot(opt))
        inner_step()

    opt.step = watched
    step.step()
    grads = [g for _, g in raw.values() if g is not None]
    norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)))
    assert norm > 20   # the clipping did something: one global norm over every group, scaled to 10
    for key, (_, g) in raw.items():
        if g is not None:
            np.testing.assert_allclose(clipped[key][1], g * (10.0 / norm), rtol=1e-4, atol=1e-12)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.0025 * g["lr_gain"] for g in opt.param_groups])
    expected = _expected_first_step(opt, clipped, 0.0025, 0.9)
    moved = 0
    for p in opt._parameter_list:
        if id(p) not in expected:
            continue
        want, start = expected[id(p)], raw[id(p)][0]
        size = np.abs(want - start).max()
        assert np.abs(p.numpy() - want).max() <= 1e-4 * size + 1e-8, p.name
        moved += int(size > 0)
    assert moved > 100
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in opt._parameter_list)   # zeroed


def test_schedule_momentum_and_bias_factor_reach_the_groups(tiny):
    sched = paddle.optimizer.lr.LinearWarmup(0.01, 10, 0.0, 0.01)
    opt = ScheduledMuSGD(tiny, sched, momentum=0.9, weight_decay=5e-4)
    for _ in range(3):
        sched.step()
    assert opt.get_lr() == pytest.approx(0.003)
    opt.step()   # no gradients: only the lrs are set
    assert {g["lr_gain"]: g["lr"] for g in opt.param_groups} == pytest.approx({1.0: 0.003, 3.0: 0.009})
    # YOLOv5's warmup (hooks.warmup) drives the momentum through compat, and the biases through their factor
    assert compat.optimizer_momentum(opt) == 0.9
    compat.set_optimizer_momentum(opt, 0.85)
    assert {g["momentum"] for g in opt.param_groups} == {0.85}
    bias = next(p for g in opt.param_groups if g["param_group"] == "bias" for p in g["params"])
    bias.optimize_attr["learning_rate"] = 10.0
    before = bias.numpy().copy()
    (bias * paddle.ones_like(bias)).sum().backward()
    opt.step()
    opt.clear_grad()
    bias.optimize_attr["learning_rate"] = 1.0
    # first SGD step, Nesterov: lr x factor x (g + m x g), g = 1
    gain = next(g["lr_gain"] for g in opt.param_groups if any(p is bias for p in g["params"]))
    assert before - bias.numpy() == pytest.approx(np.full_like(before, 0.003 * gain * 10.0 * 1.85), rel=1e-4)


def test_checkpoint_round_trip_restores_the_buffers(tmp_path):
    model = _model(2)
    opt = ScheduledMuSGD(model, 0.01, momentum=0.9, weight_decay=5e-4)
    _loss(model, 1.0).backward()
    opt.step()
    opt.clear_grad()
    path = tmp_path / "opt.pdstate"
    paddle.save({"optimizer": opt.state_dict()}, str(path))
    saved = opt.state_dict()
    assert any("cv3" in k for k in saved["state"]) and all(not k.startswith(("conv2d_", "linear_"))
                                                           for k in saved["state"])   # structured names
    # a fresh process builds the same model under other automatic Paddle names
    other = _model(3)
    other.set_state_dict(model.state_dict())   # the resume loads the weights as saved
    assert {p.name for p in other.parameters()} != {p.name for p in model.parameters()}
    fresh = ScheduledMuSGD(other, 0.01, momentum=0.9, weight_decay=5e-4)
    fresh.set_state_dict(paddle.load(str(path))["optimizer"])
    assert len(fresh.state) == len(opt.state) > 100
    for p_old, p_new in zip(opt._parameter_list, fresh._parameter_list):
        for key, buf in opt.state.get(p_old.name, {}).items():   # a parameter without gradient has none
            np.testing.assert_array_equal(fresh.state[p_new.name][key].numpy(), buf.numpy())
    # and the next step moves both alike
    for m, o in ((model, opt), (other, fresh)):
        _loss(m, 1.0).backward()
        o.step()
        o.clear_grad()
    for a, b in zip(opt._parameter_list, fresh._parameter_list):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)
    with pytest.raises(UserError, match="not MuSGD's"):
        fresh.set_state_dict({"conv2d_0.w_0_velocity_0": paddle.zeros([1])})


def test_optimizer_auto_past_10000_steps_builds_musgd(tiny):
    from test_ultra_recipe import _auto_cfg, _batch

    cfg = _auto_cfg(nc=80, epochs=100)
    R.choose_for_run(cfg, range(118287), _batch(64, 1), 64)
    builder = cfg["OptimizerBuilder"]
    assert R.wants_musgd(builder)
    opt = from_config(builder, cfg["LearningRate"]["base_lr"], tiny)   # as the engine's _build_parts does
    assert isinstance(opt, ScheduledMuSGD) and opt.get_lr() == 0.01 and opt.momentum == 0.9
    assert (opt.muon, opt.sgd) == (R.MUSGD_MUON, R.MUSGD_SGD)
    assert opt._grad_clip.clip_norm == 10.0
    assert {g["weight_decay"] for g in opt.param_groups if g["use_muon"]} == {0.0005}


def test_config_keys_musgd_cannot_take_and_o2_are_one_line(tiny):
    with pytest.raises(UserError, match="MuSGD takes momentum and use_nesterov; remove beta1"):
        from_config({"optimizer": {"type": "MuSGD", "beta1": 0.9}}, 0.01, tiny)
    with pytest.raises(UserError, match="amp_level O2"):
        refuse_amp("float16", "O2")
    refuse_amp("float16", "O1")
    refuse_amp("bfloat16", "O1")
