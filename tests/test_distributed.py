"""Collective training for real: several gloo ranks on this CPU, started by ppmulti's and Paddle's launchers."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import DEMO_CONFIG, REPO, demo_overrides, run_tool
from launching import Launches, free_ports, launch_env

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def _train_args(data, out, *extra):
    return [str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG), "-o", *demo_overrides(data), *extra,
            "--output", str(out)]


@pytest.mark.seam
def test_two_ranks_train_eval_checkpoint(two_rank_run):
    """`ppmulti launch --nproc_per_node 2 tools/train.py --batch 8 --epochs 2 --eval` (conftest.two_rank_run)."""
    out = two_rank_run.path
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 8
    assert metrics["images"] == 16                     # every val image scored once across the 2 shards
    assert len(metrics["per_rank_images_per_s"]) == 2
    log0 = (out / "train.log").read_text()
    assert "world size 2, global batch 8 (4 per rank)" in log0
    assert "lr 0.001 = base_lr 0.002 x effective batch 8 / ref_batch 16" in log0
    assert (out / "logs" / "rank1.log").is_file()      # rank 1 logs to its own file only
    assert (out / "weights" / "last.pdparams").is_file() and (out / "weights" / "best.pdparams").is_file()
    assert not list(out.glob("weights/*rank1*"))


def test_train_py_device_cpu_nproc_relaunches(small_demo, tmp_path):
    out = tmp_path / "run"
    proc = run_tool(_train_args(small_demo, out, "--device", "cpu", "--nproc", "2", "--epochs", "1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["world_size"] == 2


@pytest.mark.seam
def test_paddle_launcher_without_ppmulti(small_demo, tmp_path):
    out = tmp_path / "run"
    proc = run_tool(["-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "plog"), "--nproc_per_node", "2",
                     *_train_args(small_demo, out, "--epochs", "1")])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    # ppdet semantics when no --batch is given: TrainReader.batch_size (8) per rank
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 16


def test_global_batch_not_divisible(small_demo, tmp_path):
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                     *_train_args(small_demo, tmp_path / "run", "--batch", "7")], cwd=tmp_path)
    assert proc.returncode != 0
    assert "--batch 7 is not divisible by the world size 2" in _all_output(proc, tmp_path)


def _all_output(proc, tmp_path) -> str:
    """What the launcher printed plus every worker log Paddle wrote under tmp_path/log."""
    text = proc.stdout + proc.stderr
    return text + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("workerlog*"))


def _weights(npz):
    data = np.load(npz)
    return {k: data[k] for k in data.files}


@pytest.mark.seam
def test_two_ranks_equal_one_rank_with_double_batch(tmp_path, repo):
    script = str(repo / "tests" / "fixtures" / "equivalence_train.py")
    one = run_tool([script, str(tmp_path / "one.npz"), "8", "6"])
    assert one.returncode == 0, one.stderr[-2000:]
    two = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", script, str(tmp_path / "two.npz"),
                    "8", "6"], cwd=tmp_path)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
    half = run_tool([script, str(tmp_path / "half.npz"), "4", "6"])
    assert half.returncode == 0
    a, b, c = _weights(tmp_path / "one.npz"), _weights(tmp_path / "two.npz"), _weights(tmp_path / "half.npz")
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
    # the control: a different global batch really gives different weights
    assert max(np.abs(a[k] - c[k]).max() for k in a) > 1e-4


@pytest.mark.parametrize("mode", ["master", "ips"])
def test_two_nodes_train_together(small_demo, tmp_path, mode):
    """Two "machines" on loopback: one rank each, one world of 2, one run directory."""
    out = tmp_path / "run"
    port = free_ports(4)
    launches = Launches(tmp_path)
    try:
        procs = []
        for rank, host in enumerate(("127.0.0.2", "127.0.0.3")):
            if mode == "master":
                flags = ["--master_addr", "127.0.0.1", "--master_port", str(port), "--nnodes", "2",
                         "--node_rank", str(rank)]
            else:
                flags = ["--ips", "127.0.0.2,127.0.0.3", "--host", host, "--start_port", str(port + 1)]
            flags += ["--nproc_per_node", "1", "--log_dir", str(tmp_path / f"log{rank}")]
            procs.append(launches.start(*flags, *_train_args(small_demo, out, "--batch", "8", "--epochs", "1"),
                                        env=launch_env()))
        codes = [launches.wait(p, timeout=400) for p in procs]
        assert codes == [0, 0], [launches.output(p)[-2000:] for p in procs]
    finally:
        launches.close()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch"] == 8
    assert (out / "logs" / "rank1.log").is_file()


def _rank_pid(rank: int, marker: str) -> int | None:
    """The pid of training rank ``rank`` whose command line mentions ``marker`` (our run directory); not one
    of its data-loader children, which share its environment."""
    from pathlib import Path

    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if marker in cmdline and "worker.py" in cmdline and f"PADDLE_TRAINER_ID={rank}".encode() in environ:
            found[int(proc.name)] = ppid
    roots = [pid for pid, ppid in found.items() if ppid not in found]
    return roots[0] if len(roots) == 1 else None


@pytest.mark.seam
def test_sigkill_of_one_rank_restarts_and_resumes(small_demo, tmp_path):
    """Issue 6: kill -9 one rank during epoch 2; --max_restarts brings every rank back from the last
    checkpoint and the run still finishes every epoch. Epochs 3-5 are the margin: the first log line of epoch 2
    can be its last step, and finding the rank's pid in /proc takes a while on a loaded machine (with 3 epochs
    the kill once landed after the run had finished training)."""
    import os
    import signal
    import time

    out = tmp_path / "run"
    launches = Launches(tmp_path)
    try:
        proc = launches.start("--nproc_per_node", "2", "--max_restarts", "1", "--log_dir", str(tmp_path / "log"),
                              *_train_args(small_demo, out, "snapshot_epoch=1", "--batch", "8", "--epochs", "5"),
                              env=launch_env())
        log = out / "train.log"
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and "epoch 2/5 step" in log.read_text():
                break
            time.sleep(0.2)
        pid = _rank_pid(1, str(out))
        assert pid is not None, launches.output(proc)[-3000:]
        os.kill(pid, signal.SIGKILL)
        assert launches.wait(proc, 400) == 0, launches.output(proc)[-3000:]
    finally:
        launches.close()
    text = launches.output(proc)
    said = [line for line in text.splitlines() if "restart" in line]   # the launcher's lines, whole, if it fails
    assert any("rank 1 died without a Python error" in line and "1 of 1 restarts" in line for line in said), said
    assert "launch restart 1: resuming" in log.read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 5 and metrics["world_size"] == 2
    epochs = [line.split(",")[0] for line in (out / "results.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2", "3", "4", "5"]


def _processes_mentioning(marker: str) -> list[int]:
    from pathlib import Path

    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _sigterm_when_logged(tmp_path, train_args, log, text: str) -> tuple[int, float]:
    """Launch 2 ranks, send SIGTERM to the launcher once ``text`` is in ``log``; (exit code, seconds to exit)."""
    import signal
    import time

    launches = Launches(tmp_path)
    try:
        proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"), *train_args,
                              env=launch_env())
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and text in log.read_text():
                break
            time.sleep(0.2)
        assert proc.poll() is None, launches.output(proc)[-3000:]
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        code = launches.wait(proc, 60)
        took = time.time() - sent
        time.sleep(0.5)
    finally:
        launches.close()
    return code, took


def test_sigterm_saves_the_interrupted_epoch_and_it_resumes(small_demo, tmp_path):
    """Issue 6: SIGTERM to the launcher ends every process within seconds, after rank 0 saved a checkpoint
    of the interrupted epoch; --resume finishes the run from there."""
    import paddle

    out = tmp_path / "run"
    code, took = _sigterm_when_logged(tmp_path, _train_args(small_demo, out, "--batch", "8", "--epochs", "20"),
                                      out / "train.log", "epoch 2/20 step 2/6")
    left = _processes_mentioning(str(out))
    assert code != 0 and took < 20, (code, took)
    assert not left, f"processes left behind: {left}"
    text = (out / "train.log").read_text()
    assert "SIGTERM: stopped in epoch 2 after step" in text, text[-2000:]
    state = paddle.load(str(out / "weights" / "last.pdstate"))["train"]
    assert state["epoch"] == 1 and 0 < state["step_in_epoch"] < 6
    proc = run_tool(_train_args(small_demo, out, "--resume", str(out), "--epochs", "2"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 2
    epochs = [line.split(",")[0] for line in (out / "results.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2"]


def test_resume_on_another_world_size_keeps_the_effective_batch(small_demo, tmp_path):
    """Issues 6 and 24: a run trained on 2 ranks resumes on 1 rank with the same effective batch (and so the same
    LR and optimizer steps per epoch): the same batch per rank, twice the accumulation, said in the log; a
    --batch on resume keeps it by accumulating; --accumulate on resume changes it and rescales the LR."""
    out = tmp_path / "run"
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                     *_train_args(small_demo, out, "--batch", "8", "--epochs", "1")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = (out / "train.log").read_text()
    lr_said = re.search(r"lr \S+ = base_lr \S+ x effective batch 8 / ref_batch \d+", first).group(0)

    proc = run_tool(_train_args(small_demo, out, "--resume", str(out), "--epochs", "2"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "train.log").read_text()[len(first):]
    assert ("resuming a run of 2 ranks on 1 ranks: the effective batch stays 8 (global batch 4, 4 per rank, "
            "x accumulate 2)") in log, log[-3000:]
    assert ("world size 1, global batch 4 (4 per rank) x accumulate 2 = effective batch 8 (keeps the resumed "
            "effective batch 8), 12 batches (6 optimizer steps) per epoch") in log      # 48 images / 4
    assert lr_said in log                          # the same scaled LR as the 2-rank start
    assert "lr rescaled" not in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["global_batch"], metrics["effective_batch"], metrics["epochs"]) == \
        (1, 4, 8, 2)

    proc = run_tool(_train_args(small_demo, out, "--resume", str(out), "--epochs", "3", "--batch", "4",
                                "--accumulate", "1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "train.log").read_text()
    assert "resuming with effective batch 4 instead of 8: lr rescaled to" in log
    assert json.loads((out / "metrics.json").read_text())["effective_batch"] == 4


def test_yolov5_launch_line_two_ranks(small_demo, tmp_path):
    """Issue 4: README's YOLOv5 line, `ppmulti launch --nproc_per_node 2 tools/train.py --batch B --data D
    --cfg yolov5s.yaml --weights '' --device 0,1`, on this CPU: two gloo ranks train YOLOv5s from YOLO data
    (--device 0,1 asks for GPUs; without them the config falls back to the CPU with one warning line)."""
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", str(REPO / "tools" / "train.py"),
                     "--batch", "8", "--data", str(small_demo / "data.yaml"), "--cfg", "yolov5s.yaml",
                     "--weights", "", "--device", "0,1", "--img", "64", "--epochs", "1", "--workers", "0",
                     "--project", str(tmp_path / "runs"), "--name", "exp"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "exp"
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["global_batch"], metrics["epochs"]) == (2, 8, 1)
    assert metrics["images"] == 16 and 0.0 <= metrics["mAP50"] <= 1.0     # both shards of the val split scored
    log = (run / "train.log").read_text()
    # a YOLOv5 command line accumulates to YOLOv5's nominal batch: 64 / 8 = 8 batches per optimizer step
    assert ("world size 2, global batch 8 (4 per rank) x accumulate 8 = effective batch 64 (YOLOv5's nominal batch "
            "64; --accumulate N overrides), 6 batches (1 optimizer step after the warmup) per epoch") in log
    resolved = (run / "config.yml").read_text()
    assert "YOLOv5Head" in resolved and "YOLODataSet" in resolved
    assert "depth_mult: 0.33" in resolved and "width_mult: 0.5" in resolved     # yolov5s.yaml -> the s config
    assert (run / "logs" / "rank1.log").is_file()


def test_sigterm_stops_at_the_next_step_whatever_log_iter(small_demo, tmp_path):
    """Issue 45: the ranks vote on a stop after every step (a two-number all-reduce), not every log_iter steps:
    with log_iter (50) longer than an epoch (6 steps), SIGTERM still stops them at the next step and saves there."""

    import paddle

    out = tmp_path / "run"
    args = [str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo), "log_iter=50",
            "--batch", "8", "--epochs", "20", "--output", str(out)]
    code, took = _sigterm_when_logged(tmp_path, args, out / "train.log", "epoch 1 done")
    assert code == 128 + 15 and took < 25, (code, took)
    text = (out / "train.log").read_text()
    stopped = re.search(r"SIGTERM: stopped (in epoch (\d+) after step (\d+)/6|after epoch (\d+))", text)
    assert stopped, text[-2000:]
    state = paddle.load(str(out / "weights" / "last.pdstate"))["train"]
    if stopped.group(2):   # mid-epoch, at the step it names
        assert (state["epoch"], state["step_in_epoch"]) == (int(stopped.group(2)) - 1, int(stopped.group(3)))
    else:
        assert (state["epoch"], state["step_in_epoch"]) == (int(stopped.group(4)), 0)
    assert state["epoch"] <= 2     # within a step or so of the signal sent after epoch 1, not epochs later
