"""YOLOv5's warmup on a YOLOv5 command line: the accumulation ramp, the lr counted in batches, the biases' lr and the
momentum, each against YOLOv5's train.py rules; stops and resumes inside the ramp."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from ppmulti.rank import compat
from ppmulti.rank.engine.hooks import Hook
from ppmulti.rank.engine.hooks.warmup import START_FACTOR, YOLOv5WarmupHook, bias_parameters
from ppmulti.rank.engine.lr import (Accumulation, BatchPlan, LRPlan, nominal_accumulate, optimizer_steps,
                                    yolov5_warmup_batches)
from ppmulti.rank.engine.trainer import Trainer, RunPlan
from toys import ToyModel, toy_batches


def yolov5_stepping(batches_per_epoch: int, epochs: int, warmup: int, batch: int) -> list[bool]:
    """YOLOv5's train.py, transcribed: ``accumulate`` follows np.interp over the warmup and keeps its last value;
    the optimizer steps when ``ni - last_opt_step >= accumulate``; plus ppmulti's one rule of its own, an epoch's
    last batch always steps (no gradients pending across an epoch's end or in a checkpoint)."""
    accumulate, last, out = max(round(64 / batch), 1), -1, []
    for epoch in range(epochs):
        for i in range(batches_per_epoch):
            ni = i + batches_per_epoch * epoch
            if ni <= warmup:
                accumulate = max(1, np.interp(ni, [0, warmup], [1, 64 / batch]).round())
            step = ni - last >= accumulate or i == batches_per_epoch - 1
            if step:
                last = ni
            out.append(bool(step))
    return out


@pytest.mark.parametrize("batches,epochs,batch", [(16, 10, 16), (7, 20, 8), (40, 4, 16), (3, 40, 32), (25, 8, 4)])
def test_the_ramp_steps_on_yolov5s_batches(batches, epochs, batch):
    warmup = yolov5_warmup_batches(3.0, batches)
    plan = Accumulation(nominal_accumulate(batch), batches, warmup)
    ours = [flag for epoch in range(epochs) for flag in plan.step_flags(epoch)]
    assert ours == yolov5_stepping(batches, epochs, warmup, batch)
    after = Accumulation(nominal_accumulate(batch), batches)   # past the warmup: plain groups
    assert plan.step_flags(epochs + warmup) == after.step_flags(0)
    assert after.steps_in_epoch(0) == optimizer_steps(batches, nominal_accumulate(batch))


def test_the_ramp_starts_at_one_batch_per_step_and_grows():
    plan = Accumulation(4, 16, 100)
    assert plan.step_flags(0) == [True] * 16                               # ni 0-15: groups of 1
    assert plan.step_flags(1)[:4] == [True, False, True, False]            # ni 17 on: groups of 2
    assert [plan.steps_in_epoch(e) for e in range(8)] == [16, 9, 8, 6, 6, 5, 4, 4]   # groups of 4 from ni 84
    assert Accumulation(4, 16).step_flags(0) == [False, False, False, True] * 4   # no ramp


@pytest.mark.parametrize("epochs,batches,expected", [(3.0, 16, 100), (3.0, 1849, 5547), (0.0, 50, 100),
                                                     (1.0, 300, 300), (0.5, 301, 150)])
def test_warmup_length_is_yolov5s(epochs, batches, expected):
    # train.py: nw = max(round(hyp["warmup_epochs"] * nb), 100)
    assert yolov5_warmup_batches(epochs, batches) == expected
    assert yolov5_warmup_batches(epochs, batches, total_batches=30 * batches) == expected   # 30 epochs: no cap


def test_a_short_run_warms_up_a_third_of_itself():
    """ppmulti's rule for every warmup, where YOLOv5 would spend a 24-batch run in its 100-batch warmup."""
    assert yolov5_warmup_batches(3.0, 6, total_batches=24) == 8
    assert yolov5_warmup_batches(3.0, 16, total_batches=300) == 100 and yolov5_warmup_batches(3.0, 16, 299) == 99


# ----------------------------------------------------------------------------- in the loop
class Record(Hook):
    priority = 6   # after the warmup hook's before_step

    def __init__(self):
        self.rows = []
        self.seen = []

    def before_step(self, trainer, epoch, step):
        bias = trainer.model.linear.bias
        self.seen.append((float(trainer.optimizer.get_lr()), float(bias.optimize_attr["learning_rate"]),
                          compat.optimizer_momentum(trainer.optimizer)))

    def after_step(self, trainer, epoch, step, outputs, lr, data_time):
        self.rows.append((trainer.optimizer_stepped, trainer.lr.last_epoch))

    def after_epoch(self, trainer, stats):
        self.rows_bias = [*getattr(self, "rows_bias", []), stats.bias_lr]


def _warm_trainer(batches, epochs, accumulate, warmup, hooks=(), momentum=0.9, base_lr=0.01):
    from ppdet.optimizer.optimizer import LinearWarmup

    from ppmulti.rank.ppdet_bridge import LinearDecay

    paddle.seed(0)
    model = ToyModel()
    nb = len(batches)
    boundary, value = LinearWarmup(steps=warmup, start_factor=START_FACTOR)(base_lr, nb)
    schedule = LinearDecay(max_epochs=epochs, min_lr_ratio=0.01)(base_lr, boundary, value, nb)
    opt = paddle.optimizer.Momentum(schedule, momentum=momentum, parameters=model.parameters())
    per_rank = int(batches[0]["x"].shape[0])
    trainer = Trainer(model, batches, opt, lr=schedule, epochs=epochs, cfg={"log_iter": 100},
                      opts=RunPlan(config="toy.yml"), world=1, rank=0,
                      batch=BatchPlan(per_rank, per_rank, 1, accumulate),
                      lr_plan=LRPlan(base_lr, base_lr, 1, 1, 0, warmup, yolov5_warmup=True),
                      hooks=[YOLOv5WarmupHook(warmup, 0.1, 0.8), *hooks])
    trainer.accumulation = Accumulation(accumulate, nb, warmup)
    trainer.lr_per_batch = True
    return trainer


def test_warmup_in_the_loop_is_yolov5s_batch_by_batch():
    """10 batches x 4 epochs, accumulate 4, a 20-batch warmup: the optimizer steps on YOLOv5's batches, the lr
    counts batches, and at batch ni the weights' lr is lr x ni/20, the biases' lr 0.1 + (lr - 0.1) x ni/20 and the
    momentum 0.8 + (0.9 - 0.8) x ni/20; afterwards the bias factor and the momentum are back."""
    rec = Record()
    trainer = _warm_trainer(toy_batches(10), 4, 4, 20, hooks=[rec])
    trainer.train()
    flags = [f for e in range(4) for f in Accumulation(4, 10, 20).step_flags(e)]
    assert [r[0] for r in rec.rows] == flags and trainer.optimizer_steps == sum(flags)
    assert [r[1] for r in rec.rows] == list(range(1, 41))   # the schedule stepped every batch
    for ni, (lr, factor, momentum) in enumerate(rec.seen[:21]):
        frac = ni / 20
        assert lr == pytest.approx(0.01 * (START_FACTOR + (1 - START_FACTOR) * frac), rel=1e-6)
        assert lr * factor == pytest.approx(0.1 + (0.01 - 0.1) * frac, rel=1e-6)
        assert momentum == pytest.approx(0.8 + 0.1 * frac, rel=1e-6)
    assert all(f == 1.0 and m == 0.9 for _, f, m in rec.seen[21:])
    assert trainer.model.linear.bias.optimize_attr["learning_rate"] == 1.0
    # each epoch's biases' lr at its last batch while the warmup sets it (results.csv's lr/pg2), then none
    assert rec.rows_bias == [pytest.approx(0.1 - 0.09 * 9 / 20), pytest.approx(0.1 - 0.09 * 19 / 20), None, None]


def test_the_bias_lr_and_momentum_reach_the_update():
    """The first step at ni 0 (plain momentum: the update is lr x gradient): the weight barely moves (lr 0 in
    YOLOv5, 1e-6 x lr here) while the bias moves by 0.1 x its gradient, warmup_bias_lr."""
    batches = toy_batches(1, batch=4, seed=3)
    trainer = _warm_trainer(batches, 1, 1, 100)
    model = trainer.model
    w0, b0 = model.linear.weight.numpy().copy(), model.linear.bias.numpy().copy()
    probe = ToyModel()
    probe.set_state_dict(model.state_dict())
    probe(batches[0])["loss"].backward()
    gw, gb = probe.linear.weight.grad.numpy(), probe.linear.bias.grad.numpy()
    trainer.train()
    np.testing.assert_allclose(b0 - model.linear.bias.numpy(), 0.1 * gb, rtol=1e-4)
    assert np.abs(0.01 * gw).max() > 1e-4                                  # at the full lr it would move
    np.testing.assert_allclose(model.linear.weight.numpy(), w0, rtol=0, atol=1e-6)


def test_a_stop_inside_a_ramp_group_takes_the_lr_back():
    """Stopped on a micro-step: the position goes back to the group's start, and so does an lr counting batches."""

    class StopAt(Hook):
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            if (epoch, step) == (1, 4):
                trainer.stop_training = True

    trainer = _warm_trainer(toy_batches(10), 4, 4, 20, hooks=[StopAt()])
    flags = Accumulation(4, 10, 20).step_flags(1)
    assert flags[:5] == [False, False, True, False, False]   # ni 10-14: groups of 3
    trainer.train()
    assert trainer.state.step_in_epoch == 3 and trainer.state.global_step == 13 and trainer.lr.last_epoch == 13


def test_bias_parameters_are_yolov5s_bias_group():
    """Every layer's own bias, BatchNorm's too (YOLOv5's g[2]); weights are not in it."""
    layer = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4), paddle.nn.Conv2D(4, 2, 1))
    names = {id(p) for p in bias_parameters(layer)}
    assert names == {id(layer[0].bias), id(layer[1].bias), id(layer[2].bias)}
