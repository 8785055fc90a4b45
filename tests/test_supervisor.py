"""The supervisor with real processes: stopping trees, SIGKILL after the grace, the tag sweep, forwarding, causes."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
import uuid

import pytest

from ppmulti.common import procfs
from ppmulti.procs import supervisor as S

# Real processes, but only bare `python -c` children of this test (no launcher, no ranks, no paddle), each test done
# in a few seconds: the supervisor's own logic, in the fast lane.


# s a signalled or finishing child may take to go on a loaded machine (CI runs six suites on 2 cores: once a child
# that exits on SIGTERM was not reaped within 4 s); waits return as soon as it is done
LOADED = 30.0


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _ready(child: S.Child, n: int = 1, timeout: float = LOADED) -> list[str]:
    """The first ``n`` lines the child prints (it prints once it is set up)."""
    lines = []
    deadline = time.monotonic() + timeout
    while len(lines) < n:
        assert time.monotonic() < deadline, f"child printed {lines} within {timeout}s"
        line = child.stdout.readline()
        assert line, f"child ended ({child.poll()}) after printing {lines}"
        lines.append(line.decode().strip())
    return lines


def _gone(pid: int, timeout: float = LOADED) -> bool:
    deadline = time.monotonic() + timeout
    while procfs.alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


SPAWN = """
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]{extra})
    print(grandchild.pid, flush=True)
    time.sleep(60)
"""


def test_stop_ends_child_and_grandchild_of_its_group():
    child = S.start(_py(SPAWN.format(extra="")), stdout=S.PIPE)
    grandchild = int(_ready(child)[0])
    assert os.getpgid(grandchild) == child.pid     # the grandchild stayed in the child's own group
    t0 = time.monotonic()
    assert child.stop(grace=20.0) == -signal.SIGTERM
    assert time.monotonic() - t0 < 10.0   # it did not wait out the grace (the margin is for a loaded machine)
    assert _gone(grandchild), "the grandchild outlived stop()"
    assert child.cause() == "killed by signal SIGTERM" and child.exit_code == 128 + signal.SIGTERM


def test_a_child_ignoring_sigterm_gets_sigkill_after_the_grace():
    child = S.start(_py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
    """), stdout=S.PIPE)
    _ready(child)
    t0 = time.monotonic()
    assert child.stop(grace=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - t0 < 10.0   # SIGKILL at the grace, not at the child's 60 s
    assert child.cause() == "killed by signal SIGKILL" and child.exit_code == 137


def test_sweep_finds_a_tagged_process_that_left_the_group():
    tag = f"t{uuid.uuid4().hex}"
    child = S.start(_py(SPAWN.format(extra=", start_new_session=True")), stdout=S.PIPE,
                    env={**os.environ, "PPMULTI_TEST_TAG": tag})
    escaped = int(_ready(child)[0])
    assert os.getsid(escaped) == escaped != os.getsid(child.pid)
    child.stop(grace=2.0)
    assert procfs.alive(escaped), "a process in a session of its own does not get the group's signal"
    assert procfs.tagged("PPMULTI_TEST_TAG", tag) == [escaped]
    swept = S.sweep("PPMULTI_TEST_TAG", tag, grace=LOADED)
    assert swept.left == [] and swept.killed == 0     # it went on SIGTERM, within the grace
    assert _gone(escaped)


def test_a_tagged_process_caught_inside_exec_is_found(monkeypatch):
    """Inside exec a process's environment and command line read empty for a moment (Popen has already returned):
    the scan reads such a process again instead of passing it over. A real child of this test, whose first two
    reads are made to look as they do in that window."""
    tag = f"t{uuid.uuid4().hex}"
    child = S.start(_py('print("ready", flush=True); import time; time.sleep(60)'), stdout=S.PIPE,
                    env={**os.environ, "PPMULTI_TEST_TAG": tag})
    _ready(child)
    real, calls = procfs._read, {"n": 0}

    def in_exec(pid, name):
        if pid == child.pid and name in ("environ", "cmdline") and calls["n"] < 4:
            calls["n"] += 1
            return b""
        return real(pid, name)

    monkeypatch.setattr(procfs, "_read", in_exec)
    try:
        assert procfs.tagged("PPMULTI_TEST_TAG", tag) == [child.pid] and calls["n"] == 4
    finally:
        child.stop(grace=2.0)


def test_stop_tree_stops_the_group_then_sweeps_what_ignored_sigterm_elsewhere():
    tag = f"t{uuid.uuid4().hex}"
    stubborn = """
        import signal, subprocess, sys, time
        code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print(1, flush=True); time.sleep(60)")
        g = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
        g.stdout.readline()
        print(g.pid, flush=True)
        time.sleep(60)
    """
    child = S.start(_py(stubborn), stdout=S.PIPE, env={**os.environ, "PPMULTI_TEST_TAG": tag})
    escaped = int(_ready(child)[0])
    swept = S.stop_tree(child, LOADED, "PPMULTI_TEST_TAG", tag, sweep_grace=0.3)
    assert child.returncode == -signal.SIGTERM
    assert swept.left == [] and swept.killed == 1     # the escaped one ignored SIGTERM: SIGKILL
    assert _gone(escaped)


@pytest.mark.parametrize("form", ["children", "callback"])
def test_forward_signals_reaches_the_child_and_restores_the_handler(form):
    child = S.start(_py("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda s, f: (print("got", s, flush=True), sys.exit(5)))
        print("ready", flush=True)
        time.sleep(60)
    """), stdout=S.PIPE)
    _ready(child)
    before = signal.getsignal(signal.SIGTERM)
    seen: list[int] = []

    def callback(signum: int) -> None:
        seen.append(signum)
        child.signal(signum)

    with S.forward_signals([child] if form == "children" else callback) as caught:
        signal.raise_signal(signal.SIGTERM)
        assert child.wait(LOADED) == 5
    assert caught == [signal.SIGTERM] and seen == ([signal.SIGTERM] if form == "callback" else [])
    assert _ready(child) == [f"got {int(signal.SIGTERM)}"]
    assert signal.getsignal(signal.SIGTERM) is before
    assert child.cause() == "exit code 5"


def test_exit_causes_are_named():
    three = S.start(_py("import sys; sys.exit(3)"))
    assert three.wait(LOADED) == 3 and three.cause() == "exit code 3" and three.exit_code == 3
    killed = S.start(_py("import time; time.sleep(60)"))
    assert killed.cause() == "running"
    assert killed.signal(signal.SIGKILL)
    assert killed.wait(LOADED) == -signal.SIGKILL
    assert killed.cause() == "killed by signal SIGKILL" and killed.exit_code == 137
    assert not killed.signal(signal.SIGTERM)   # reaped: nothing is signalled (its pid may be someone else's)
    assert S.cause(-99) == "killed by signal 99"


def test_run_captures_output_and_stops_at_the_timeout():
    ran = S.run(_py("import sys; print('out'); print('err', file=sys.stderr); sys.exit(2)"), timeout=LOADED)
    assert (ran.code, ran.stdout, ran.stderr) == (2, "out\n", "err\n")
    t0 = time.monotonic()
    # one write (print under PYTHONUNBUFFERED writes the newline apart), and time enough on a loaded machine for
    # the child to start and write it before the timeout
    slow = S.run(_py("import sys, time; sys.stdout.write('early\\n'); sys.stdout.flush(); time.sleep(60)"),
                 timeout=5.0)
    assert slow.code is None and slow.stdout == "early\n" and time.monotonic() - t0 < LOADED   # not the child's 60 s
    with pytest.raises(FileNotFoundError):
        S.run(["/nonexistent/ppmulti-no-such-program"], timeout=1.0)
