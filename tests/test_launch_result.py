"""The launcher's states and its result (issue 47, item 4): the state object's moves, and ``LOG_DIR/result.json``
after real two-rank CPU launches of tiny scripts that succeed, exit 3, are SIGKILLed, or whose launcher is
SIGTERMed."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from ppmulti.procs.launch.rendezvous import Agreed, NodeRendezvous, Rendezvous
from ppmulti.procs.launch.result import FINAL, MOVES, Launch, LaunchState, NodeEnd, RunResult, combine, final_state

S = LaunchState


# --- the state object ----------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_launch_that_restarts_once_then_succeeds():
    clock = Clock()
    launch = Launch(clock)
    assert launch.state is S.INIT and not launch.interrupted
    launch.to(S.RUNNING)
    launch.cause = "rank 1 died without a Python error"
    launch.hung = True
    launch.restart()
    assert (launch.state, launch.restarts, launch.hung) == (S.RESTARTING, 1, False)
    launch.to(S.RUNNING)
    launch.ranks = {0: 0, 1: 0}
    clock.now = 112.5
    result = launch.end(final_state(0, launch), 0)
    assert result == RunResult(S.SUCCEEDED, 0, {0: 0, 1: 0}, 1, 12.5, None, None, None)
    assert not result.failed


def test_final_states_follow_what_the_launch_saw():
    launch = Launch()
    assert final_state(1, launch) is S.FAILED
    launch.hung = True
    assert final_state(1, launch) is S.HUNG
    launch.refused = True
    assert final_state(2, launch) is S.REFUSED
    assert launch.interrupt(signal.SIGTERM) and not launch.interrupt(signal.SIGINT)   # the first one counts
    assert final_state(143, launch) is S.INTERRUPTED
    assert final_state(0, launch) is S.SUCCEEDED   # rank 0 had finished when the signal came
    result = launch.end(S.INTERRUPTED, 143)
    assert result.signal == "SIGTERM" and result.failed


def test_moves_are_checked_and_final_states_are_final():
    launch = Launch()
    with pytest.raises(RuntimeError, match="INIT cannot move to RESTARTING"):
        launch.to(S.RESTARTING)
    with pytest.raises(RuntimeError, match="RUNNING is not a final state"):
        launch.end(S.RUNNING, 0)
    launch.end(S.FAILED, 1, "rank 0 failed: exited with code 3")
    for state in LaunchState:
        if state is not S.FAILED:
            with pytest.raises(RuntimeError):
                launch.to(state)
    assert all(not MOVES[s] for s in FINAL) and {s for s in LaunchState if s.final} == FINAL


def test_the_rendezvous_reason_is_the_cause_unless_the_end_gives_one():
    launch = Launch()
    launch.to(S.RENDEZVOUS)
    launch.cause, launch.abort_reason = "rank 2 failed: exited with code 1", "node 1 (10.0.0.2) left"
    assert launch.end(S.FAILED, 1).cause == "node 1 (10.0.0.2) left"
    other = Launch()
    other.abort_reason = "node 1 left"
    assert other.end(S.FAILED, 1, "rendezvous timed out").cause == "rendezvous timed out"


def test_result_json_is_plain_and_written_atomically(tmp_path):
    result = RunResult(S.FAILED, 1, {1: "SIGKILL", 0: "SIGTERM"}, 2, 3.14159, "rank 1 died", "/runs/exp", None)
    path = result.write(str(tmp_path / "log"))
    assert Path(path) == tmp_path / "log" / "result.json"
    assert json.loads(Path(path).read_text()) == {
        "state": "FAILED", "exit_code": 1, "ranks": {"0": "SIGTERM", "1": "SIGKILL"}, "restarts": 2,
        "duration": 3.142, "cause": "rank 1 died", "run_dir": "/runs/exp", "signal": None}
    assert [p.name for p in (tmp_path / "log").iterdir()] == ["result.json"]   # no temporary file left


# --- the fan-out's combined result (ppmulti launch --nodes): nodes' ends -> one result ---------------------------
N0, N1 = "node0 10.0.0.1", "node1 10.0.0.2"


def _own(state: str, code: int, cause: str | None = None, restarts: int = 0, duration: float = 5.0) -> dict:
    """A node's result.json as its launcher writes it (RunResult.to_json)."""
    return json.loads(RunResult(S(state), code, {}, restarts, duration, cause, "/runs/exp" if code == 0 else None,
                                None).to_json())


# (case, the nodes' ends, the exit code, the node that failed, the signal; the state, the cause, each node's
# (state, exit code, source))
COMBINED = [
    ("both succeed, each read from its result.json",
     [NodeEnd(N0, 0, 6.0, result=_own("SUCCEEDED", 0)), NodeEnd(N1, 0, 6.1, result=_own("SUCCEEDED", 0))],
     0, None, None, "SUCCEEDED", None, [("SUCCEEDED", 0, "result.json"), ("SUCCEEDED", 0, "result.json")]),
    ("node 1's rank exits 3: node 1's cause, node 0 stopped (its launcher saw SIGTERM)",
     [NodeEnd(N0, 143, 4.0, stopped=True, result=_own("INTERRUPTED", 143, "rank 0 got SIGTERM")),
      NodeEnd(N1, 3, 3.0, result=_own("FAILED", 3, "rank 1 failed: exited with code 3"))],
     3, 1, None, "FAILED", f"{N1}: rank 1 failed: exited with code 3",
     [("INTERRUPTED", 143, "result.json"), ("FAILED", 3, "result.json")]),
    ("a node's result.json not seen here (another machine): its ssh exit",
     [NodeEnd(N0, 0, 6.0, result=_own("SUCCEEDED", 0)), NodeEnd(N1, 0, 6.2)],
     0, None, None, "SUCCEEDED", None, [("SUCCEEDED", 0, "result.json"), ("SUCCEEDED", 0, "ssh")]),
    ("a node refuses its input (exit 2, no result.json here): REFUSED",
     [NodeEnd(N0, 130, 1.0, stopped=True), NodeEnd(N1, 2, 0.5)],
     2, 1, None, "REFUSED", f"{N1}: its launch refused its input (exit 2)",
     [("INTERRUPTED", 130, "ssh"), ("REFUSED", 2, "ssh")]),
    ("node 1 hung (the watchdog): HUNG",
     [NodeEnd(N0, 143, 9.0, stopped=True), NodeEnd(N1, 1, 9.0, result=_own("HUNG", 1, "rank 1 hung: no progress"))],
     1, 1, None, "HUNG", f"{N1}: rank 1 hung: no progress", [("INTERRUPTED", 143, "ssh"), ("HUNG", 1, "result.json")]),
    ("the ssh connection to node 1 is lost",
     [NodeEnd(N0, 143, 7.0, stopped=True), NodeEnd(N1, 255, 7.0)],
     255, 1, None, "FAILED", f"{N1}: ssh exit 255: the connection failed or was lost",
     [("INTERRUPTED", 143, "ssh"), ("FAILED", 255, "ssh")]),
    ("an older run's result.json that disagrees with the ssh exit is not this run's",
     [NodeEnd(N0, 143, 2.0, stopped=True), NodeEnd(N1, 3, 2.0, result=_own("SUCCEEDED", 0))],
     3, 1, None, "FAILED", f"{N1}: exited with code 3", [("INTERRUPTED", 143, "ssh"), ("FAILED", 3, "ssh")]),
    ("Ctrl-C on the fan-out: INTERRUPTED",
     [NodeEnd(N0, 130, 8.0, stopped=True, result=_own("INTERRUPTED", 130)), NodeEnd(N1, None, 8.0, stopped=True)],
     130, None, "SIGINT", "INTERRUPTED", "SIGINT: the fan-out stopped every node",
     [("INTERRUPTED", 130, "result.json"), ("INTERRUPTED", None, "ssh")]),
]


@pytest.mark.parametrize("case,ends,code,failed,signame,state,cause,nodes", COMBINED, ids=[c[0][:40] for c in COMBINED])
def test_combined_result_golden(case, ends, code, failed, signame, state, cause, nodes):
    result = combine(ends, code, 10.0, failed, signame, "ppm1-ab")
    assert (result.state.value, result.exit_code, result.cause, result.signal) == (state, code, cause, signame)
    assert [(n["state"], n["exit_code"], n["source"]) for n in result.nodes] == nodes


def test_combined_result_json_whole(tmp_path):
    ends = [NodeEnd(N0, 143, 4.0004, stopped=True, result=_own("INTERRUPTED", 143, "rank 0 got SIGTERM", 0, 3.9)),
            NodeEnd(N1, 3, 3.0, result=_own("FAILED", 3, "rank 1 failed: exited with code 3", 1, 2.5))]
    path = combine(ends, 3, 10.12345, 1, None, "ppm1-ab").write(str(tmp_path / "log"))
    assert json.loads(Path(path).read_text()) == {
        "state": "FAILED", "exit_code": 3, "duration": 10.123, "cause": f"{N1}: rank 1 failed: exited with code 3",
        "signal": None, "job": "ppm1-ab", "nodes": [
            {"node": N0, "state": "INTERRUPTED", "exit_code": 143, "ssh_exit": 143, "restarts": 0, "duration": 3.9,
             "cause": "rank 0 got SIGTERM", "run_dir": None, "source": "result.json"},
            {"node": N1, "state": "FAILED", "exit_code": 3, "ssh_exit": 3, "restarts": 1, "duration": 2.5,
             "cause": "rank 1 failed: exited with code 3", "run_dir": None, "source": "result.json"}]}
    assert [p.name for p in (tmp_path / "log").iterdir()] == ["result.json"]   # atomic: no temporary file left


def test_the_fixed_rendezvous_is_a_rendezvous():
    from ppmulti.procs.launch.elastic import EtcdRendezvous
    from ppmulti.procs.launch.plan import LaunchPlan

    plan = LaunchPlan(script="train.py", nproc_per_node=2)
    nodes: Rendezvous = NodeRendezvous({})
    assert nodes.next_round(plan, None) == Agreed(0, plan) and nodes.next_round(plan, None).number == 1
    assert nodes.meet(plan, None, None) == [] and nodes.lost() is None   # one node: nothing to meet
    names = {"next_round", "meet", "lost", "round_ended", "close"}
    assert names <= set(dir(NodeRendezvous)) and names <= set(dir(EtcdRendezvous))


def test_a_launch_refused_before_any_rank_starts_keeps_its_line(tmp_path):
    """In-process, nothing started: a named port that is taken is the command's one line, and the result's cause."""
    from ppmulti.common.errors import UserError
    from ppmulti.procs.launch.plan import LaunchPlan
    from ppmulti.procs.launch.runner import run

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        plan = LaunchPlan(script="train.py", master_port=port, master_port_flag="--master_port",
                          log_dir=str(tmp_path / "log"))
        with pytest.raises(UserError) as refused:
            run(plan, environ={})
    result = _result(tmp_path)
    assert (result["state"], result["exit_code"], result["cause"]) == ("REFUSED", 2, str(refused.value))
    assert f"port {port}" in result["cause"] and result["ranks"] == {} and result["restarts"] == 0


def test_a_dry_run_writes_no_result(tmp_path, capsys):
    from ppmulti.procs.launch.plan import LaunchPlan
    from ppmulti.procs.launch.runner import run

    result = run(LaunchPlan(script="train.py", log_dir=str(tmp_path / "log")), dry_run=True, environ={})
    assert (result.state, result.exit_code) == (S.SUCCEEDED, 0) and capsys.readouterr().out
    assert not (tmp_path / "log" / "result.json").exists()


# --- real launches ---------------------------------------------------------------------------------------------
SCRIPT = """\
import os, signal, sys, time
rank, mode = int(os.environ["RANK"]), sys.argv[1]
if mode == "ok" and rank == 0:   # as a ppmulti training notes its run directory for the launcher
    from ppmulti.common.rundir import RUN_DIR_MARKER
    with open(os.path.join(os.environ["PPMULTI_LAUNCH_DIR"], RUN_DIR_MARKER), "w") as f:
        f.write("runs/train/exp")
up0 = os.path.join(sys.argv[2], "up0")
if mode in ("exit3", "kill") and rank == 1:   # once rank 0 runs, so that Paddle stops it, not its start
    for _ in range(300):
        if os.path.exists(up0):
            break
        time.sleep(0.1)
    if mode == "exit3":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "stop" and rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
if mode in ("exit3", "kill", "sleep", "stop"):
    open(os.path.join(sys.argv[2], f"up{rank}"), "w").close()
    time.sleep(60)
"""


def _launch(launches, tmp_path: Path, mode: str, *flags: str, env=None):
    from launching import launch_env

    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    return launches.start("--nproc_per_node", "2", "--device", "cpu", "--log_dir", str(tmp_path / "log"), *flags,
                          str(script), mode, str(tmp_path), env=launch_env(**(env or {})))


def _result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "log" / "result.json").read_text())


@pytest.mark.slow
@pytest.mark.multiproc
def test_result_of_a_launch_that_succeeds(launches, tmp_path):
    proc = _launch(launches, tmp_path, "ok")
    assert launches.wait(proc, 60) == 0, launches.output(proc)[-2000:]
    result = _result(tmp_path)
    assert (result["state"], result["exit_code"], result["ranks"], result["restarts"]) == \
        ("SUCCEEDED", 0, {"0": 0, "1": 0}, 0)
    assert result["cause"] is None and result["signal"] is None and 0 < result["duration"] < 60
    assert result["run_dir"] == str(tmp_path / "runs" / "train" / "exp")   # absolute: the ranks' cwd is the launch's


@pytest.mark.slow
@pytest.mark.multiproc
def test_result_of_a_rank_that_exits_3(launches, tmp_path):
    secret = "s3cr3t-value-of-the-environment"
    proc = _launch(launches, tmp_path, "exit3", env={"PPMULTI_RDZV_TOKEN": secret})
    code = launches.wait(proc, 60)
    result = _result(tmp_path)
    assert code != 0 and result["exit_code"] == code, launches.output(proc)[-2000:]
    assert result["state"] == "FAILED" and result["ranks"]["1"] == 3 and result["restarts"] == 0
    assert result["ranks"]["0"] == "SIGTERM", result   # Paddle stops the other rank
    assert result["cause"] == "rank 1 failed: exited with code 3"
    assert secret not in (tmp_path / "log" / "result.json").read_text()


@pytest.mark.slow
@pytest.mark.multiproc
def test_result_of_a_rank_sigkilled_on_every_start_counts_the_restarts(launches, tmp_path):
    proc = _launch(launches, tmp_path, "kill", "--max_restarts", "1")
    code = launches.wait(proc, 90)
    text = launches.output(proc)
    assert code != 0 and "1 of 1 restarts" in text, text[-2000:]
    result = _result(tmp_path)
    assert (result["state"], result["exit_code"], result["restarts"]) == ("FAILED", code, 1), result
    assert result["ranks"]["1"] == "SIGKILL", result
    assert result["cause"].startswith("rank 1 died"), result


@pytest.mark.slow
@pytest.mark.multiproc
def test_result_of_a_launcher_sigtermed(launches, tmp_path):
    proc = _launch(launches, tmp_path, "sleep")
    deadline = time.time() + 45
    while not all((tmp_path / f"up{r}").exists() for r in (0, 1)) and time.time() < deadline:
        assert proc.poll() is None, launches.output(proc)[-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)   # to ppmulti only, as a scheduler would
    assert launches.wait(proc, 45) == 128 + signal.SIGTERM
    result = _result(tmp_path)
    assert (result["state"], result["exit_code"], result["signal"]) == ("INTERRUPTED", 143, "SIGTERM"), result
    assert set(result["ranks"]) == {"0", "1"} and "SIGTERM" in result["cause"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_result_of_a_launch_the_hang_watchdog_stopped(launches, tmp_path):
    proc = _launch(launches, tmp_path, "stop", "--hang-timeout", "2")
    code = launches.wait(proc, 60)
    result = _result(tmp_path)
    assert (result["state"], result["exit_code"]) == ("HUNG", code) and code != 0, launches.output(proc)[-2000:]
    assert result["cause"].startswith("hang: rank 1 on node 0 made no progress for 2s"), result
