"""Ultralytics 8.4's training recipe (engine/ultra_recipe.py), MuSGD for Paddle (engine/musgd.py) and the
close_mosaic switch (hooks/close_mosaic.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from ppmulti.rank.engine import ultra_recipe as R

FIXTURES = Path(__file__).parent / "fixtures"


def test_default_hyperparameters_are_8_4s():
    for key, value in {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005, "warmup_epochs": 3.0,
                       "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "box": 7.5, "cls": 0.5, "dfl": 1.5,
                       "nbs": 64, "close_mosaic": 10, "optimizer": "auto", "iou": 0.7, "max_det": 300}.items():
        assert R.HYP[key] == value, key


@pytest.mark.parametrize("nc, iterations, expected", [
    (80, 10000, ("AdamW", 0.000119, 0.9)),     # round(0.002 * 5 / 84, 6)
    (3, 500, ("AdamW", 0.001429, 0.9)),        # round(0.01 / 7, 6)
    (80, 10001, ("MuSGD", 0.01, 0.9)),
])
def test_auto_optimizer(nc, iterations, expected):
    choice = R.auto_optimizer(nc, iterations)
    assert (choice.name, choice.lr, choice.momentum) == expected
    assert choice.warmup_bias_lr == 0.0


def test_named_optimizer_keeps_lr0_and_unknown_is_named():
    choice = R.choose_optimizer("sgd", 80, 99999, lr0=0.02)
    assert (choice.name, choice.lr, choice.momentum, choice.warmup_bias_lr) == ("SGD", 0.02, 0.937, 0.1)
    with pytest.raises(ValueError, match="optimizer=Lion"):
        R.choose_optimizer("Lion", 80, 1)


def test_auto_iterations_count_nominal_batches():
    # 118287 COCO images at batch 16: ceil(118287 / 64) x 100 epochs = 184900 -> MuSGD
    assert R.auto_iterations(118287, 16, 100) == 184900
    assert R.auto_iterations(100, 128, 3) == 3


@pytest.mark.parametrize("batch, acc, wd", [(16, 4, 0.0005), (64, 1, 0.0005), (24, 3, 0.0005 * 72 / 64),
                                            (128, 1, 0.001), (1, 64, 0.0005), (40, 2, 0.0005 * 80 / 64)])
def test_accumulation_and_weight_decay(batch, acc, wd):
    assert R.nominal_accumulate(batch) == acc
    assert R.scaled_weight_decay(0.0005, batch, acc) == pytest.approx(wd)


def test_accumulation_capped_by_the_run_but_not_the_decay():
    recipe = R.plan(dataset_size=8, batch=4, epochs=2, nc=3, batches_per_epoch=2)
    assert recipe.accumulate == 4          # round(64 / 4) = 16, capped at 2 batches x 2 epochs
    assert recipe.weight_decay == pytest.approx(0.0005 * 4 * 16 / 64)


def test_lr_lambda_linear_and_cosine():
    assert R.lr_lambda(0, 100, 0.01) == 1.0
    assert R.lr_lambda(50, 100, 0.01) == pytest.approx(0.505)
    assert R.lr_lambda(100, 100, 0.01) == pytest.approx(0.01)
    assert R.lr_lambda(0, 100, 0.01, cos_lr=True) == pytest.approx(1.0)
    assert R.lr_lambda(50, 100, 0.01, cos_lr=True) == pytest.approx(0.505)
    assert R.lr_lambda(100, 100, 0.01, cos_lr=True) == pytest.approx(0.01)


def test_warmup_length_and_values():
    assert R.warmup_batches(3.0, 100, 100) == 300
    assert R.warmup_batches(3.0, 10, 2) == 10          # capped at epochs - 1
    assert R.warmup_batches(3.0, 10, 1) == 0
    assert R.warmup_batches(0.5, 7, 10) == 4            # round(3.5) -> 4 (half to even)
    first = R.warmup_state(0, 300, 4, 0.01, 0.1, 0.937)
    assert (first.accumulate, first.bias_lr, first.lr, first.momentum) == (1, 0.1, 0.0, 0.8)
    mid = R.warmup_state(150, 300, 4, 0.01, 0.1, 0.937)
    assert mid.accumulate == 2 and mid.bias_lr == pytest.approx(0.055) and mid.lr == pytest.approx(0.005)
    assert mid.momentum == pytest.approx(0.8685)
    last = R.warmup_state(300, 300, 4, 0.01, 0.1, None)
    assert (last.accumulate, last.bias_lr, last.lr, last.momentum) == (4, pytest.approx(0.01), 0.01, None)
    assert R.warmup_state(301, 300, 4, 0.01, 0.1, 0.937) is None


def test_close_mosaic_epochs():
    assert [R.mosaic_closed(e, 12, 10) for e in range(12)] == [False, False] + [True] * 10
    assert not any(R.mosaic_closed(e, 12, 0) for e in range(12))


def test_parameter_groups():
    params = [("model.0.conv.weight", 4, False), ("model.0.bn.weight", 1, True), ("model.0.bn.bias", 1, True),
              ("model.22.cv3.0.2.weight", 4, False), ("model.22.cv3.0.2.bias", 1, False),
              ("model.22.dfl.conv.weight", 4, False), ("head.logit_scale", 1, False)]
    groups = R.param_groups(params, decay=0.0005)
    by_kind = {g.kind: g for g in groups}
    assert by_kind["weight"].names == ["model.0.conv.weight", "model.22.cv3.0.2.weight", "model.22.dfl.conv.weight"]
    assert by_kind["bn"].names == ["model.0.bn.weight", "head.logit_scale"]
    assert by_kind["bias"].names == ["model.0.bn.bias", "model.22.cv3.0.2.bias"]
    assert (by_kind["weight"].weight_decay, by_kind["bn"].weight_decay, by_kind["bias"].weight_decay) == \
        (0.0005, 0.0, 0.0)
    muon = R.param_groups(params, decay=0.0005, use_muon=True, boosted=["model.22.cv3.0.2.weight",
                                                                        "model.22.cv3.0.2.bias"])
    kinds = [(g.kind, g.lr_gain, g.names) for g in muon]
    assert ("muon", 3.0, ["model.22.cv3.0.2.weight"]) in kinds
    assert ("muon", 1.0, ["model.0.conv.weight", "model.22.dfl.conv.weight"]) in kinds
    assert ("bias", 3.0, ["model.22.cv3.0.2.bias"]) in kinds
    assert all(g.weight_decay == 0.0005 for g in muon if g.kind == "muon")


def test_plan_describes_itself():
    recipe = R.plan(dataset_size=128, batch=16, epochs=10, nc=3)
    assert recipe.optimizer.name == "AdamW" and recipe.accumulate == 4
    assert recipe.warmup_batches == 24 and recipe.lr_at(0) == pytest.approx(0.001429)
    assert "AdamW(lr=0.001429" in recipe.describe()


# ----------------------------------------------------------------------------- MuSGD
import paddle  # noqa: E402 (installed with ppmulti)


def test_newton_schulz_orthogonalises():
    from ppmulti.rank.engine.musgd import newton_schulz

    rng = np.random.RandomState(0)
    g = paddle.to_tensor(rng.normal(size=(16, 8)).astype(np.float32))
    x = newton_schulz(g, dtype="float32").numpy()
    s = np.linalg.svd(x, compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.5     # Muon's quintic leaves singular values in about (0.7, 1.2)
    u, _, vt = np.linalg.svd(g.numpy(), full_matrices=False)
    assert np.abs(x - u @ vt).max() < 0.35     # near U V^T


def test_musgd_matches_ultralytics():
    # golden: tests/fixtures/ultra_loss_reference.py (ultralytics 8.4.190's MuSGD, torch 2.14.1, bfloat16 on CPU)
    from ppmulti.rank.engine.musgd import MuSGD

    sys.path.insert(0, str(FIXTURES))
    from ultra_loss_cases import musgd_case

    golden = json.loads((FIXTURES / "ultra_loss_golden.json").read_text())["musgd"]
    c = musgd_case()
    params = {}
    for k, v in c["params"].items():
        params[k] = paddle.create_parameter(v.shape, "float32", default_initializer=paddle.nn.initializer.Assign(v))
    opt = MuSGD([{"params": [params[k] for k in names], **opts} for names, opts in c["groups"]],
                muon=c["muon"], sgd=c["sgd"])
    for grads in c["grads"]:
        for k, g in grads.items():
            (params[k] * paddle.to_tensor(g)).sum().backward()
        opt.step()
        opt.clear_grad()
    for k, start in c["params"].items():
        moved = params[k].numpy().ravel() - start.ravel()
        expected = np.asarray(golden[k]) - start.ravel()
        # bfloat16 Newton-Schulz rounding: the moves agree within 0.3% of their size (measured); allow 2%
        assert np.abs(moved - expected).max() <= 0.02 * np.abs(expected).max() + 1e-7, k
    assert math.isfinite(float(params["fc"].sum()))


# ----------------------------------------------------------------------------- close_mosaic
class _Op:
    close_from = None


class _Loader:
    class dataset:
        class transform:
            transforms_cls = [object(), _Op()]


class _Trainer:
    cfg = {"epoch": 12}
    loader = _Loader()


def test_close_mosaic_hook_sets_the_epoch_on_the_op():
    from ppmulti.rank.engine.hooks.close_mosaic import CloseMosaicHook, mosaic_ops

    hook = CloseMosaicHook(10)
    hook.before_train(_Trainer())
    assert [op.close_from for op in mosaic_ops(_Trainer.loader)] == [2]


class _Source:
    """A dataset as the mosaic op sees it: records, and the epoch a loader worker's copy was set to."""

    def __init__(self, epoch: int):
        self._epoch = epoch
        self.roidbs = [{"im_id": np.array([0])}]


def test_mosaic_op_draws_letterboxes_from_the_closing_epoch(monkeypatch):
    from ppmulti.rank.data import augment
    from ppmulti.rank.data.pipeline import register_ops

    op = register_ops()["YOLOv5Mosaic"](img_size=64, prob=1.0, mixup=1.0)
    drawn = []
    plain = (np.zeros((64, 64, 3), np.uint8), np.zeros((0, 4), np.float32), np.zeros((0, 1), np.int32))
    op._load = lambda source, index, record: None
    op._extras = lambda source, records, n: [None] * n
    op._mosaic = lambda first, extras: drawn.append("mosaic") or plain
    monkeypatch.setattr(augment, "mixup", lambda rng, a, b: drawn.append("mixup") or a)
    monkeypatch.setattr(augment, "letterbox_affine", lambda first, size, hyp, rng: drawn.append("letterbox") or plain)
    op.close_from = 2
    for epoch in (0, 1, 2, 3):
        op({"_source": _Source(epoch), "_index": 0})
    assert drawn == ["mosaic", "mosaic", "mixup", "mosaic", "mosaic", "mixup", "letterbox", "letterbox"]


def test_decay_by_paddle_name():
    assert R.decays("conv2d_3.w_0") and R.decays("linear_0.w_0")
    assert not R.decays("conv2d_3.b_0") and not R.decays("batch_norm2d_1.w_0")
    assert not R.decays("batch_norm2d_1.b_0") and not R.decays("sync_batch_norm_2.w_0")


def test_ppdet_optimizer_sections():
    sgd = R.ppdet_optimizer(R.choose_optimizer("SGD", 3, 1), 0.0005)
    assert sgd["optimizer"] == {"type": "Momentum", "momentum": 0.937, "use_nesterov": True}
    assert sgd["regularizer"] == {"type": "L2", "factor": 0.0005} and sgd["clip_grad_by_norm"] == 10.0
    adamw = R.ppdet_optimizer(R.auto_optimizer(3, 100), 0.0005)
    assert adamw["optimizer"]["type"] == "AdamW" and adamw["optimizer"]["beta1"] == 0.9
    assert adamw["optimizer"]["apply_decay_param_fun"] is R.decays and adamw["regularizer"] is None
    musgd = R.ppdet_optimizer(R.auto_optimizer(3, 20000), 0.0005)   # built by the engine (engine.musgd_run)
    assert musgd["optimizer"] == {"type": "MuSGD", "momentum": 0.9, "use_nesterov": True}
    assert musgd["regularizer"] == {"type": "L2", "factor": 0.0005} and R.wants_musgd(musgd)
    with pytest.raises(ValueError, match="RAdam"):
        R.ppdet_optimizer(R.choose_optimizer("RAdam", 3, 1), 0.0005)
    assert R.lr_reference(R.choose_optimizer("SGD", 3, 1), 96) == 64
    assert R.lr_reference(R.auto_optimizer(3, 100), 96) == 96


def test_adamw_section_builds_through_ppdet():
    """ppdet's OptimizerBuilder passes apply_decay_param_fun through to Paddle's AdamW: BatchNorm and biases
    keep their values under a pure decay step (zero gradients), convolution weights shrink."""
    from ppdet.optimizer import OptimizerBuilder

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4))
    section = R.ppdet_optimizer(R.auto_optimizer(3, 100), 0.5)
    opt = OptimizerBuilder(**section)(0.1, model)
    before = {p.name: p.numpy().copy() for p in model.parameters()}
    (model(paddle.zeros([1, 3, 5, 5])).sum() * 0).backward()
    opt.step()
    for p in model.parameters():
        if p.stop_gradient:   # BatchNorm's running statistics
            continue
        changed = not np.allclose(p.numpy(), before[p.name])
        assert changed == R.decays(p.name), p.name


def test_an_ultralytics_models_adamw_leaves_biases_and_batchnorm_undecayed():
    """optimizer=auto's AdamW section as config.yml holds it (plain data), built by ppdet's OptimizerBuilder inside
    adamw_decay_groups for YOLOv8n: a pure decay step (zero gradients) shrinks convolution weights only, as in
    ultralytics' groups; the section is plain again afterwards. PaddleDetection's architectures keep ppdet's AdamW
    (every parameter decayed)."""
    from ppdet.optimizer import OptimizerBuilder

    from ppmulti.rank.models.ultra_model import UltraDetectionModel

    cfg = _auto_cfg()
    R.choose_for_run(cfg, range(16), _batch(8, 8), 64)
    plain = dict(cfg["OptimizerBuilder"]["optimizer"])
    paddle.seed(0)
    model = UltraDetectionModel("yolov8n.yaml", nc=3)
    for architecture, ultralytics in (("UltraYOLO", True), ("RTDETR", False)):
        cfg["architecture"] = architecture
        with R.adamw_decay_groups(cfg) as applied:
            opt = OptimizerBuilder(**cfg["OptimizerBuilder"])(0.1, model)
        assert applied is ultralytics and cfg["OptimizerBuilder"]["optimizer"] == plain
        before = {p.name: p.numpy().copy() for p in model.parameters() if not p.stop_gradient}
        for p in model.parameters():
            if not p.stop_gradient:
                p.grad = paddle.zeros_like(p)   # the step sees only the decay
        opt.step()
        opt.clear_grad()
        kinds = {True: set(), False: set()}
        for p in model.parameters():
            if p.name in before:
                changed = not np.array_equal(p.numpy(), before[p.name])
                kinds[changed].add(p.name.split("_")[0])
                if ultralytics:
                    assert changed == R.decays(p.name), p.name
        assert kinds[True] == ({"conv2d"} if ultralytics else {"conv2d", "batch"})


def _auto_cfg(nc=3, epochs=2):
    """configs/ultralytics/_base_/optimizer_500e.yml's sections, as the engine holds them before the lr plan."""
    return {"num_classes": nc, "epoch": epochs, "ref_batch": 64, "warmup_bias_lr": 0.1,
            "LearningRate": {"base_lr": 0.01},
            "OptimizerBuilder": {"clip_grad_by_norm": 10.0, "optimizer": {"type": "auto", "momentum": 0.937},
                                 "regularizer": {"type": "L2", "factor": 0.0005}}}


def _batch(global_batch, accumulate):
    from ppmulti.rank.engine.lr import BatchPlan

    return BatchPlan(global_batch, global_batch, 1, accumulate)


def test_optimizer_auto_chooses_adamw_for_a_short_run():
    cfg = _auto_cfg(nc=3, epochs=2)
    notes = R.choose_for_run(cfg, range(16), _batch(8, 8), 64)
    # 16 images, batch 8 < nbs 64: ceil(16 / 64) x 2 epochs = 2 steps -> AdamW at round(0.01 / 7, 6)
    assert cfg["OptimizerBuilder"]["optimizer"] == {"type": "AdamW", "beta1": 0.9, "beta2": 0.999,
                                                    "weight_decay": 0.0005}
    assert cfg["OptimizerBuilder"]["regularizer"] is None
    assert cfg["LearningRate"]["base_lr"] == 0.001429
    assert cfg["warmup_bias_lr"] == 0.0
    assert cfg["ref_batch"] == 64   # Adam's lr is not scaled: ref_batch = the effective batch (8 x 8)
    assert notes[0].startswith("optimizer: optimizer=auto chooses the optimizer, lr0 and momentum")
    assert "2 optimizer step(s) planned" in notes[0] and "AdamW(lr=0.001429, momentum=0.9)" in notes[0]
    assert "lr0=0.01 and momentum are not used" in notes[0]


def test_optimizer_auto_past_10000_steps_is_musgd():
    cfg = _auto_cfg(nc=80, epochs=100)
    notes = R.choose_for_run(cfg, range(118287), _batch(64, 1), 64)   # COCO: 1849 steps an epoch
    # plain data in config.yml, built by the engine (tests/test_musgd_run.py builds it from this section)
    assert cfg["OptimizerBuilder"]["optimizer"] == {"type": "MuSGD", "momentum": 0.9, "use_nesterov": True}
    assert cfg["OptimizerBuilder"]["regularizer"] == {"type": "L2", "factor": 0.0005}
    assert (cfg["LearningRate"]["base_lr"], cfg["ref_batch"], cfg["warmup_bias_lr"]) == (0.01, 64, 0.0)
    assert "184900 optimizer step(s) planned (more than 10000): MuSGD -> MuSGD(lr=0.01, momentum=0.9)" in notes[0]
    assert len(notes) == 1


def test_a_named_optimizer_is_left_alone():
    cfg = _auto_cfg()
    cfg["OptimizerBuilder"]["optimizer"] = {"type": "Momentum", "momentum": 0.937, "use_nesterov": True}
    before = json.dumps(cfg, sort_keys=True)
    assert R.choose_for_run(cfg, range(16), _batch(8, 8), 64) == []
    assert json.dumps(cfg, sort_keys=True) == before
