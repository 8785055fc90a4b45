"""The scaling model (ppmulti.procs.bench.scaling) against values worked out by hand, and ``ppmulti bench
--predict``."""

import math
import subprocess
import sys

import pytest

from ppmulti.common.errors import UserError
from ppmulti.procs.bench import scaling as sc


@pytest.mark.parametrize("text,expected", [
    ("100Gbit", 100e9 / 8),
    ("100Gbit/s", 100e9 / 8),
    ("100Gbits/s", 100e9 / 8),
    ("100Gb/s", 100e9 / 8),
    ("10Gbps", 10e9 / 8),
    ("1 Gbit", 1e9 / 8),
    ("25GB/s", 25e9),
    ("25GB", 25e9),
    ("25 GB/s", 25e9),
    ("1GiB/s", 2.0 ** 30),
    ("800MB/s", 800e6),
    ("1.5e9", 1.5e9),
    ("400Mbit", 50e6),
    ("pcie3", 12e9),
    ("NVLink-A100", 230e9),
    (3e9, 3e9),
])
def test_parse_bandwidth(text, expected):
    assert sc.parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["fast", "", "GB/s", "-3GB/s", "0Gbit", "10 parsecs", "1e999GB/s"])
def test_parse_bandwidth_rejects(text):
    with pytest.raises(UserError, match="bandwidth"):
        sc.parse_bandwidth(text)


@pytest.mark.parametrize("text,expected", [
    ("20:39", 1239.0), ("1:00:00", 3600.0), ("170ms", 0.17), ("0.17s", 0.17), ("5us", 5e-6),
    ("5µs", 5e-6), ("2min", 120.0), ("39h", 140400.0), ("0.5", 0.5), ("100ns", 1e-7),
])
def test_parse_duration(text, expected):
    assert sc.parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["soon", "5 parsecs", "-1s", "1:2:3:4"])
def test_parse_duration_rejects(text):
    with pytest.raises(UserError):
        sc.parse_duration(text, "--latency")


@pytest.mark.parametrize("text,expected", [("46.5M", 46.5e6), ("7.93m", 7.93e6), ("850k", 850e3),
                                           ("1.2G", 1.2e9), ("2018029", 2018029.0), ("2e6", 2e6)])
def test_parse_count(text, expected):
    assert sc.parse_count(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["many", "0", "-5M", "5X"])
def test_parse_count_rejects(text):
    with pytest.raises(UserError):
        sc.parse_count(text)


def test_ring_allreduce_by_hand():
    # 1 GB over 4 devices at 1 GB/s: each sends 2*3/4 = 1.5 GB -> 1.5 s
    assert sc.ring_allreduce_seconds(1e9, 4, 1e9) == pytest.approx(1.5)
    # + latency: 2*(4-1) hops * 1 ms * 2 buckets = 12 ms
    assert sc.ring_allreduce_seconds(1e9, 4, 1e9, latency=1e-3, buckets=2) == pytest.approx(1.512)
    # 100 MB over 2 devices at 10 GB/s: 2*1/2 * 0.01 s
    assert sc.ring_allreduce_seconds(100e6, 2, 10e9) == pytest.approx(0.01)
    # one device: nothing to reduce, whatever the latency
    assert sc.ring_allreduce_seconds(1e9, 1, 1e9, latency=1.0) == 0.0
    # the volume term tends to 2K/B as N grows
    assert sc.ring_allreduce_seconds(1e9, 1000, 1e9) == pytest.approx(2 * 999 / 1000)
    with pytest.raises(ValueError):
        sc.ring_allreduce_seconds(1e9, 0, 1e9)


def test_hierarchical_allreduce_by_hand():
    # 1 GB, 8 GPUs/node at 100 GB/s, 4 nodes at 10 GB/s:
    # inside 2*7/8 * 1e9/100e9 = 0.0175 s; across 2*3/4 * 1e9/10e9 = 0.15 s
    assert sc.hierarchical_allreduce_seconds(1e9, 8, 4, 100e9, 10e9) == pytest.approx(0.1675)
    # one node: only the intra-node ring
    assert sc.hierarchical_allreduce_seconds(1e9, 8, 1, 100e9, 10e9) == pytest.approx(0.0175)
    # one GPU per node: only the network ring
    assert sc.hierarchical_allreduce_seconds(1e9, 1, 4, 100e9, 10e9) == pytest.approx(0.15)
    # latencies: 2*7 hops * 1us inside + 2*3 hops * 10us across
    t = sc.hierarchical_allreduce_seconds(1e9, 8, 4, 100e9, 10e9, intra_latency=1e-6, inter_latency=1e-5)
    assert t == pytest.approx(0.1675 + 14e-6 + 60e-6)


def test_exposed_comm_by_hand():
    # half of 100 ms hides behind a 200 ms backward (2/3 of 300 ms): 50 ms left
    assert sc.exposed_comm_seconds(0.3, 0.1, overlap=0.5) == pytest.approx(0.05)
    # full overlap is capped by the backward: 500 ms comm, 200 ms backward -> 300 ms left
    assert sc.exposed_comm_seconds(0.3, 0.5, overlap=1.0) == pytest.approx(0.3)
    assert sc.exposed_comm_seconds(0.3, 0.1, overlap=0.0) == pytest.approx(0.1)
    with pytest.raises(UserError, match="overlap"):
        sc.exposed_comm_seconds(0.3, 0.1, overlap=1.5)


def test_predict_step_by_hand():
    # 25M params = 100 MB of gradients, 4 GPUs at 10 GB/s, no latency: comm 2*3/4 * 0.01 = 15 ms
    c = sc.Cluster(intra_bandwidth=10e9, intra_latency=0.0)
    p = sc.predict_step(0.1, 25e6, 4, 1, c)
    assert p.comm_s == pytest.approx(0.015)
    assert p.step_s == pytest.approx(0.115)
    assert p.speedup == pytest.approx(4 * 0.1 / 0.115)
    assert p.devices == 4
    # with half the comm overlapped: step 0.1075
    p = sc.predict_step(0.1, 25e6, 4, 1, sc.Cluster(intra_bandwidth=10e9, intra_latency=0.0, overlap=0.5))
    assert p.step_s == pytest.approx(0.1075)
    # 2 nodes x 4 GPUs, inter 1 GB/s: inside 15 ms + across 2*1/2 * 0.1 s = 115 ms
    c2 = sc.Cluster(intra_bandwidth=10e9, inter_bandwidth=1e9, intra_latency=0.0, inter_latency=0.0)
    p = sc.predict_step(0.1, 25e6, 4, 2, c2)
    assert p.comm_s == pytest.approx(0.115)
    assert p.speedup == pytest.approx(8 * 0.1 / 0.215)
    # one device: no communication, speed-up 1
    assert sc.predict_step(0.1, 25e6, 1, 1, c).speedup == 1.0


def test_predict_table_shape_and_monotonic():
    rows = sc.predict_table(0.2, 46.5e6, [1, 2, 4, 8], [1, 2, 3, 4], sc.Cluster())
    assert [(p.gpus_per_node, p.nodes) for p in rows][:5] == [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2)]
    assert len(rows) == 16
    for p in rows:
        assert 0 < p.speedup <= p.devices + 1e-9   # never super-linear
    eights = [p.speedup for p in rows if p.gpus_per_node == 8]
    assert eights == sorted(eights)                # more nodes, more throughput at these sizes


def test_published_figures_derived_by_hand():
    y = sc.YOLOV5L_A100
    # 20:39 = 1239 s over 118287/16 steps
    assert y.step_s(1) == pytest.approx(1239 / (118287 / 16))
    assert y.step_s(8) == pytest.approx(189 / (118287 / 128))
    assert y.speedups()[2] == pytest.approx(1239 / 703)
    assert y.speedups()[8] == pytest.approx(1239 / 189)
    p = sc.PPYOLOE_S_V100
    assert p.step_s(8) == pytest.approx(39 * 3600 / (300 * 118287 / 256))
    assert p.speedups()[32] == pytest.approx(3.0)


def test_implied_bandwidth_and_amdahl_by_hand():
    # step grows by 25 ms at N=2 for 200 MB: 2*1/2 * 200e6 / 0.025 = 8 GB/s
    assert sc.implied_bandwidth(200e6, 2, 0.100, 0.125) == pytest.approx(8e9)
    assert sc.implied_bandwidth(200e6, 2, 0.100, 0.100) is None
    assert sc.implied_bandwidth(200e6, 1, 0.100, 0.200) is None
    # 3x on 4 units: f = (4/3 - 1) / 3 = 1/9
    assert sc.amdahl_serial_fraction(3.0, 4) == pytest.approx(1 / 9)
    assert sc.amdahl_serial_fraction(4.0, 4) == pytest.approx(0.0)
    assert sc.amdahl_serial_fraction(1.0, 1) == 0.0


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "ppmulti.cli", "bench", *args], capture_output=True, text=True,
                          timeout=60)


def test_predict_command_answers_without_gpu():
    r = _bench("--predict", "--gpus", "8", "--nodes", "4", "--bandwidth", "100Gbit")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "| nodes | 1 GPU/node | 2 GPU/node | 4 GPU/node | 8 GPU/node |" in out
    for m in (1, 2, 3, 4):
        assert f"\n| {m} | " in out
    # by hand: t = 1239/(118287/16); K = 186 MB; 8 GPUs on 130 GB/s: 2*7/8*K/B + 2*7 hops * 5us * 6 buckets
    t = 1239 / (118287 / 16)
    comm = 2 * 7 / 8 * 186e6 / 130e9 + 14 * 5e-6 * math.ceil(186e6 / 2 ** 25)
    assert f"{8 * t / (t + comm):.2f}x" in out
    assert "20:39" in out and "3:09" in out and "6.56x" in out and "3.0x" in out
    assert "paddle" not in r.stderr.lower()


def test_predict_command_overrides_and_bad_input():
    r = _bench("--predict", "--gpus", "2", "--nodes", "1", "--step-time", "100ms", "--params", "25M",
               "--intra", "10GB/s", "--overlap", "0")
    assert r.returncode == 0, r.stderr
    # 100 MB, 2 GPUs at 10 GB/s: 10 ms + 2 hops * 5us = 10.01 ms; speed-up 2*0.1/0.11001
    assert f"{2 * 0.1 / (0.1 + 0.01 + 2 * 5e-6):.2f}x" in r.stdout
    assert "--step-time/--params given" in r.stdout
    for bad, word in ((["--bandwidth", "fast"], "bandwidth"), (["--overlap", "2"], "--overlap"),
                      (["--params", "lots"], "parameter count"), (["--gpus", "0"], "--gpus")):
        r = _bench("--predict", *bad)
        assert r.returncode == 2, (bad, r.stderr)
        assert word in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
