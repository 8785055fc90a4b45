"""Elastic node counts on etcd: the flag spellings (golden), their refusals, membership and rounds on a real etcd
started on loopback, and two loopback nodes of which one is SIGKILLed mid-run while the other finishes alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import require_system
from launching import Launches, free_ports, launch_env
from ppmulti.common.errors import UserError
from ppmulti.procs.launch.elastic import Elastic, Etcd, Membership, run_elastic
from ppmulti.procs.launch.result import Launch, LaunchState
from ppmulti.procs.launch.flags import build_plan, parse_launch_args


def plan_of(*argv: str):
    return build_plan(parse_launch_args([*argv, "t.py"]), {}, set(), 0)


# --- the flags (fast) --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, want", [
    (["--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "10.0.0.1:2379"],
     Elastic("10.0.0.1", 2379, 1, 2, "default", 30.0, "--rdzv-endpoint")),
    (["--nnodes", "2:4", "--rdzv_backend", "etcd", "--rdzv_endpoint", "etcd-0:23790", "--rdzv-id", "yolo"],
     Elastic("etcd-0", 23790, 2, 4, "yolo", 30.0, "--rdzv-endpoint")),
    (["--nnodes", "1:2", "--master", "etcd://10.0.0.1:2379", "--job_id", "run1", "--elastic_level", "1"],
     Elastic("10.0.0.1", 2379, 1, 2, "run1", 30.0, "--master")),
    (["--nnodes", "3", "--master", "etcd://10.0.0.1", "--elastic_level", "0", "--elastic_timeout", "5"],
     Elastic("10.0.0.1", 2379, 3, 3, "default", 5.0, "--master")),
])
def test_elastic_spellings_map_to_one_etcd_plan(argv, want):
    plan = plan_of(*argv, "--master_port", "29700")
    assert plan.elastic == want
    assert (plan.nnodes, plan.master_port, plan.master_addr) == (1, 29700, None)   # per round, from etcd


@pytest.mark.parametrize("argv, needle", [
    (["--nnodes", "3:2", "--master", "etcd://h:2379"], "--nnodes 3:2: MIN 3 is more than MAX 2"),
    (["--nnodes", "0:2", "--master", "etcd://h:2379"], "--nnodes 0:2: need at least 1 node"),
    (["--nnodes", "1:x", "--master", "etcd://h:2379"], "--nnodes '1:x': expected N or MIN:MAX"),
    (["--nnodes", "1:2"], "--nnodes 1:2: elastic MIN:MAX node ranges need an etcd master (--rdzv-backend etcd"),
    (["--master", "etcd://h:2379"], "an etcd master (--master) needs --nnodes MIN:MAX"),
    (["--nnodes", "1:2", "--rdzv-backend", "etcd"],
     "--rdzv-backend etcd needs the address of etcd: add --rdzv-endpoint"),
    (["--nnodes", "1:2", "--rdzv-endpoint", "h:2379"], "--rdzv-endpoint h:2379 needs --rdzv-backend etcd"),
    (["--nnodes", "1:2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h:2379"],
     "--rdzv-backend etcd-v2: torchrun's etcd-v2 backend speaks etcd's old v2 API"),
    (["--nnodes", "1:2", "--rdzv-backend", "static", "--rdzv-endpoint", "h:1"], "--rdzv-backend static: ppmulti"),
    (["--nnodes", "1:2", "--master", "etcd://h:2379", "--node_rank", "1"],
     "--node_rank cannot be combined with an etcd master"),
    (["--nnodes", "1:2", "--master", "etcd://h:2379", "--elastic_level", "0"],
     "--elastic_level 0 keeps the node count fixed, but --nnodes 1:2 is a range"),
    (["--nnodes", "1:2", "--master", "etcd://h:2379", "--elastic_level", "-1"], "--elastic_level -1: turns"),
    (["--nnodes", "1:2", "--master", "etcd://h:99999"], "--master 99999: not a TCP port"),
    (["--nnodes", "1:2", "--master", "etcd://h:2379", "--check-network"],
     "--check-network cannot be combined with an etcd master"),
    (["--elastic_timeout", "5"], "--elastic_timeout applies to elastic runs on an etcd master"),
])
def test_elastic_refusals_are_one_line(argv, needle):
    with pytest.raises(UserError) as info:
        plan_of(*argv)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value), str(info.value)


def test_an_elastic_pytorchjob_pod_runs_with_the_etcd_flags():
    """A pod of an elastic PyTorchJob (PET_NNODES=MIN:MAX) is refused by name without them, and planned with them:
    the node count and rank come from etcd, not from the operator's variables."""
    pod = {"PET_NNODES": "1:4", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "job-master-0",
           "PET_MASTER_PORT": "23456", "PET_RDZV_ENDPOINT": "etcd:2379"}
    with pytest.raises(UserError, match=r"PET_NNODES=1:4: an elastic PyTorchJob .* ppmulti launch --nnodes 1:4 "
                                        r"--rdzv-backend etcd --rdzv-endpoint HOST:2379"):
        build_plan(parse_launch_args(["t.py"]), pod, set(), 0)
    plan = build_plan(parse_launch_args(["--nnodes", "1:4", "--rdzv-backend", "etcd", "--rdzv-endpoint", "etcd:2379",
                                         "t.py"]), pod, set(), 0)
    assert plan.elastic == Elastic("etcd", 2379, 1, 4)


def test_unreachable_etcd_is_one_line_naming_the_endpoint(tmp_path):
    port = free_ports(1)
    proc = subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--nnodes", "1:2", "--rdzv-backend",
                           "etcd", "--rdzv-endpoint", f"127.0.0.1:{port}", "t.py"], cwd=tmp_path,
                          env=launch_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: etcd at 127.0.0.1:{port} (--rdzv-endpoint) is not "
                                                   f"reachable"), proc.stderr


# --- a real etcd on loopback -------------------------------------------------------------------------------------
@pytest.fixture
def etcd():
    """etcd on two free loopback ports with a temporary data directory; stopped and removed however the test ends."""
    binary = shutil.which("etcd")
    require_system(None if binary else "etcd is not installed", "apt-get install etcd-server")
    data = tempfile.mkdtemp(prefix="ppmulti-etcd-")
    client = free_ports(2, ("127.0.0.1",))
    peer = client + 1
    proc = subprocess.Popen([binary, "--name", "t", "--data-dir", data,
                             "--listen-client-urls", f"http://127.0.0.1:{client}",
                             "--advertise-client-urls", f"http://127.0.0.1:{client}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"t=http://127.0.0.1:{peer}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{client}/version", timeout=1).read()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    pytest.fail("etcd did not start on loopback")
                time.sleep(0.2)
        yield client
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
def test_rounds_follow_the_live_members(etcd):
    """Two members agree on round 0 in registration order; one's lease ends; the other's next round is alone;
    a member that comes back waits for the next round and is taken in there."""
    db = Etcd("127.0.0.1", etcd)
    spec = Elastic("127.0.0.1", etcd, 1, 2, job="rounds", last_call=30.0)
    a = Membership(db, spec, "127.0.0.2", 1, ttl=2)
    b = Membership(db, spec, "127.0.0.3", 1, ttl=2)
    try:
        rounds = {}
        agree_b = threading.Thread(target=lambda: rounds.setdefault("b", b.agree(0, 30)))
        agree_b.start()
        rounds["a"] = a.agree(0, 30)
        agree_b.join(30)
        assert rounds["a"] == rounds["b"] and rounds["a"].members == (a.node, b.node)
        assert rounds["a"].hosts == ("127.0.0.2", "127.0.0.3")
        assert a.lost(rounds["a"]) is None
        db.put(f"{b.root}finished/0/{b.node}", "1")      # b's ranks ended round 0 well: b may leave
        b.close()
        assert a.lost(rounds["a"]) is None
        db.delete_prefix(f"{b.root}finished/")
        b = Membership(db, spec, "127.0.0.3", 1, ttl=2)      # b again, then its process "dies"
        rounds["a"] = type(rounds["a"])(0, (a.node, b.node), ("127.0.0.2", "127.0.0.3"))
        b._stop.set()                  # b's process "dies": its lease is no longer kept alive
        deadline = time.time() + 10
        while a.lost(rounds["a"]) is None and time.time() < deadline:
            time.sleep(0.2)
        assert a.lost(rounds["a"]) == "node 1 (127.0.0.3) left: its etcd lease expired"
        started = time.monotonic()
        alone = a.agree(1, 30)
        assert alone.members == (a.node,) and time.monotonic() - started < 15   # not agree's 30 s for the dead node
        c = Membership(db, spec, "127.0.0.3", 1, ttl=2)      # the node comes back while round 1 runs
        try:
            joined = {}
            agree_c = threading.Thread(target=lambda: joined.setdefault("c", c.agree(c.latest_round() + 1, 30)))
            agree_c.start()
            time.sleep(1)
            assert a.get_round(2) is None and "c" not in joined     # taken in at the next round only
            nxt = a.agree(2, 30)                                       # round 1 ended: the next restart
            agree_c.join(30)
            assert nxt.members == (a.node, c.node) and joined["c"] == nxt
        finally:
            c.close()
    finally:
        a.close()
        b.close()


@pytest.mark.slow
def test_too_few_nodes_and_a_finished_job_are_one_line(etcd):
    db = Etcd("127.0.0.1", etcd)
    a = Membership(db, Elastic("127.0.0.1", etcd, 2, 3, job="few"), "127.0.0.2", 1, ttl=2)
    try:
        with pytest.raises(UserError, match=r"^elastic round 0: 1 node\(s\) ready in etcd at 127\.0\.0\.1:\d+ "
                                            r"\(--rdzv-endpoint\) after 1s, need at least 2 \(--nnodes 2:3\)$"):
            a.agree(0, 1)
        a.mark_done()
    finally:
        a.close()
    with pytest.raises(UserError, match="job 'few' already finished in etcd at"):
        Membership(db, Elastic("127.0.0.1", etcd, 2, 3, job="few"), "127.0.0.2", 1)


@pytest.mark.slow
def test_run_elastic_repeats_rounds_and_gives_up_after_max_restarts(etcd):
    """Without Paddle: a launch that always fails runs 1 + --max_restarts rounds, each with PPMULTI_RESTART = k."""
    plan = plan_of("--nnodes", "1:1", "--rdzv-backend", "etcd", "--rdzv-endpoint", f"127.0.0.1:{etcd}",
                   "--rdzv-id", "retry", "--max_restarts", "2", "--host", "127.0.0.2")
    attempts = []

    def fail(one, environ, out, launch_dir, k, launch, rdzv):
        attempts.append((k, one.nnodes, one.node_rank, one.master_addr))
        return 1

    launch = Launch()
    assert run_elastic(plan, {}, None, fail, launch) == 1
    assert attempts == [(0, 1, 0, "127.0.0.2"), (1, 1, 0, "127.0.0.2"), (2, 1, 0, "127.0.0.2")]
    assert (launch.restarts, launch.state) == (2, LaunchState.RENDEZVOUS)   # the runner then ends it FAILED


# --- two loopback nodes, one SIGKILLed mid-run ------------------------------------------------------------------
def _tree(root: int) -> list[int]:
    """``root`` and every descendant (Paddle's ranks run in sessions of their own but stay its descendants)."""
    parent = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [child for child, ppid in parent.items() if ppid == pid]
    return found


def _launch_dirs(pids: list[int]) -> set[str]:
    dirs = set()
    for pid in pids:
        try:
            for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if item.startswith(b"PPMULTI_LAUNCH_DIR="):
                    dirs.add(item.split(b"=", 1)[1].decode())
        except OSError:
            continue
    return dirs


@pytest.mark.slow
@pytest.mark.multiproc
def test_node_lost_mid_run_the_other_finishes_from_the_last_checkpoint(etcd, small_demo, tmp_path):
    from test_distributed import _train_args

    out = tmp_path / "run"
    common = ["--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", f"127.0.0.1:{etcd}", "--rdzv-id",
              "e2e", "--master_port", str(free_ports(2)), "--rdzv-timeout", "120", "--elastic_timeout", "5",
              "--nproc_per_node", "1"]
    train = _train_args(small_demo, out, "snapshot_epoch=1", "--batch", "8", "--epochs", "3")
    launches = Launches(tmp_path)
    left_dirs: set[str] = set()
    try:
        nodes = []
        for i in range(2):    # node A registers first, so it is node 0 of the round
            nodes.append(launches.start(*common, "--host", f"127.0.0.{2 + i}", "--log_dir", str(tmp_path / f"log{i}"),
                                        *train, env=launch_env()))
            deadline = time.time() + 60
            while "elastic: etcd" not in launches.output(nodes[i]) and time.time() < deadline:
                time.sleep(0.2)
        log = out / "train.log"
        deadline = time.time() + 400
        while time.time() < deadline and all(p.poll() is None for p in nodes):
            if log.is_file() and "epoch 2/3 step" in log.read_text():
                break
            time.sleep(0.2)
        assert "elastic round 0: node 1 of 2" in launches.output(nodes[1]), launches.output(nodes[1])[-3000:]
        pids = _tree(nodes[1].pid)
        left_dirs = _launch_dirs(pids)
        for pid in pids:                   # node 1 is lost: every process of it at once
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        code = launches.wait(nodes[0], 600)
    finally:
        launches.close()
        for path in left_dirs:             # what the killed node could not clean up itself
            shutil.rmtree(path, ignore_errors=True)
    text = launches.output(nodes[0])
    assert code == 0, text[-4000:]
    assert "elastic round 0: node 0 of 2 (127.0.0.2, 127.0.0.3), 2 ranks" in text
    assert "elastic round 1: node 0 of 1 (127.0.0.2), 1 ranks" in text, text[-4000:]
    result = json.loads((tmp_path / "log0" / "result.json").read_text())   # the survivor's (runner.run)
    assert (result["state"], result["restarts"], result["ranks"], result["run_dir"]) == \
        ("SUCCEEDED", 1, {"0": 0}, str(out)), result
    train_log = log.read_text()
    assert "launch restart 1: resuming" in train_log
    assert "resuming a run of 2 ranks on 1 ranks: the effective batch stays 8" in train_log, train_log[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and metrics["world_size"] == 1 and metrics["global_batch"] == 8
    epochs = [line.split(",")[0] for line in (out / "results.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2", "3"]


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_node_that_comes_back_is_taken_in_at_the_next_restart(etcd, small_demo, tmp_path):
    """Node 1 is lost in epoch 2 and started again while node 0 trains alone; it waits. When node 0's rank
    then fails, the next round takes both nodes in again, and the run ends on 2 ranks from the same run directory."""
    from test_distributed import _rank_pid, _train_args

    out = tmp_path / "run"
    common = ["--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", f"127.0.0.1:{etcd}", "--rdzv-id",
              "back", "--master_port", str(free_ports(2)), "--rdzv-timeout", "120", "--elastic_timeout", "5",
              "--nproc_per_node", "1"]
    train = _train_args(small_demo, out, "snapshot_epoch=1", "--batch", "8", "--epochs", "4")
    launches = Launches(tmp_path)
    left_dirs: set[str] = set()
    log = out / "train.log"

    def node(i: int):
        proc = launches.start(*common, "--host", f"127.0.0.{2 + i}", "--log_dir", str(tmp_path / f"log{i}"),
                              *train, env=launch_env())
        deadline = time.time() + 60
        while "elastic: etcd" not in launches.output(proc) and time.time() < deadline:
            time.sleep(0.2)
        return proc

    def until(text: str, seconds: float = 300, after: int = 0) -> int:
        """Wait for ``text`` in the log past its first ``after`` characters; return the log's length then."""
        deadline = time.time() + seconds
        while time.time() < deadline and nodes[0].poll() is None:
            seen = log.read_text() if log.is_file() else ""
            if text in seen[after:]:
                return len(seen)
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never came:\n{launches.output(nodes[0])[-3000:]}")

    try:
        nodes = [node(0), node(1)]
        until("epoch 2/4 step")
        pids = _tree(nodes[1].pid)
        left_dirs = _launch_dirs(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        resumed = until("resuming a run of 2 ranks on 1 ranks")
        back = node(1)                                      # node 1 returns while round 1 runs
        time.sleep(3)
        assert "elastic round 2" not in launches.output(back)    # not taken in mid-round
        until("epoch 3/4 step", after=resumed)              # round 1 has saved epoch 2: round 2 resumes from it
        pid = _rank_pid(0, str(out))
        assert pid is not None
        os.kill(pid, signal.SIGKILL)                        # the next restart
        codes = [launches.wait(nodes[0], 600), launches.wait(back, 600)]
    finally:
        launches.close()
        for path in left_dirs:
            shutil.rmtree(path, ignore_errors=True)
    texts = [launches.output(nodes[0]), launches.output(back)]
    assert codes == [0, 0], "\n----\n".join(t[-3000:] for t in texts)
    assert "elastic round 1: node 0 of 1 (127.0.0.2)" in texts[0]
    assert "elastic round 2: node 0 of 2 (127.0.0.2, 127.0.0.3), 2 ranks" in texts[0], texts[0][-3000:]
    assert "elastic round 2: node 1 of 2 (127.0.0.2, 127.0.0.3), 2 ranks" in texts[1], texts[1][-3000:]
    assert "resuming a run of 1 ranks on 2 ranks: the effective batch stays 8" in log.read_text()
    assert f"launch restart 2: resuming {out}" in (out / "logs" / "rank1.log").read_text()   # the returned node
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 4 and metrics["world_size"] == 2 and metrics["global_batch"] == 8
