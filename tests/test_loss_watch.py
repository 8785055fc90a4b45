"""A loss that explodes or goes non-finite is said at once (hooks/loss_watch.py): RetinaNet's first epoch once printed
loss_cls=4.8e32 without a word."""

from __future__ import annotations

import logging
import math

from ppmulti.rank.engine.hooks.loss_watch import LossWatchHook


def _run(values: list[dict], caplog) -> list[str]:
    """The hook after each step of ``values`` (loss tensors as a model returns them); the warnings it logged."""
    import paddle

    hook = LossWatchHook()
    with caplog.at_level(logging.WARNING, logger="ppmulti"):
        for step, losses in enumerate(values):
            outputs = {k: paddle.to_tensor(v, dtype="float64") for k, v in losses.items()}
            hook.after_step(None, 0, step, outputs, 0.01, 0.0)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_steady_loss_says_nothing(caplog):
    assert _run([{"loss": 2.0 - 0.01 * i, "loss_cls": 1.0 + 0.3 * (i % 3)} for i in range(50)], caplog) == []


def test_a_jump_of_orders_of_magnitude_is_one_warning_naming_the_component(caplog):
    """RetinaNet's case: loss_cls steady near 1, then 4.8e32 (and more after it): one line, at the step it happened."""
    steps = [{"loss": 1.5, "loss_cls": 1.1, "loss_reg": 0.4}] * 10
    steps += [{"loss": 4.8e32, "loss_cls": 4.809304207120756e32, "loss_reg": 0.4}] * 5
    warned = _run(steps, caplog)
    assert len(warned) == 2, warned   # loss_cls and the total it makes explode, each once
    assert warned[0].startswith("loss=4.8e+32 at epoch 1 step 11 has exploded (its running value: 1.5)")
    assert warned[1].startswith("loss_cls=4.809e+32 at epoch 1 step 11 has exploded (its running value: 1.1)")
    assert "lower the learning rate" in warned[1]


def test_an_absurd_first_value_is_said_too(caplog):
    assert len(_run([{"loss_cls": 3e20}], caplog)) == 1


def test_nan_and_inf_are_said_once_each_component(caplog):
    steps = [{"loss": 1.0, "loss_box": 0.5}] * 3 + [{"loss": math.nan, "loss_box": math.inf}] * 4
    warned = _run(steps, caplog)
    assert warned == [
        "loss is nan at epoch 1 step 4: the training has diverged (its weights are no longer finite from here); "
        "lower the learning rate (base_lr, --hyp lr0), lengthen the warmup or check the labels for broken boxes",
        "loss_box is inf at epoch 1 step 4: the training has diverged (its weights are no longer finite from here); "
        "lower the learning rate (base_lr, --hyp lr0), lengthen the warmup or check the labels for broken boxes"]


def test_a_slow_rise_is_not_an_explosion(caplog):
    """A loss that grows 10x over many steps (a warmup reaching a high lr) follows its running value."""
    assert _run([{"loss": 1.0 * 1.05 ** i} for i in range(48)], caplog) == []

