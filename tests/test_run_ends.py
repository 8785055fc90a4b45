"""How runs end (issue 45): an evolution killed by any signal takes its candidates' trainings with it; the
``--max_restarts`` hint follows only crashes a restart could get past; two launches from one directory keep their
own logs; the launcher's closing line agrees with what rank 0 did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launching import Launches, launch_env

from ppmulti.common import heartbeat as H
from ppmulti.procs.launch.runner import LOG_LOCK, _RankWatch, claim_log_dir, interruption_lines, restart_could_help


# ----------------------------------------------------------------------------- pure
def _watch(tmp_path: Path, failed: dict[int, str], step: int | None = None, gone: int | None = 0) -> _RankWatch:
    for rank, text in failed.items():
        (tmp_path / f"rank{rank}.failed").write_text(text + "\n")
    if step is not None:
        (tmp_path / "rank0.progress").write_bytes(H.pack(3, step, time.time(), "backward"))
    watch = _RankWatch(str(tmp_path))
    watch.first_gone = gone
    return watch


@pytest.mark.parametrize("failed, step, helps", [
    ({}, None, True),                                                        # killed by a signal (OOM killer)
    ({0: "RuntimeError: parameter has been ready before. Please set find_unused_parameters=True"}, 0, False),
    ({0: "ValueError: bad key in the config"}, None, False),                # before any report
    ({0: "exited with code 1"}, 0, False),
    ({0: "ValueError: a corrupt image"}, 57, True),                          # after training steps ran
    ({0: "RuntimeError: Connection reset by peer"}, 0, True),               # lost a peer
    ({0: "MemoryError: "}, 0, True),
    ({0: "exited with code 143"}, 0, True),
], ids=["signal", "step-1-error", "error-before-report", "exit-1", "later-error", "peer", "memory", "sigterm-exit"])
def test_a_restart_is_suggested_only_where_it_could_help(tmp_path, failed, step, helps):
    assert restart_could_help(_watch(tmp_path, failed, step), str(tmp_path)) is helps


def test_a_second_launch_in_the_same_log_directory_gets_its_own(tmp_path):
    log = str(tmp_path / "log")
    first, lock1, note1 = claim_log_dir(log)
    second, lock2, note2 = claim_log_dir(log)
    try:
        assert (first, note1) == (log, None) and (tmp_path / "log" / LOG_LOCK).is_file()
        assert second == os.path.join(log, "launch2") and "in use by another running launch" in note2
    finally:
        lock1.close()
        lock2.close()
    again, lock3, _ = claim_log_dir(log)     # freed when the launch ends (or dies: an flock)
    lock3.close()
    assert again == log


def test_the_launchers_line_says_when_rank_0_had_finished():
    lines = interruption_lines("SIGTERM", None, "runs/exp", ["tools/train.py"], finished=True)
    assert lines == ["SIGTERM came as the run ended: rank 0 had finished it (runs/exp), nothing to resume"]
    lines = interruption_lines("SIGINT", {"where": "in epoch 2 after step 3/9", "checkpoint": "w/last.pdstate",
                                          "run_dir": "runs/exp"}, "runs/exp", ["tools/train.py"])
    assert lines[0] == "SIGINT: the ranks stopped in epoch 2 after step 3/9 and saved w/last.pdstate"


# ----------------------------------------------------------------------------- real launches
def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("import os, sys, time, signal\nrank = int(os.environ.get('PADDLE_TRAINER_ID', '0'))\n" + body)
    return str(path)


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_restart_hint_follows_only_crashes_a_restart_could_help(tmp_path):
    launches = Launches(tmp_path)
    try:
        broken = _script(tmp_path, "broken.py", "raise ValueError('the config names no such layer')\n")
        proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "l1"), broken)
        assert launches.wait(proc, 120) != 0
        text = launches.output(proc)
        assert "failed: ValueError: the config names no such layer (exit code 1)" in text, text[-3000:]
        assert "--max_restarts" not in text
        # asked to restart: once, then it gives up on the same error instead of using every restart
        proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "l2"), "--max_restarts", "3",
                              broken)
        assert launches.wait(proc, 180) != 0
        text = launches.output(proc)
        assert text.count("restarting every rank") == 1, text[-3000:]
        assert "the same error as the last attempt, before any training step ended (a restart cannot fix it)" in text
        killed = _script(tmp_path, "killed.py", "time.sleep(1)\nif rank == 1:\n    os.kill(os.getpid(), 9)\n"
                                                "time.sleep(60)\n")
        proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "l3"), killed)
        assert launches.wait(proc, 120) != 0
        text = launches.output(proc)
        assert "killed by a signal" in text and "pass --max_restarts N to restart automatically" in text, text[-3000:]
    finally:
        launches.close()


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_launches_from_one_directory_keep_their_own_logs(tmp_path):
    """Without --log_dir both would write ./log, and Paddle's launcher shows each console what it reads back from
    log/workerlog.0: each showed the other's lines. The second now writes log/launch2/ and says so."""
    script = _script(tmp_path, "say.py", "print(f'I am launch {sys.argv[1]} rank {rank}', flush=True)\n"
                                         "time.sleep(6)\nprint(f'launch {sys.argv[1]} done', flush=True)\n")
    launches = Launches(tmp_path)
    try:
        first = launches.start("--nproc_per_node", "2", script, "A")
        deadline = time.time() + 60
        while time.time() < deadline and not (tmp_path / "log" / "workerlog.0").is_file():
            time.sleep(0.1)
        second = launches.start("--nproc_per_node", "2", script, "B")
        assert launches.wait(first, 120) == 0 and launches.wait(second, 120) == 0
        a, b = launches.output(first), launches.output(second)
    finally:
        launches.close()
    assert "I am launch A rank 0" in a and "launch A done" in a and "launch B" not in a, a[-3000:]
    assert "I am launch B rank 0" in b and "launch B done" in b and "launch A" not in b, b[-3000:]
    assert "log/ is in use by another running launch: this launch's logs go to log/launch2/" in b
    assert "launch B" in (tmp_path / "log" / "launch2" / "workerlog.0").read_text()
    assert "launch B" not in (tmp_path / "log" / "workerlog.0").read_text()


# ----------------------------------------------------------------------------- evolution
def _processes(*marks: bytes) -> dict[int, str]:
    """Live (not zombie) processes whose command line holds every mark: pid -> state."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if all(m in cmdline for m in marks) and state not in ("Z", "X"):
                found[int(entry.name)] = state
    return found


@pytest.mark.slow
@pytest.mark.multiproc
def test_an_evolution_killed_by_sigkill_takes_its_candidates_training_with_it(tmp_path):
    """SIGKILL leaves the evolution no say; Linux sends its candidate SIGTERM (PR_SET_PDEATHSIG, set as the
    supervisor starts it), so the training stops at its next step and saves, as on any SIGTERM."""
    from ppmulti.common.synthdata import generate

    data = tmp_path / "data"
    generate(data, fmt="yolo", n_train=16, n_val=4, size=64, seed=5)
    project = tmp_path / "evo"
    cmd = [sys.executable, "-m", "ppmulti.cli", "evolve", "--devices", "cpu", "--workers", "1", "--generations", "1",
           "--project", str(project), "--", "--data", str(data / "data.yaml"), "--cfg", "yolov5n", "--weights", "",
           "--img", "64", "--epochs", "50", "--batch", "4", "--workers", "0"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=launch_env(), start_new_session=True)
    candidate = project / "candidates" / "0000"
    mark = str(candidate).encode()
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            log = candidate / "train.log"
            if log.is_file() and "world size" in log.read_text():
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the evolution ended before its candidate trained"
        training = _processes(b"ppmulti.procs.train_command", mark)
        assert training, "no candidate training found"
        time.sleep(1.0)   # a step or two
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.time() + 60
        while time.time() < deadline and _processes(b"ppmulti.procs.train_command", mark):
            time.sleep(0.2)
        left = _processes(b"ppmulti.procs.train_command", mark)
    finally:
        with_leftovers = _processes(mark)
        for pid in with_leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not left, f"the candidate's training outlived its evolution: {left}"
    assert "SIGTERM: stopped " in (candidate / "train.log").read_text()
    assert (candidate / "weights" / "last.pdstate").is_file()     # saved: a later evolution resumes it
