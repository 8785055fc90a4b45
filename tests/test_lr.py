"""Global batch splitting and linear LR scaling with warmup."""

import pytest

from ppmulti.rank.engine.lr import scale_lr, split_batch
from ppmulti.common.errors import UserError


def test_split_even():
    plan = split_batch(64, 4)
    assert (plan.global_batch, plan.per_rank, plan.world_size) == (64, 16, 4)


def test_split_not_divisible_names_both_numbers():
    with pytest.raises(UserError) as err:
        split_batch(10, 4)
    assert "10" in str(err.value) and "4" in str(err.value)


def test_split_rejects_zero():
    with pytest.raises(UserError):
        split_batch(0, 1)


@pytest.mark.parametrize("global_batch,expected_lr", [(64, 0.01), (128, 0.02), (32, 0.005), (8, 0.00125)])
def test_linear_scaling(global_batch, expected_lr):
    plan = scale_lr(0.01, 64, global_batch, dataset_size=6400, warmup_epochs=5)
    assert plan.lr == pytest.approx(expected_lr)


def test_warmup_keeps_steps_when_batch_grows():
    # 5 epochs at batch 64 on 6400 images = 500 steps; at batch 128 it stays 500 steps (= 10 epochs)
    plan = scale_lr(0.01, 64, 128, dataset_size=6400, warmup_epochs=5)
    assert plan.warmup_steps_ref == 500 and plan.warmup_steps == 500


def test_warmup_keeps_images_when_batch_shrinks():
    plan = scale_lr(0.01, 64, 32, dataset_size=6400, warmup_steps=100)
    assert plan.warmup_steps == 200


def test_warmup_capped_at_a_third_of_the_run():
    plan = scale_lr(0.004, 8, 8, dataset_size=256, warmup_steps=60, total_steps=96)
    assert plan.warmup_steps == 32


def test_describe_mentions_all_numbers():
    text = scale_lr(0.01, 64, 16, dataset_size=640, warmup_steps=40).describe()
    for part in ("0.0025", "0.01", "16", "64"):
        assert part in text


def test_paddledetection_tagged_linear_warmup_is_read_and_scaled():
    """PaddleDetection's configs write ``- !LinearWarmup {...}``, which ppdet's loader makes an object: the warmup
    is found (not silently 0 steps), replaced by ppdet's dict form, and the scaled step count is what ppdet's
    LearningRate then builds."""
    import yaml

    from ppmulti.rank import compat
    from ppmulti.rank.engine.lr import linear_warmup

    compat.import_ppdet()
    from ppdet.optimizer import LearningRate

    text = ("schedulers:\n"
            "- !PiecewiseDecay {gamma: 0.1, milestones: [8, 11]}\n"
            "- !LinearWarmup {start_factor: 0.1, steps: 1000}\n")
    schedulers = yaml.load(text, Loader=yaml.Loader)["schedulers"]
    assert type(schedulers[1]).__name__ == "LinearWarmup"
    warmup = linear_warmup(schedulers)
    assert warmup == {"name": "LinearWarmup", "steps": 1000, "start_factor": 0.1, "epochs": None}
    assert schedulers[1] is warmup and type(schedulers[0]).__name__ == "PiecewiseDecay"

    plan = scale_lr(0.02, 16, 8, dataset_size=800, warmup_steps=warmup["steps"], total_steps=12 * 100)
    warmup["steps"] = plan.warmup_steps
    assert plan.warmup_steps == 400   # a third of the run (1200 steps) at most
    scheduler = LearningRate(base_lr=plan.lr, schedulers=schedulers)(step_per_epoch=100)
    values = [scheduler.get_lr()]
    for _ in range(plan.warmup_steps + 1):
        scheduler.step()
        values.append(scheduler.get_lr())
    assert values[0] == pytest.approx(0.01 * 0.1)          # the scaled lr x start_factor
    assert values[plan.warmup_steps] == pytest.approx(0.01)   # reached at the scaled warmup's end
    assert values[plan.warmup_steps // 2] < 0.01


def test_linear_warmup_absent_or_in_dict_form():
    from ppmulti.rank.engine.lr import linear_warmup

    assert linear_warmup([{"name": "CosineDecay", "max_epochs": 10}]) is None
    dict_form = {"name": "LinearWarmup", "start_factor": 0.0, "epochs": 5}
    assert linear_warmup([{"name": "CosineDecay"}, dict_form]) is dict_form
