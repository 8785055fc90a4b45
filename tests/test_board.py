"""``ppmulti board``: a real VisualDL server on loopback over real logs, read back over its HTTP API."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, LossStub, run_tool

# values exact in float32 (VisualDL stores scalars as float32), so they come back equal
LOSS = {0: 2.5, 1: 1.25, 2: 0.75, 3: 0.5}
MAP50 = {1: 0.125, 3: 0.375}

# loopback only: never route 127.0.0.1 through a proxy from the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _write_run(run: Path) -> Path:
    """A run directory with a small real VisualDL log in run/vdl, as VisualDLHook writes it."""
    from visualdl import LogWriter

    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yml").write_text("epoch: 4\n")
    with LogWriter(logdir=str(run / "vdl")) as writer:
        for step, value in LOSS.items():
            writer.add_scalar(tag="train/loss", value=value, step=step)
        for step, value in MAP50.items():
            writer.add_scalar(tag="eval/mAP50", value=value, step=step)
    return run / "vdl"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, method: str, **params) -> object:
    url = f"http://127.0.0.1:{port}/app/api/{method}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with _OPENER.open(url, timeout=10) as resp:
        body = json.loads(resp.read().decode())
    assert body["status"] == 0, body
    return body["data"]


def _wait_for_api(proc: subprocess.Popen, port: int, timeout: float = 60.0) -> list:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"board exited early with {proc.returncode}:\n{out}\n{err}")
        try:
            return _api(port, "runs")
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.3)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"board did not answer on 127.0.0.1:{port} within {timeout}s:\n{out}\n{err}")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def _board(run: Path):
    """``ppmulti board run --port <a free port>`` started; yields (process, port, runs) once its API answers,
    and kills the process on the way out if it is still running."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ppmulti.cli", "board", str(run), "--port", str(port)],
                            cwd=REPO, env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc, port, _wait_for_api(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "terminate"])
def test_board_serves_the_run_scalars_over_http(tmp_path, stop):
    logdir = _write_run(tmp_path / "run")
    with _board(tmp_path / "run") as (proc, port, runs):
        assert runs == [str(logdir)]
        tags = _api(port, "scalar/tags")
        assert tags["runs"] == runs and sorted(tags["tags"][0]) == ["eval/mAP50", "train/loss"]
        for tag, written in (("train/loss", LOSS), ("eval/mAP50", MAP50)):
            rows = _api(port, "scalar/list", run=runs[0], tag=tag)  # [[wall ms, step, value], ...]
            assert {step: value for _, step, value in rows} == written, (tag, rows)
            assert [step for _, step, _ in rows] == sorted(written)
        for lang in (None, "de-DE,de;q=0.9"):  # the UI page too, whatever language the browser asks for
            req = urllib.request.Request(f"http://127.0.0.1:{port}/app/index",
                                         headers={"Accept-Language": lang} if lang else {})
            with _OPENER.open(req, timeout=10) as resp:
                assert resp.status == 200 and b"<html" in resp.read().lower()
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err
    assert f"VisualDL: http://127.0.0.1:{port}  (logs: {logdir})" in out.splitlines()


def test_find_logdirs_over_a_directory_of_runs(tmp_path):
    from ppmulti.procs.runs.board import find_logdirs

    a = _write_run(tmp_path / "out" / "a")
    nested = _write_run(tmp_path / "out" / "sweep" / "b")
    (tmp_path / "out" / "no_logs_yet" / "vdl").mkdir(parents=True)  # empty vdl/: not a log
    assert find_logdirs(tmp_path / "out") == [a, nested]
    assert find_logdirs(tmp_path / "out" / "a") == [a]
    assert find_logdirs(a) == [a]


def test_board_without_logs_is_one_line_exit_2(tmp_path):
    (tmp_path / "run").mkdir()
    line = _one_error_line(run_tool(["-m", "ppmulti.cli", "board", str(tmp_path / "run")], env=_env(),
                                    timeout=60))
    assert str(tmp_path / "run") in line and "no VisualDL logs" in line
    line = _one_error_line(run_tool(["-m", "ppmulti.cli", "board", str(tmp_path / "missing")], env=_env(),
                                    timeout=60))
    assert str(tmp_path / "missing") in line


def test_board_port_in_use_is_one_line_exit_2(tmp_path):
    _write_run(tmp_path / "run")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = run_tool(["-m", "ppmulti.cli", "board", str(tmp_path / "run"), "--port", str(port)],
                        env=_env(), timeout=60)
    line = _one_error_line(proc)
    assert f"port {port}" in line and "--port" in line


def _write_run_with_hook(run: Path, log_iter: int = 2) -> Path:
    """Two epochs of 4 steps of a 2-rank run's log, written by the real VisualDLHook from made-up figures."""
    from types import SimpleNamespace

    from ppmulti.rank.engine.hooks import VisualDLHook

    cfg = {"log_iter": log_iter, "epoch": 2, "architecture": "YOLOv3", "use_ema": True, "eval_height": 160,
           "OptimizerBuilder": {"optimizer": {"type": "AdamW", "weight_decay": 0.0005}}}
    trainer = SimpleNamespace(
        run_dir=run, cfg=cfg, world=2, state=SimpleNamespace(global_step=0),
        batch=SimpleNamespace(global_batch=16, per_rank=8),
        lr_plan=SimpleNamespace(lr=0.002, base_lr=0.002, ref_batch=16, warmup_steps=60),
        opts=SimpleNamespace(config="configs/demo/ppyoloe_demo.yml", seed=0, weights=None))
    hook = VisualDLHook()
    hook.before_train(trainer)
    for epoch in range(2):
        data_time = 0.0
        for step in range(4):
            trainer.state.global_step += 1
            data_time += DATA_WAIT[step]
            hook.after_step(trainer, epoch, step, {"loss": LossStub(2.0 - epoch), "loss_cls": LossStub(0.5)},
                            0.002, data_time)
        hook.after_epoch(trainer, SimpleNamespace(
            epoch=epoch, images_per_s=22.5, losses=EPOCH_LOSS[epoch + 1], lr=EPOCH_LR[epoch + 1],
            per_rank_images_per_s=RANK_IPS[epoch + 1],
            metrics={"mAP50": MAP50[2 * epoch + 1], "mAP50_95": MAP50[2 * epoch + 1] / 2,
                     "per_rank_images_per_s": [40.0, 36.0]}))
    hook.after_train(trainer)
    return run / "vdl"


DATA_WAIT = [0.25, 0.75, 0.5, 1.5]        # per step; the log keeps the mean over each interval of 2 steps
RANK_IPS = {1: [12.5, 10.0], 2: [13.0, 11.5]}
EPOCH_LOSS = {1: {"loss": 1.75, "loss_cls": 0.5}, 2: {"loss": 0.875, "loss_cls": 0.25}}
EPOCH_LR = {1: 0.5, 2: 0.25}


def _scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """Every scalar of a VisualDL log directory as {tag: {step: value}}, read with VisualDL's own reader."""
    from visualdl import LogReader

    out: dict[str, dict[int, float]] = {}
    for name in os.listdir(logdir):
        reader = LogReader(file_path=str(logdir / name))
        for tag in reader.get_tags().get("scalar", []):
            out.setdefault(tag, {}).update({r.id: r.value for r in reader.get_data("scalar", tag)})
    return out


def test_epochs_shorter_than_the_log_interval_still_have_loss_curves(tmp_path):
    """An evolution candidate's epochs can be shorter than log_iter: no step scalar, but epoch means are there."""
    scalars = _scalars(_write_run_with_hook(tmp_path / "run", log_iter=10))
    assert "train/loss" not in scalars
    assert scalars["epoch/loss"] == {1: 1.75, 2: 0.875}
    assert scalars["epoch/loss_cls"] == {1: 0.5, 2: 0.25}
    assert scalars["epoch/lr"] == {1: 0.5, 2: 0.25}


@pytest.mark.slow
@pytest.mark.multiproc
def test_board_serves_data_time_per_rank_throughput_and_hparams(tmp_path):
    logdir = _write_run_with_hook(tmp_path / "run")
    with _board(tmp_path / "run") as (proc, port, runs):
        assert runs == [str(logdir)]
        tags = set(_api(port, "scalar/tags")["tags"][0])
        assert {"train/loss", "train/loss_cls", "train/lr", "train/images_per_s", "train/data_time",
                "epoch/loss", "epoch/loss_cls", "epoch/lr", "epoch/images_per_s",
                "epoch/images_per_s_rank0", "epoch/images_per_s_rank1",
                "eval/mAP50", "eval/mAP50_95", "eval/images_per_s_rank0", "eval/images_per_s_rank1"} <= tags

        def scalars(tag):
            return {step: value for _, step, value in _api(port, "scalar/list", run=runs[0], tag=tag)}

        # global steps 2, 4 (epoch 1) and 6, 8 (epoch 2): mean data wait of steps (1, 2) and (3, 4)
        assert scalars("train/data_time") == {2: 0.5, 4: 1.0, 6: 0.5, 8: 1.0}
        assert scalars("epoch/images_per_s_rank0") == {1: 12.5, 2: 13.0}
        assert scalars("epoch/images_per_s_rank1") == {1: 10.0, 2: 11.5}

        listed = _api(port, "hparams/list")
        assert [r["name"] for r in listed] == runs
        hp = listed[0]["hparams"]
        assert hp["config"] == "ppyoloe_demo.yml" and hp["optimizer"] == "AdamW"
        assert hp["world_size"] == 2 and hp["global_batch"] == 16 and hp["batch_per_rank"] == 8
        assert hp["epochs"] == 2 and hp["eval_size"] == 160 and hp["use_ema"] == 1
        assert hp["lr"] == pytest.approx(0.002) and hp["warmup_steps"] == 60
        assert "momentum" not in hp and "weights" in hp       # None is left out; "" is kept
        assert listed[0]["metrics"] == {"eval/mAP50": MAP50[3], "eval/mAP50_95": MAP50[3] / 2}  # the last
        indicators = _api(port, "hparams/indicators")
        assert {h["name"] for h in indicators["hparams"]} >= {"world_size", "global_batch", "lr", "optimizer"}
        assert {m["name"] for m in indicators["metrics"]} == {"eval/mAP50", "eval/mAP50_95"}
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (out, err)
