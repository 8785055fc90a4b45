"""SyncBatchNorm on CPU ranks (ppmulti.rank.ops.sync_bn): held against plain BatchNorm on the whole batch, and in a
2-rank training with --sync-bn."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from conftest import REPO, run_tool
from launching import FIXTURES, two_rank_arrays


def test_conversion_keeps_parameters_keys_and_single_process_batchnorm():
    """What a checkpoint, the optimizer and EMA see does not change; alone (or in evaluation) it is BatchNorm."""
    import paddle
    import paddle.nn as nn

    from ppmulti.rank.ops.sync_bn import CollectiveSyncBatchNorm, convert_sync_batchnorm

    paddle.seed(1)
    model = nn.Sequential(nn.ReLU(), nn.BatchNorm2D(3, momentum=0.7), nn.Sequential(nn.SyncBatchNorm(3, epsilon=1e-3)))
    plain = nn.Sequential(nn.ReLU(), nn.BatchNorm2D(3, momentum=0.7), nn.Sequential(nn.BatchNorm2D(3, epsilon=1e-3)))
    for layer in (model[1], plain[1]):
        layer.weight.set_value(paddle.to_tensor([0.5, 1.0, 2.0]))
    plain.set_state_dict(model.state_dict())
    keys, weight = list(model.state_dict()), model[1].weight
    assert convert_sync_batchnorm(model) == 2
    assert isinstance(model[1], CollectiveSyncBatchNorm) and isinstance(model[2][0], CollectiveSyncBatchNorm)
    assert list(model.state_dict()) == keys and model[1].weight is weight
    assert (model[1]._momentum, model[2][0]._epsilon) == (0.7, 1e-3)
    assert convert_sync_batchnorm(model) == 0    # converting again changes nothing
    x = paddle.rand([2, 3, 5, 5]) * 3.0 - 1.0
    for _ in range(2):   # training in one process: plain BatchNorm, running statistics included
        np.testing.assert_allclose(model(x).numpy(), plain(x).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model[1]._variance.numpy(), plain[1]._variance.numpy(), rtol=1e-5)
    model.eval()
    plain.eval()
    np.testing.assert_allclose(model(x).numpy(), plain(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flag,norm_type,device,synced", [
    (True, "bn", "cpu", True),            # --sync-bn: ppmulti's collective BatchNorm on CPU ranks
    (False, "sync_bn", "cpu", False),     # a config's norm_type alone: per-rank BatchNorm, as PaddleDetection's
    (False, "bn", "cpu", False),
])
def test_which_runs_synchronise_on_cpu_ranks(flag, norm_type, device, synced):
    """The builder's choice on 2 CPU ranks, and the run log's line saying it (the model is converted in place)."""
    from types import SimpleNamespace

    import paddle.nn as nn

    from ppmulti.rank.engine.builder import _Build
    from ppmulti.rank.ops.sync_bn import CollectiveSyncBatchNorm

    build = SimpleNamespace(opts=SimpleNamespace(sync_bn=flag), cfg={"norm_type": norm_type}, world=2,
                            device=device, model=nn.Sequential(nn.Conv2D(3, 3, 1), nn.BatchNorm2D(3)), plan_notes=[])
    _Build._maybe_sync_bn(build)
    assert isinstance(build.model[1], CollectiveSyncBatchNorm) == synced
    notes = " ".join(build.plan_notes)
    if synced:
        assert "1 BatchNorm layers synchronised across 2 ranks (--sync-bn" in notes
    elif norm_type == "sync_bn":
        assert "BatchNorm per rank on cpu ranks" in notes and "--sync-bn synchronises it" in notes
    else:
        assert notes == ""



def _reference(name: str):
    """What one process computes with plain BatchNorm on the concatenated batch of both ranks (the same loss:
    the sum of both ranks' sum(y * g))."""
    import paddle

    sys.path.insert(0, str(FIXTURES))
    try:
        import sync_bn_ranks as ranks
    finally:
        sys.path.remove(str(FIXTURES))
    _, make, shape, offset, spread = next(c for c in ranks.CASES if c[0] == name)
    bn = make()
    ranks.init_params(bn, shape[1])
    out = {}
    for step in range(ranks.STEPS):
        x, g = ranks.case_data(name, shape, offset, spread, step)
        xt = paddle.to_tensor(x, stop_gradient=False)
        y = bn(xt)
        (y * paddle.to_tensor(g)).sum().backward()
        out.update({f"y{step}": y.numpy(), f"dx{step}": xt.grad.numpy(), f"dweight{step}": bn.weight.grad.numpy(),
                    f"dbias{step}": bn.bias.grad.numpy(), f"mean{step}": bn._mean.numpy(),
                    f"var{step}": bn._variance.numpy()})
        bn.clear_gradients()
    bn.eval()
    out["eval"] = bn(paddle.to_tensor(ranks.case_data(name, shape, offset, spread, ranks.STEPS)[0])).numpy()
    out["keys"] = np.array(sorted(paddle.nn.Sequential(bn).state_dict().keys()))
    return out


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_match_batchnorm_on_the_whole_batch(tmp_path):
    got = two_rank_arrays(str(FIXTURES / "sync_bn_ranks.py"), tmp_path)
    for name in ("bn2d", "bn1d", "far"):
        want = _reference(name)
        for key, value in want.items():
            if key == "keys":   # checkpoints load either way
                assert list(got[f"{name}_keys"]) == list(value)
                continue
            # "far" (a mean 100 spreads from zero): float32 rounding of the mean moves x - mean by ~1e-5 of the
            # largest value in both computations; E[x^2] - E[x]^2 in float32 was 1.4e-4 to 7.5e-4 of it off
            atol = 5e-5 * np.abs(value).max() if name == "far" else 1e-5
            np.testing.assert_allclose(got[f"{name}_{key}"], value, rtol=1e-5, atol=atol, err_msg=f"{name} {key}")
        # the control: each rank's half alone normalises differently (far's halves differ by less than 1e-3)
        if name != "far":
            assert not np.allclose(got[f"{name}_mean0"], _half_batch_mean(name), atol=1e-3)


def _half_batch_mean(name: str) -> np.ndarray:
    sys.path.insert(0, str(FIXTURES))
    try:
        import sync_bn_ranks as ranks
    finally:
        sys.path.remove(str(FIXTURES))
    _, make, shape, offset, spread = next(c for c in ranks.CASES if c[0] == name)
    x = ranks.case_data(name, shape, offset, spread, 0)[0][: shape[0] // 2]
    momentum = make()._momentum
    return (1 - momentum) * x.mean(axis=tuple(d for d in range(x.ndim) if d != 1))


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_with_data_parallel_train_as_one_process_with_the_whole_batch(tmp_path):
    """Under fleet's data-parallel wrapper (its gradient all-reduce in the same backward pass) 2 ranks with
    batch 4 each end 5 SGD steps with the weights and running statistics of one process with batch 8."""
    script = str(FIXTURES / "equivalence_train.py")
    one = run_tool([script, str(tmp_path / "one.npz"), "8", "5", "syncbn"])
    assert one.returncode == 0, one.stderr[-2000:]
    two = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", script, str(tmp_path / "two.npz"),
                    "8", "5", "syncbn"], cwd=tmp_path)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert sorted(a.files) == sorted(b.files) and any(k.endswith("_variance") for k in a.files)
    for key in a.files:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_rank_training_with_sync_bn(small_demo, tmp_path):
    """`ppmulti launch --nproc_per_node 2 tools/train.py --data ... --cfg yolov5n.yaml --sync-bn` on CPU ranks."""
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", str(REPO / "tools" / "train.py"),
                     "--batch", "8", "--data", str(small_demo / "data.yaml"), "--cfg", "yolov5n.yaml",
                     "--weights", "", "--device", "cpu", "--img", "64", "--epochs", "1", "--workers", "0",
                     "--sync-bn", "--project", str(tmp_path / "runs"), "--name", "sbn"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "sbn"
    assert json.loads((run / "metrics.json").read_text())["world_size"] == 2
    log = (run / "train.log").read_text()
    assert "BatchNorm layers synchronised across 2 ranks" in log
    import paddle

    state = paddle.load(str(run / "weights" / "last.pdparams"))
    assert any(k.endswith(".bn._variance") for k in state)   # BatchNorm's own keys: loads without --sync-bn
