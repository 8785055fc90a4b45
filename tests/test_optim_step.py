"""The optimizer step (engine.optim_step.OptimStep): accumulation, no_sync, clipping (once, after unscaling), and
the fp32 loop's numbers unchanged by it."""

from __future__ import annotations

import contextlib
import types
from pathlib import Path

import numpy as np
import paddle
import pytest

from conftest import DEMO_CONFIG
from test_amp import cpu_scaler  # noqa: F401 - the fixture: Paddle's GradScaler running on CPU
from toys import ToyModel, toy_batches, toy_trainer

from ppmulti.common.errors import UserError
from ppmulti.rank.engine.hooks import Hook
from ppmulti.rank.engine.lr import Accumulation, BatchPlan
from ppmulti.rank.engine.optim_step import OptimStep, check_clip_norm, take_clip

REPO = Path(__file__).resolve().parents[1]


def _ppdet_optimizer(layer, clip=None, lr=1.0, **extra):
    """The optimizer as builder.py builds it: ppdet's OptimizerBuilder (plain gradient descent, no decay)."""
    from ppdet.optimizer.optimizer import OptimizerBuilder

    return OptimizerBuilder(clip_grad_by_norm=clip, regularizer=None,
                            optimizer={"type": "Momentum", "momentum": 0.0, **extra})(lr, layer)


def _params(layer) -> np.ndarray:
    return np.concatenate([p.numpy().ravel() for p in layer.parameters()])


def _zeroed(layer) -> bool:
    """The gradients were cleared (Paddle's clear_grad sets them to zero)."""
    return all(p.grad is None or not p.grad.numpy().any() for p in layer.parameters())


def _huge_loss(layer):
    """A loss whose gradient has a global norm of about 3.8e6."""
    return (layer(paddle.to_tensor([[1000.0, 2000.0, -3000.0, 500.0]])) * 1000).mean()


# ----------------------------------------------------------------------------- accumulation
def test_steps_on_the_group_ends_with_the_mean_of_its_batches():
    """accumulate 3 over 7 batches: the optimizer steps after batches 3, 6 and 7 (the short last group), and a
    group's step equals one step on its batches together (the loss averaged over the group)."""
    batches = toy_batches(7, batch=2)
    paddle.seed(0)
    model, twin = ToyModel(), ToyModel()
    twin.set_state_dict(model.state_dict())
    step = OptimStep(paddle.optimizer.SGD(0.1, parameters=model.parameters()),
                     accumulation=Accumulation(3, len(batches)))
    flags = step.step_flags(0)
    assert flags == [False, False, True, False, False, True, True]
    ref = paddle.optimizer.SGD(0.1, parameters=twin.parameters())
    group = []
    for data, stepping in zip(batches, flags):
        before = _params(model)
        with step.context(stepping), step.autocast():
            loss = model(data)["loss"]
        step.backward(loss)
        group.append(data)
        if not stepping:
            np.testing.assert_array_equal(_params(model), before)   # gradients wait
            continue
        assert step.step() is True and _zeroed(model)
        # a full group of 3: the mean of three batches' losses is the loss of the three together (same sizes);
        # the short last group of 1 is divided by 3 as well, as YOLOv5's last group of an epoch
        joined = {k: paddle.concat([d[k] for d in group]) for k in ("x", "y")}
        (twin(joined)["loss"] * len(group) / 3).backward()
        ref.step()
        ref.clear_grad()
        np.testing.assert_allclose(_params(model), _params(twin), rtol=1e-5, atol=1e-7)
        group = []


class _FakeDataParallel(paddle.nn.Layer):
    """Stands for Paddle's DataParallel on several ranks: notes whether each forward ran inside no_sync()."""

    def __init__(self, model):
        super().__init__()
        self.model, self.syncing, self.seen = model, True, []

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def forward(self, data):
        self.seen.append(self.syncing)
        return self.model(data)


def test_no_sync_on_the_batches_that_do_not_step():
    """Through the Trainer, accumulate 2 over 5 batches: batches 1 and 3 run in no_sync, 2, 4 and 5 all-reduce."""
    paddle.seed(0)
    model = ToyModel()
    wrapped = _FakeDataParallel(model)
    from ppmulti.rank.engine.trainer import Trainer, RunPlan

    trainer = Trainer(model, toy_batches(5), paddle.optimizer.SGD(0.05, parameters=model.parameters()), epochs=1,
                      cfg={"log_iter": 100}, opts=RunPlan(config="toy.yml"), world=1, rank=0,
                      batch=BatchPlan(2, 2, 1, 2), train_model=wrapped, hooks=[Hook()])
    trainer.train()
    assert wrapped.seen == [False, True, False, True, True] == trainer.optim.step_flags(0)
    assert trainer.optimizer_steps == 3


# ----------------------------------------------------------------------------- clipping
def test_clipping_brings_the_global_norm_to_the_limit():
    paddle.seed(0)
    layer = paddle.nn.Linear(4, 1)
    start = _params(layer)
    step = OptimStep(paddle.optimizer.SGD(1.0, parameters=layer.parameters()), clip_norm=2.5)
    step.backward(_huge_loss(layer))
    assert np.linalg.norm(np.concatenate([p.grad.numpy().ravel() for p in layer.parameters()])) > 1e6
    step.step()
    assert np.linalg.norm(start - _params(layer)) == pytest.approx(2.5, rel=1e-5)   # lr 1: the update is the gradient
    assert "global norm of 2.5" in step.describe()


def test_ppdet_clip_is_taken_off_the_optimizer_and_applied_once_with_its_arithmetic():
    """ppdet's OptimizerBuilder puts ClipGradByGlobalNorm on the optimizer; the step takes it off (so Paddle's
    step does not clip again) and applies the same object: the same weights, bit for bit, as Paddle's own clip
    over a few steps of ordinary gradients (here the toy's norm is above the limit)."""
    batches = toy_batches(4)
    paddle.seed(0)
    mine, paddles = ToyModel(), ToyModel()
    paddles.set_state_dict(mine.state_dict())
    opt = _ppdet_optimizer(mine, clip=0.05, lr=0.1)
    norm, clip = take_clip(opt)
    assert norm == 0.05 and isinstance(clip, paddle.nn.ClipGradByGlobalNorm) and opt._grad_clip is None
    step = OptimStep(opt, clip_norm=norm, clip=clip)
    ref = _ppdet_optimizer(paddles, clip=0.05, lr=0.1)
    for data in batches * 2:
        step.backward(mine(data)["loss"])
        step.step()
        paddles(data)["loss"].backward()
        ref.step()
        ref.clear_grad()
    np.testing.assert_array_equal(_params(mine), _params(paddles))
    assert take_clip(_ppdet_optimizer(paddle.nn.Linear(2, 1))) == (None, None)


def test_param_groups_clip_per_group_as_paddle_does():
    """ppdet's ``param_groups`` (RT-DETR's swin/focalnet configs): Paddle copies the clip into every group and
    clips each group on its own norm; both copies are taken off, and the step clips the same way."""
    paddle.seed(0)
    mine, paddles = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 1)), None
    paddles = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 1))
    paddles.set_state_dict(mine.state_dict())
    groups = [{"params": ["0."], "learning_rate": 0.5}]
    opt = _ppdet_optimizer(mine, clip=1.0, param_groups=groups)
    ref = _ppdet_optimizer(paddles, clip=1.0, param_groups=groups)
    assert len(opt._param_groups) == 2
    norm, clip = take_clip(opt)
    assert norm == 1.0 and all(g["grad_clip"] is None for g in opt._param_groups)
    step = OptimStep(opt, clip_norm=norm, clip=clip)
    step.backward(_huge_loss(mine))
    step.step()
    _huge_loss(paddles).backward()
    ref.step()
    np.testing.assert_array_equal(_params(mine), _params(paddles))


def test_clipping_under_the_scaler_comes_after_unscaling(cpu_scaler):  # noqa: F811
    """float16's GradScaler (run on CPU in float32): the gradients are unscaled before they are clipped, so the
    update has the limit's norm, not the limit / the loss scale (1024); an overflowing step is skipped."""
    paddle.seed(0)
    layer = paddle.nn.Linear(4, 1)
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
    assert scaler.is_enable()
    step = OptimStep(paddle.optimizer.SGD(1.0, parameters=layer.parameters()), scaler=scaler, clip_norm=3.0)
    start = _params(layer)
    step.backward(_huge_loss(layer))
    assert step.step() is True and not step.skipped
    assert np.linalg.norm(start - _params(layer)) == pytest.approx(3.0, rel=1e-5)
    before = _params(layer)
    step.backward(_huge_loss(layer) * float("inf"))
    assert step.step() is False and step.skipped and step.skipped_steps == 1
    np.testing.assert_array_equal(_params(layer), before)
    assert "after unscaling" in step.describe()


def test_clip_norm_must_be_positive():
    assert check_clip_norm(None) is None and check_clip_norm(10) == 10.0
    for bad in (0, -1.0, "10", True):
        with pytest.raises(UserError, match="OptimizerBuilder.clip_grad_by_norm"):
            check_clip_norm(bad)


# ----------------------------------------------------------------------------- from the configs
def test_clip_grad_by_norm_read_from_a_ppdet_config(tmp_path):
    """A PaddleDetection-style config's ``OptimizerBuilder: clip_grad_by_norm`` (RT-DETR, DETR, DINO have 0.1):
    the optimizer ppdet builds from it carries the clip, and the step takes it; ultralytics' configs clip at 10
    as its trainer does."""
    from ppdet.core.workspace import create

    from ppmulti.rank import config as config_mod

    cfg_file = tmp_path / "clipped.yml"
    cfg_file.write_text(f"_BASE_: ['{DEMO_CONFIG}']\nOptimizerBuilder:\n  clip_grad_by_norm: 0.1\n")
    config_mod.load(cfg_file)
    layer = paddle.nn.Linear(2, 1)
    opt = create("OptimizerBuilder")(0.01, layer)
    assert take_clip(opt)[0] == 0.1 and opt._grad_clip is None
    config_mod.load(DEMO_CONFIG, ["OptimizerBuilder.clip_grad_by_norm=2.0"])
    assert take_clip(create("OptimizerBuilder")(0.01, layer))[0] == 2.0
    config_mod.load(DEMO_CONFIG)
    assert take_clip(create("OptimizerBuilder")(0.01, layer)) == (None, None)   # the demo does not clip
    for name in ("yolov8/yolov8_n_500e_coco.yml", "yolo11/yolo11_n_500e_coco.yml", "yolo26/yolo26_n_500e_coco.yml"):
        assert config_mod.load(REPO / "configs" / name)["OptimizerBuilder"]["clip_grad_by_norm"] == 10.0


# ----------------------------------------------------------------------------- the loop's numbers
class _Losses(Hook):
    priority = 5

    def __init__(self):
        self.rows = []

    def after_step(self, trainer, epoch, step, outputs, lr, data_time):
        self.rows.append((float(outputs["loss"]).hex(), trainer.optimizer_stepped))


# Measured with the code before OptimStep (commit 7692dd9, CPU; the same on Paddle 3.3.1 and 2.6.2): the toy loop
# of 3 epochs x 5 batches, lr 0.05, seed 0, as this test runs it: each batch's loss and the final weights (float.hex).
BEFORE = {
    1: (['0x1.1a706e0000000p+1', '0x1.c8ed9c0000000p-2', '0x1.adad020000000p-1', '0x1.8a05840000000p-2',
         '0x1.c5dbca0000000p-7', '0x1.944a380000000p-1', '0x1.1fd4540000000p-5', '0x1.a212c00000000p-2',
         '0x1.6500de0000000p-4', '0x1.dd93880000000p-9', '0x1.420d460000000p-2', '0x1.8b5be60000000p-8',
         '0x1.c148f20000000p-3', '0x1.7cf04e0000000p-6', '0x1.8e9c3a0000000p-9'],
        ['0x1.f603420000000p-4', '-0x1.0ed4d80000000p-1', '0x1.3a87aa0000000p-1', '0x1.5b8f760000000p-2'], 15),
    3: (['0x1.1a706e0000000p+1', '0x1.49941e0000000p-1', '0x1.49816c0000000p+0', '0x1.7c8c480000000p-1',
         '0x1.f89a860000000p-5', '0x1.9486220000000p+0', '0x1.4bd4d00000000p-2', '0x1.f886d60000000p-1',
         '0x1.e8f2d80000000p-2', '0x1.c8bcce0000000p-6', '0x1.245eb00000000p+0', '0x1.4aacd80000000p-3',
         '0x1.87c2540000000p-1', '0x1.391a1a0000000p-2', '0x1.ab249e0000000p-7'],
        ['-0x1.d040b20000000p-4', '-0x1.76f71c0000000p-1', '0x1.6f0c4e0000000p-1', '0x1.2691de0000000p-3'], 6),
}


@pytest.mark.parametrize("accumulate", [1, 3])
def test_fp32_loop_gives_the_same_numbers_as_before(accumulate):
    losses, weights, steps = BEFORE[accumulate]
    rec = _Losses()
    trainer = toy_trainer(epochs=3, steps=5, hooks=[rec], lr=0.05)
    trainer.batch = BatchPlan(2, 2, 1, accumulate)
    trainer.accumulation = Accumulation(accumulate, 5)
    trainer.train()
    got = [float(v).hex() for v in trainer.model.linear.weight.numpy().ravel()]
    got.append(float(trainer.model.linear.bias.numpy()[0]).hex())
    # within float32 rounding: recorded on an AMD EPYC, where they were equal bit for bit; an Intel Xeon's CPU
    # kernels differ by an ulp (1.0e-6 relative in the losses, 3e-8 in the weights), a changed step by far more
    as_float = [float.fromhex(h) for h in [r[0] for r in rec.rows] + got]
    np.testing.assert_allclose(as_float, [float.fromhex(h) for h in losses + weights], rtol=1e-5, atol=1e-7)
    assert trainer.optimizer_steps == steps
    assert [r[1] for r in rec.rows] == [f for e in range(3) for f in trainer.optim.step_flags(e)]


def test_amp_hook_counts_the_steps_the_scaler_skipped():
    """The hook reads ``trainer.optim.skipped`` after optimizer steps only (a micro-step leaves it as it was)."""
    from ppmulti.rank.engine.hooks import amp

    hook = amp.MixedPrecisionHook(amp.AmpRequest(True, "O1", "--amp"))
    optim = types.SimpleNamespace(skipped=True)
    hook.after_step(types.SimpleNamespace(optim=optim, optimizer_stepped=True), 0, 0, None, 0.1, 0.0)
    hook.after_step(types.SimpleNamespace(optim=optim, optimizer_stepped=False), 0, 1, None, 0.1, 0.0)
    assert (hook.skipped_epoch, hook.skipped_total) == (1, 1)
    assert hook.autocast_args() is None   # the plan is off until setup says otherwise


def test_a_trainer_from_parts_takes_its_optimizers_clip_and_says_so(caplog):
    """A Paddle optimizer given ``grad_clip=ClipGradByGlobalNorm(X)`` (as ppdet builds it): the Trainer's step
    clips instead of the optimizer, and the plan's lines name the limit."""
    from ppmulti.rank.engine.trainer import Trainer, RunPlan

    paddle.seed(0)
    model = ToyModel()
    opt = paddle.optimizer.SGD(0.05, parameters=model.parameters(), grad_clip=paddle.nn.ClipGradByGlobalNorm(0.5))
    trainer = Trainer(model, toy_batches(2), opt, epochs=1, cfg={"log_iter": 100}, world=1, rank=0,
                      opts=RunPlan(config="toy.yml"), hooks=[Hook()])
    assert trainer.optim.clip_norm == 0.5 and opt._grad_clip is None
    with caplog.at_level("INFO", logger="ppmulti"):
        trainer.train()
    assert "gradients clipped to a global norm of 0.5 before each optimizer step" in caplog.text
