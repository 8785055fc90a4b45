"""ppmulti launch for real: gloo ranks on this CPU, two "nodes" on loopback addresses, taken ports, missing nodes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launching import ALLREDUCE, REPO, SLEEPER, free_ports, launch_env

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def _records(out: Path, n: int) -> list[dict]:
    files = sorted(out.glob("rank*.json"))
    assert len(files) == n, [f.name for f in files]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.seam
def test_two_ranks_on_one_machine(launches, tmp_path):
    out = tmp_path / "out"
    proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"), ALLREDUCE, str(out),
                          "--", "--flag-for-script")
    assert launches.wait(proc, 120) == 0, launches.output(proc)[-3000:]
    records = _records(out, 2)
    for rank, rec in enumerate(records):
        assert rec["sum"] == 1.0 and rec["world_size"] == 2 and rec["name"] == "__main__"
        assert rec["argv"] == [str(out), "--", "--flag-for-script"]
        env = rec["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == \
            (str(rank), str(rank), "2", "2")
        assert f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" == env["PADDLE_MASTER"]  # the store Paddle uses
        assert env["PADDLE_DISTRI_BACKEND"] == "gloo"


@pytest.mark.seam
def test_two_nodes_with_ips_and_flags_start_port(launches, tmp_path):
    start = free_ports(2) + 1          # start_port - 1 is ppmulti's rendezvous on node 0
    env = launch_env(FLAGS_START_PORT=str(start))
    out = tmp_path / "out"
    common = ["--ips", "127.0.0.2,127.0.0.3", "--rdzv-timeout", "60"]
    dry = subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", *common, "--host", "127.0.0.2",
                          "--dry-run", ALLREDUCE, str(out)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert f"--start_port {start} " in dry.stdout.splitlines()[0], dry.stdout + dry.stderr
    node0 = launches.start(*common, "--host", "127.0.0.2", "--log_dir", str(tmp_path / "l0"), ALLREDUCE, str(out),
                           env=env)
    node1 = launches.start(*common, "--host", "127.0.0.3", "--log_dir", str(tmp_path / "l1"), ALLREDUCE, str(out),
                           env=env)
    assert launches.wait(node0, 150) == 0, launches.output(node0)[-3000:]
    assert launches.wait(node1, 60) == 0, launches.output(node1)[-3000:]
    records = _records(out, 2)
    for rank, rec in enumerate(records):
        assert rec["sum"] == 1.0 and rec["env"]["RANK"] == str(rank) and rec["env"]["GROUP_RANK"] == str(rank)
        assert rec["env"]["PADDLE_TRAINER_ENDPOINTS"] == f"127.0.0.2:{start},127.0.0.3:{start}"
        assert rec["env"]["MASTER_ADDR"] == "127.0.0.2" and rec["env"]["MASTER_PORT"] == str(start)


@pytest.mark.seam
def test_two_nodes_with_master_addr(launches, tmp_path):
    port = free_ports(2)
    out = tmp_path / "out"
    common = ["--nnodes", "2", "--master_addr", "127.0.0.1", "--master_port", str(port), "--rdzv-timeout", "60"]
    node1 = launches.start(*common, "--node_rank", "1", "--log_dir", str(tmp_path / "l1"), ALLREDUCE, str(out))
    time.sleep(0.5)                  # node 1 first: it must wait for node 0, not fail
    node0 = launches.start(*common, "--node_rank", "0", "--log_dir", str(tmp_path / "l0"), ALLREDUCE, str(out))
    assert launches.wait(node0, 150) == 0, launches.output(node0)[-3000:]
    assert launches.wait(node1, 60) == 0, launches.output(node1)[-3000:]
    records = _records(out, 2)
    assert [r["sum"] for r in records] == [1.0, 1.0]
    assert [r["env"]["RANK"] for r in records] == ["0", "1"] and records[1]["env"]["GROUP_RANK"] == "1"
    assert "node 1 joined" in launches.output(node0)


@pytest.mark.seam
@pytest.mark.parametrize("how", ["master_port", "master_port_multinode", "start_port", "FLAGS_START_PORT"])
def test_taken_port_is_a_one_line_error_naming_port_and_flag(launches, tmp_path, how):
    port = free_ports(2)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", port))
    blocker.listen(1)
    env = None
    if how == "master_port":
        args, flag = ["--nproc_per_node", "2", "--master_port", str(port)], "--master_port"
    elif how == "master_port_multinode":
        args, flag = ["--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port",
                      str(port)], "--master_port"
    elif how == "start_port":
        args, flag = ["--ips", "127.0.0.1", "--nproc_per_node", "2", "--start_port", str(port)], "--start_port"
    else:
        args, flag, env = ["--ips", "127.0.0.1", "--nproc_per_node", "2"], "FLAGS_START_PORT", \
            launch_env(FLAGS_START_PORT=str(port))
    try:
        t = time.time()
        proc = launches.start(*args, ALLREDUCE, str(tmp_path / "out"), env=env)
        code = launches.wait(proc, 30)
        text = launches.output(proc)
    finally:
        blocker.close()
    assert code == 2 and time.time() - t < 25, text   # refused before any rank starts (margin: a loaded machine)
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    assert f"port {port} " in errors[0] and flag in errors[0] and "already in use" in errors[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.seam
@pytest.mark.parametrize("who", ["node0_alone", "node1_alone", "ips_node0_alone"])
def test_missing_node_times_out_and_is_named(launches, tmp_path, who):
    port = free_ports(2)
    if who == "node0_alone":
        args = ["--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port", str(port)]
        needle = "missing node_rank 1"
    elif who == "node1_alone":
        args = ["--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--master_port", str(port)]
        needle = f"node 0 at 127.0.0.1:{port} did not answer"
    else:
        args = ["--ips", "127.0.0.2,127.0.0.3", "--host", "127.0.0.2", "--start_port", str(port + 1)]
        needle = "missing node_rank 1 (127.0.0.3)"
    t = time.time()
    proc = launches.start(*args, "--rdzv-timeout", "4", ALLREDUCE, str(tmp_path / "out"))
    code = launches.wait(proc, 30)
    text = launches.output(proc)
    assert code != 0 and time.time() - t < 30, text
    assert needle in text and "--rdzv-timeout" in text, text


def test_sigterm_reaches_the_ranks(launches, tmp_path):
    out = tmp_path / "out"
    proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"), SLEEPER, str(out))
    deadline = time.time() + 60
    while len(list(out.glob("pid*"))) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in out.glob("pid*")]
    assert len(pids) == 2, launches.output(proc)
    proc.send_signal(signal.SIGTERM)           # to ppmulti only, as a scheduler would
    launches.wait(proc, 45)
    assert proc.returncode != 0
    time.sleep(0.5)
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"ranks {alive} outlived the launch"


RESTART = str(REPO / "tests" / "fixtures" / "restart_script.py")


def test_failing_rank_is_named_with_its_error(launches, tmp_path):
    out = tmp_path / "out"
    proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"), RESTART, str(out), "raise")
    assert launches.wait(proc, 90) != 0
    text = launches.output(proc)
    assert "rank 1 failed: ValueError: rank one fails on purpose" in text, text[-2000:]
    # an error before any training step ended comes back on every start: no --max_restarts hint (issue 45)
    assert "--max_restarts" not in text
    assert (out / "starts.txt").read_text().count("\n") == 2   # no restart without --max_restarts


def test_max_restarts_restarts_every_rank_after_a_sigkill(launches, tmp_path):
    out = tmp_path / "out"
    proc = launches.start("--nproc_per_node", "2", "--max_restarts", "2", "--log_dir", str(tmp_path / "log"),
                          RESTART, str(out), "kill-once")
    assert launches.wait(proc, 120) == 0, launches.output(proc)[-3000:]
    text = launches.output(proc)
    assert "rank 1 died without a Python error" in text and "1 of 2 restarts" in text, text[-2000:]
    starts = sorted((out / "starts.txt").read_text().split())
    assert starts == ["0:0", "0:1", "1:0", "1:1"]           # both ranks started again, once


def test_max_restarts_gives_up_naming_rank_and_cause(launches, tmp_path):
    out = tmp_path / "out"
    proc = launches.start("--nproc_per_node", "2", "--max_restarts", "1", "--log_dir", str(tmp_path / "log"),
                          RESTART, str(out), "raise")
    assert launches.wait(proc, 120) != 0
    text = launches.output(proc)
    assert "giving up after 1 restart(s): rank 1 failed: ValueError: rank one fails on purpose" in text, text[-2000:]
    assert "the same error as the last attempt, before any training step ended" in text
    assert (out / "starts.txt").read_text().count("\n") == 4


def test_nodes_disagreeing_on_nnodes_stop_both_naming_the_difference(launches, tmp_path):
    port = free_ports(2)
    common = ["--node_rank", "{}", "--master_addr", "127.0.0.1", "--master_port", str(port), "--rdzv-timeout", "20"]
    node0 = launches.start("--nnodes", "2", *[a.format(0) for a in common], ALLREDUCE, str(tmp_path / "out"))
    time.sleep(1.0)
    node1 = launches.start("--nnodes", "3", *[a.format(1) for a in common], ALLREDUCE, str(tmp_path / "out"))
    assert launches.wait(node0, 40) != 0 and launches.wait(node1, 40) != 0
    for proc in (node0, node1):
        text = launches.output(proc)
        assert "has --nnodes 3, node 0 has --nnodes 2" in text, text[-1500:]
