"""Detached runs as a user meets them: launch --detach returns at once, ps / logs follow it, stop leaves a
checkpoint and no process behind; unknown runs are one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppmulti.common import envvars as E
from ppmulti.procs.launch.command import pop_detach

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def _cli(args: list[str], home: Path, cwd: Path, timeout: float = 120):
    env = {**os.environ, E.PPMULTI_HOME: str(home),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _ps(home: Path, cwd: Path) -> dict[str, dict]:
    proc = _cli(["ps", "--json"], home, cwd)
    assert proc.returncode == 0, proc.stderr
    return {r["id"]: r for r in json.loads(proc.stdout)}


def _wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _processes_tagged(token: str) -> list[int]:
    """Every live process whose environment carries this run's tag (read here, independently of detach.py)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if f"{E.PPMULTI_RUN_ID}={token}".encode() in f.read().split(b"\0"):
                    found.append(int(name))
        except (OSError, IndexError):
            continue
    return found


def _train_args(data: Path, run: Path, epochs: int) -> list[str]:
    return [str(REPO / "tools/train.py"), "--data", str(data / "data.yaml"), "--cfg", "yolov5n", "--weights", "",
            "--img", "64", "--epochs", str(epochs), "--batch", "8", "--device", "cpu", "--workers", "0",
            "--optimizer", "AdamW", "--output", str(run)]


@pytest.fixture(scope="module")
def tiny_yolo(tmp_path_factory) -> Path:
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("detach_data") / "demo"
    generate(root, fmt="yolo", n_train=16, n_val=8, size=96, seed=7)
    return root


# ----------------------------------------------------------------------------- pure
@pytest.mark.parametrize("argv, expected", [
    (["--detach", "--nproc_per_node", "2", "t.py", "-x"], (True, ["--nproc_per_node", "2", "t.py", "-x"])),
    (["--nproc_per_node", "2", "--detach", "t.py"], (True, ["--nproc_per_node", "2", "t.py"])),
    (["--nproc_per_node", "2", "--detach", "--", "t.py"], (True, ["--nproc_per_node", "2", "--", "t.py"])),
    (["--nproc_per_node", "2", "t.py", "--detach"], (False, ["--nproc_per_node", "2", "t.py", "--detach"])),
    (["t.py", "--detach"], (False, ["t.py", "--detach"])),
])
def test_detach_is_a_launch_flag_only_before_the_script(argv, expected):
    assert pop_detach(argv) == expected


# ----------------------------------------------------------------------------- unknown runs
@pytest.mark.parametrize("command", [["logs", "nope"], ["logs", "-f", "42"], ["stop", "nope"], ["stop", "../x"]])
def test_unknown_run_is_one_line(tmp_path, home, command):
    proc = _cli(command, home, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: no run '{command[-1]}' (ppmulti ps lists them)"]


def test_ps_without_runs(tmp_path, home):
    proc = _cli(["ps"], home, tmp_path)
    assert proc.returncode == 0 and "no detached runs" in proc.stdout


def test_detach_with_bad_launch_flags_fails_in_the_foreground(tmp_path, home):
    proc = _cli(["launch", "--detach", "--rdzv_conf", "timeout=5", "t.py"], home, tmp_path)
    assert proc.returncode == 2 and "--rdzv_conf" in proc.stderr
    assert not (home / "runs").exists()


# ----------------------------------------------------------------------------- real detached trainings
@pytest.mark.slow
@pytest.mark.multiproc
def test_launch_detach_ps_logs(tmp_path, home, tiny_yolo):
    run = tmp_path / "run"
    t = time.time()
    proc = _cli(["launch", "--detach", "--nproc_per_node", "1", *_train_args(tiny_yolo, run, epochs=2)], home, tmp_path)
    returned = time.time() - t
    assert proc.returncode == 0, proc.stderr
    assert returned < 30.0, returned   # returns at once, not after the 2-epoch run (margin: a loaded machine)
    assert proc.stdout.startswith("started run 1 ")
    first = _ps(home, tmp_path)["1"]
    assert first["state"] == "running" and "tools/train.py" in first["command"]
    record = json.loads((home / "runs" / "1" / "run.json").read_text())
    assert record["pid"] == record["pgid"] == record["sid"]
    assert os.getsid(record["pid"]) == record["pid"] != os.getsid(0)   # its own session: the terminal can go

    done = _wait(lambda: (r := _ps(home, tmp_path)["1"])["state"] != "running" and r, 300, "the run to end")
    assert done["state"] == "finished" and done["exit_code"] == 0, done
    assert done["epoch"] == "2/2" and "mAP50=" in done["metrics"] and "mAP50-95=" in done["metrics"]
    assert done["run_dir"] == str(run)
    table = _cli(["ps"], home, tmp_path).stdout.splitlines()
    assert table[0].split()[:4] == ["ID", "STATE", "EPOCH", "METRICS"] and table[1].split()[:3] == ["1", "finished",
                                                                                                 "2/2"]
    logs = _cli(["logs", "1"], home, tmp_path)
    assert logs.returncode == 0 and "epoch 2 done" in logs.stdout and '"run_dir"' in logs.stdout
    follow = _cli(["logs", "1", "-f"], home, tmp_path, timeout=30)   # an ended run: -f prints and returns
    assert follow.returncode == 0 and follow.stdout == logs.stdout
    assert (run / "detached.log").read_text() == logs.stdout
    assert not _processes_tagged(record["token"])


@pytest.mark.slow
@pytest.mark.multiproc
def test_stop_checkpoints_and_leaves_no_process(tmp_path, home, tiny_yolo):
    run = tmp_path / "run"
    # the ranks agree on the stop after every step (issue 45), so it lands within a step of the signal
    proc = _cli(["launch", "--detach", "--nproc_per_node", "2", *_train_args(tiny_yolo, run, epochs=200)],
                home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    token = json.loads((home / "runs" / "1" / "run.json").read_text())["token"]

    def first_epoch_or_end():
        if (run / "results.csv").is_file() and len((run / "results.csv").read_text().splitlines()) >= 2:
            return "epoch"
        return None if _ps(home, tmp_path)["1"]["state"] == "running" else "ended"

    if _wait(first_epoch_or_end, 300, "the first epoch") == "ended":
        logs = _cli(["logs", "1"], home, tmp_path).stdout
        raise AssertionError(f"the run ended before its first epoch:\n{logs[-3000:]}")
    assert _ps(home, tmp_path)["1"]["state"] == "running"
    assert len(_processes_tagged(token)) >= 5   # wrapper, ppmulti launch, Paddle's launcher, 2 ranks

    t = time.time()
    stop = _cli(["stop", "1"], home, tmp_path, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "run 1 stopped" in stop.stdout and "killed" not in stop.stdout, stop.stdout
    assert f"--resume {run}" in stop.stdout
    assert time.time() - t < 60
    assert _processes_tagged(token) == []
    after = _ps(home, tmp_path)["1"]
    assert after["state"] == "stopped" and after["exit_code"] != 0, after
    # Paddle's launcher got it (its lines are kept off the console, in LOG_DIR/launcher.log: procs/launch/console.py)
    assert "Terminating with signal 15" in (tmp_path / "log" / "launcher.log").read_text()
    assert "SIGTERM: stopped " in (run / "train.log").read_text()               # and rank 0 saved

    check = subprocess.run([sys.executable, "-c", "import sys; from ppmulti.rank.engine.checkpoint import load_state; "
                            "s = load_state(sys.argv[1]); print(s['train']['epoch'], sorted(s))",
                            str(run / "weights" / "last.pdstate")], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    epoch, keys = check.stdout.split(" ", 1)
    assert int(epoch) >= 1 and "'model'" in keys and "'optimizer'" in keys

    again = _cli(["stop", "1"], home, tmp_path)
    assert again.returncode == 0 and "not running" in again.stdout


@pytest.mark.slow
@pytest.mark.multiproc
def test_evolve_detach_shows_generations(tmp_path, home, tiny_yolo):
    project = tmp_path / "evo"
    proc = _cli(["evolve", "--detach", "--generations", "1", "--project", str(project), "--",
                 "--data", str(tiny_yolo / "data.yaml"), "--cfg", "yolov5n", "--weights", "", "--img", "64",
                 "--epochs", "1", "--batch", "8", "--workers", "0"], home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    done = _wait(lambda: (r := _ps(home, tmp_path)["1"])["state"] != "running" and r, 300, "the evolution to end")
    assert done["state"] == "finished", (done, _cli(["logs", "1"], home, tmp_path).stdout[-3000:])
    assert done["epoch"] == "gen 1/1" and "best fitness=" in done["metrics"]
    assert "1/1 generations" in (project / "evolve.log").read_text()
