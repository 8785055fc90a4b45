"""Restarts across nodes: kill -9 of a rank on one of two loopback nodes; every rank on both restarts and resumes."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from test_distributed import _rank_pid, _train_args
from launching import Launches, free_ports, launch_env

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def test_sigkill_on_node_1_restarts_both_nodes_from_the_last_checkpoint(small_demo, tmp_path):
    out = tmp_path / "run"
    start = free_ports(2) + 1
    common = ["--ips", "127.0.0.2,127.0.0.3", "--start_port", str(start), "--rdzv-timeout", "120",
              "--max_restarts", "1"]
    train = _train_args(small_demo, out, "snapshot_epoch=1", "--batch", "8", "--epochs", "3")
    launches = Launches(tmp_path)
    try:
        nodes = [launches.start(*common, "--host", f"127.0.0.{2 + i}", "--log_dir", str(tmp_path / f"log{i}"),
                                *train, env=launch_env()) for i in range(2)]
        log = out / "train.log"
        deadline = time.time() + 400
        while time.time() < deadline and all(p.poll() is None for p in nodes):
            if log.is_file() and "epoch 2/3 step" in log.read_text():
                break
            time.sleep(0.2)
        pid = _rank_pid(1, str(out))          # rank 1 runs on node 1 (127.0.0.3)
        assert pid is not None, launches.output(nodes[1])[-3000:]
        os.kill(pid, signal.SIGKILL)
        codes = [launches.wait(p, 600) for p in nodes]
    finally:
        launches.close()
    texts = [launches.output(p) for p in nodes]
    assert codes == [0, 0], "\n----\n".join(t[-3000:] for t in texts)
    for text in texts:
        assert "restarting every rank (1 of 1 restarts)" in text, text[-3000:]
    assert "rank 1 died without a Python error" in texts[1]
    assert "lost its peer" in texts[0] and "the cause is on another node" in texts[0], texts[0][-3000:]
    assert "launch restart 1: resuming" in log.read_text()               # rank 0's log
    assert "launch restart 1: resuming" in (out / "logs" / "rank1.log").read_text()   # and rank 1's: same checkpoint
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and metrics["world_size"] == 2
    epochs = [line.split(",")[0] for line in (out / "results.csv").read_text().splitlines()[1:]]
    assert epochs == ["1", "2", "3"]
