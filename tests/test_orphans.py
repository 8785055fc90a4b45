"""No orphans: however a rank ends, none of its processes (data-loader workers included) nor its shared memory stays."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from launching import WATCH, Launches, launch_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def _processes_of(out: Path) -> set[int]:
    """Ranks and their loader workers (forked: the same command line, which names ``out``)."""
    mark = str(out).encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if mark in cmdline and b"watch_script.py" in cmdline and state not in ("Z", "X"):
                found.add(int(entry.name))
    return found


def _shared_memory_of(pids: set[int]) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith("paddle_") and n.split("_")[1].isdigit()
            and int(n.split("_")[1]) in pids]


@pytest.mark.parametrize("how", ["clean", "exception", "sigkill", "abort", "restart"])
def test_nothing_of_a_rank_outlives_the_launch(tmp_path, how):
    out = tmp_path / "out"
    args = ["--nproc_per_node", "2", "--log_dir", str(tmp_path / "log")]
    env = launch_env()
    if how in ("exception", "abort"):
        env["WATCH_DIE"] = "raise" if how == "exception" else "abort"
    if how == "restart":
        args += ["--max_restarts", "1"]
    steps = "60" if how in ("clean", "restart") else "100000"
    launches = Launches(tmp_path)
    try:
        proc = launches.start(*args, WATCH, str(out), "loader", steps, env=env)
        wait_for(out / "step1", proc)
        seen: set[int] = set()
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and len(seen) < 6:   # 2 ranks + 2 workers each
            seen |= _processes_of(out)
            time.sleep(0.1)
        if how in ("sigkill", "restart"):
            os.kill(int((out / "pid1.0").read_text()), signal.SIGKILL)
        code = launches.wait(proc, 240)
        seen |= _processes_of(out)
    finally:
        launches.close()
    text = launches.output(proc)
    assert (code == 0) == (how in ("clean", "restart")), text[-3000:]
    if how == "abort":   # told from SIGKILL by the rank's faulthandler report
        assert "rank 1 died of a fatal signal (Fatal Python error: Aborted" in text, text[-3000:]
    if how == "sigkill":
        assert "rank 1 died without a Python error (killed by a signal" in text, text[-3000:]
    assert len(seen) >= 6, (seen, text[-2000:])                 # the workers really ran
    left = _processes_of(out)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{how}: processes {sorted(left)} outlived the launch"
    assert not _shared_memory_of(seen), f"{how}: shared memory left: {_shared_memory_of(seen)}"
