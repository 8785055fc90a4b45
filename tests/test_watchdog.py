"""The hang watchdog for real: ranks stalled by a switch or a signal are named with their stacks; slow ones are not."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from launching import WATCH, free_ports, launch_env, wait_for

from ppmulti.common import heartbeat as H


REPO = Path(__file__).resolve().parents[1]


# --- the record itself -------------------------------------------------------------------------------------
def test_record_round_trip_and_stall_switch(tmp_path, monkeypatch):
    from ppmulti.rank import heartbeat

    monkeypatch.setattr(heartbeat, "_current", None)
    monkeypatch.setattr(heartbeat, "_stacks", None)
    env = {"PPMULTI_LAUNCH_DIR": str(tmp_path), "PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2",
           "PPMULTI_STALL": "1:forward:2:0.01"}
    beat = heartbeat.install(env)
    try:
        assert H.read(str(tmp_path), 1) == H.Progress(0, -1, H.read(str(tmp_path), 1).time, "start")
        beat.beat("data", 2)
        beat.beat("forward")
        got = H.read(str(tmp_path), 1)
        assert (got.beats, got.step, got.phase) == (2, 2, "forward")
        assert heartbeat._parse_stall("1:forward:2:stop", 1) == ("forward", 2, "stop")
        assert heartbeat._parse_stall("0:forward:2:stop", 1) is None          # another rank's switch
        assert heartbeat._parse_stall("1:nonsense:2:1", 1) is None
        assert heartbeat.install({**env, "PPMULTI_HEARTBEAT": "0"}) is None  # the bench's "without"
    finally:
        import faulthandler

        faulthandler.unregister(H.STACK_SIGNAL)


def test_collectives_inside_the_forward_pass_count_as_waiting(tmp_path, monkeypatch):
    """ppdet's PP-YOLOE head all-reduces inside forward: while in there a rank reports "all-reduce"."""
    import paddle.distributed as pd

    from ppmulti.rank import heartbeat

    seen = []
    for name in heartbeat.COLLECTIVES:
        monkeypatch.setattr(pd, name, lambda *a, _n=name, **k: seen.append((_n, H.read(str(tmp_path), 0).phase)))
    monkeypatch.setattr(heartbeat, "_current", heartbeat.Heartbeat(str(tmp_path), 0))
    assert heartbeat.watch_collectives() == list(heartbeat.COLLECTIVES)
    assert heartbeat.watch_collectives() == []                          # wrapped once
    heartbeat.beat("forward", 7)
    pd.all_reduce(None)
    pd.barrier()
    assert seen == [("all_reduce", "all-reduce"), ("barrier", "all-reduce")]
    assert (H.read(str(tmp_path), 0).phase, H.read(str(tmp_path), 0).step) == ("forward", 7)


# --- stalls are named ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.multiproc
def test_a_rank_sleeping_in_a_step_is_named_with_its_stack(launches, tmp_path):
    out, log = tmp_path / "out", tmp_path / "log"
    proc = launches.start("--nproc_per_node", "2", "--hang-timeout", "6", "--log_dir", str(log),
                          WATCH, str(out), "plain", "100000", env=launch_env(PPMULTI_STALL="1:forward:5:600"))
    assert launches.wait(proc, 180) != 0
    text = launches.output(proc)
    assert "hang: rank 1 on node 0 made no progress for" in text and "in forward at step 5" in text, text[-3000:]
    assert "rank 0 waits in all-reduce at step 5 (waiting for rank 1, not a cause)" in text, text[-3000:]
    assert "rank 0 died" not in text and "rank 0 failed" not in text
    stack1 = (log / "stacks.rank1.txt").read_text()
    assert "_stall_here" in stack1 and "watch_script.py" in stack1
    assert "all_reduce" in (log / "stacks.rank0.txt").read_text()       # the victim waits in the collective


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_stopped_rank_is_named_and_max_restarts_brings_every_rank_back(launches, tmp_path):
    out, log = tmp_path / "out", tmp_path / "log"
    proc = launches.start("--nproc_per_node", "2", "--hang-timeout", "6", "--max_restarts", "1", "--log_dir", str(log),
                          WATCH, str(out), "plain", "150")
    pid = int(wait_for(out / "pid1.0", proc))
    wait_for(out / "step1", proc)
    os.kill(pid, signal.SIGSTOP)                        # the signal the issue used, on the first start only
    assert launches.wait(proc, 300) == 0, launches.output(proc)[-3000:]
    text = launches.output(proc)
    assert ("hang: rank 1 on node 0 made no progress" in text
            and "(stopped: SIGSTOP or a debugger)" in text), text[-3000:]
    assert "restarting every rank (1 of 1 restarts)" in text
    assert (out / "pid0.1").is_file() and (out / "pid1.1").is_file() and (out / "done0").is_file()
    stack1 = (log / "stacks.rank1.txt").read_text()
    assert "(most recent call first)" in stack1 and "watch_script.py" in stack1, stack1


@pytest.mark.seam
@pytest.mark.slow
@pytest.mark.multiproc
def test_the_issue_case_gloo_gives_up_first_and_the_stopped_rank_is_still_the_cause(launches, tmp_path):
    """Default --hang-timeout (minutes): gloo's own 30 s timeout kills the waiting rank 0 first; the stopped
    rank 1 is named, rank 0 only as the one that lost its peer."""
    out = tmp_path / "out"
    proc = launches.start("--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"), WATCH, str(out), "plain",
                          "100000")
    pid = int(wait_for(out / "pid1.0", proc))
    wait_for(out / "step1", proc)
    time.sleep(1.0)
    os.kill(pid, signal.SIGSTOP)
    assert launches.wait(proc, 240) != 0
    text = launches.output(proc)
    assert "hang: rank 1 on node 0 made no progress" in text and "(stopped: SIGSTOP" in text, text[-3000:]
    assert "rank 0 gave up waiting" in text and "rank 0 died without a Python error" not in text, text[-3000:]


# --- slow but moving ranks are left alone ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["slow-eval", "slow-checkpoint", "slow-build"])
def test_slow_but_moving_ranks_never_trigger_it(launches, tmp_path, mode):
    """Rank 0 spends 15 s (three hang timeouts; under gloo's 30 s) evaluating (reporting per batch), saving
    (one long write of CPU work) or building ops (CPU, before its first step ends) while rank 1 waits."""
    out = tmp_path / "out"
    proc = launches.start("--nproc_per_node", "2", "--hang-timeout", "5", "--log_dir", str(tmp_path / "log"),
                          WATCH, str(out), mode, "8", env=launch_env(WATCH_SLOW="15"))
    assert launches.wait(proc, 240) == 0, launches.output(proc)[-3000:]
    assert "hang:" not in launches.output(proc)
    assert (out / "done0").is_file() and (out / "done1").is_file()


# --- two nodes -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.multiproc
def test_across_two_loopback_nodes_the_stalled_node_names_it_and_the_other_reports_a_victim(launches, tmp_path):
    start = free_ports(2) + 1
    common = ["--ips", "127.0.0.2,127.0.0.3", "--start_port", str(start), "--rdzv-timeout", "60",
              "--hang-timeout", "6"]
    env = launch_env(PPMULTI_STALL="1:forward:5:600")
    nodes = [launches.start(*common, "--host", f"127.0.0.{2 + i}", "--log_dir", str(tmp_path / f"log{i}"),
                            WATCH, str(tmp_path / f"out{i}"), "plain", "100000", env=env) for i in range(2)]
    codes = [launches.wait(proc, 240) for proc in nodes]
    text0, text1 = (launches.output(p) for p in nodes)
    assert 0 not in codes, (codes, text0[-2000:], text1[-2000:])
    assert "hang: rank 1 on node 1 made no progress for" in text1 and "in forward at step 5" in text1, text1[-3000:]
    stacks = (tmp_path / "log1" / "stacks.rank1.txt").read_text()
    assert "_stall_here" in stacks, stacks[-3000:]
    assert "rank 0 on node 0 lost its peer" in text0 and "the cause is on another node" in text0, text0[-3000:]
    assert "hang: rank 0" not in text0


# --- the real trainer -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.multiproc
def test_the_trainer_reports_its_phases_and_a_stall_in_forward_is_named(launches, small_demo, tmp_path):
    """ppmulti's own training (PP-YOLOE, whose head all-reduces inside forward): start-up, the first steps'
    op build, evaluation and checkpoints pass under a 20 s timeout; rank 1 held in forward at step 8 is named."""
    from test_distributed import _train_args

    out, log = tmp_path / "run", tmp_path / "log"
    proc = launches.start("--nproc_per_node", "2", "--hang-timeout", "20", "--log_dir", str(log),
                          *_train_args(small_demo, out, "snapshot_epoch=1", "--batch", "8", "--epochs", "3", "--eval"),
                          env=launch_env(PPMULTI_STALL="1:forward:8:600"))
    assert launches.wait(proc, 600) != 0
    text = launches.output(proc)
    assert "hang: rank 1 on node 0 made no progress for" in text and "in forward at step 8" in text, text[-3000:]
    assert "hang: rank 0" not in text and "rank 0 waits" in text, text[-3000:]
    assert "epoch 1 done" in (out / "train.log").read_text()     # evaluated and saved epoch 1 without a false alarm
    assert "trainer.py" in (log / "stacks.rank1.txt").read_text()
