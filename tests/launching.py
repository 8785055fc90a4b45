"""Test helpers that start ``ppmulti launch`` for real: fixture scripts, free port ranges, a clean environment."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
ALLREDUCE = str(FIXTURES / "allreduce_script.py")
SLEEPER = str(FIXTURES / "launch_sleep.py")
WATCH = str(FIXTURES / "watch_script.py")


def _free(port: int, hosts: tuple[str, ...]) -> bool:
    for host in hosts:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_ports(n: int = 1, hosts: tuple[str, ...] = ("",)) -> int:
    """A base port p with p .. p+n-1 free on every one of ``hosts`` (outside Paddle's random 35100-64000 range)."""
    for _ in range(200):
        base = random.randint(20000, 34000)
        if all(_free(base + i, hosts) for i in range(n)):
            return base
    raise RuntimeError("no free port range")


def launch_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's or cluster's variables, ppmulti importable, ``extra`` set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PADDLE_", "PET_", "FLAGS_START_PORT", "POD_IP", "MASTER_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def wait_for(path: Path, proc, timeout: float = 120) -> str:
    """The stripped text of ``path`` once it has some, while ``proc`` runs; fails after ``timeout`` s."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.2)
    raise AssertionError(f"{path} never appeared")


class Launches:
    """Starts ``ppmulti launch`` processes in their own process groups; kills every group at teardown."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = self.tmp / f"launch{len(self.procs)}.out"
        proc = subprocess.Popen([sys.executable, "-m", "ppmulti.cli", "launch", *args], cwd=self.tmp,
                                env=env or launch_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((proc, log))
        return proc

    def output(self, proc: subprocess.Popen) -> str:
        return next(log for p, log in self.procs if p is proc).read_text(errors="replace")

    def wait(self, proc: subprocess.Popen, timeout: float) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launch did not finish in {timeout}s:\n{self.output(proc)[-3000:]}")

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(proc.pid, sig)
                        proc.wait(timeout=20)
                        break
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        continue


def two_rank_arrays(script: str, tmp_path: Path):
    """``ppmulti launch --nproc_per_node 2 SCRIPT OUT.npz`` in ``tmp_path``; the arrays rank 0 saved (its ``world``
    checked to be 2)."""
    import numpy as np

    from conftest import run_tool

    out = tmp_path / "ranks.npz"
    proc = run_tool(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", script, str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = np.load(out)
    assert int(got["world"]) == 2
    return got
