"""The network check on real links: nodes in network namespaces joined by veth pairs, one behind a tc rate limit.

Node 0 runs in this namespace on a bridge, nodes 1 and 2 each in a namespace of their own whose veth pair is
attached to the bridge (so every node reaches every other, as gloo's full mesh needs); node 0's end of node 2's
pair sends at most 20 Mbit/s (a tc token bucket), which limits everything into node 2. ``ppmulti launch
--check-network`` on the three must name node 2 as the slowest, by its TCP link and by its all-reduce with node 0,
with about that rate. The test creates the bridge, namespaces and links and removes them; it needs root and
iproute2's ``ip`` and ``tc``. Pure functions (the report, the bus-bandwidth formula) are tested without them.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from conftest import missing_programs, require_system
from launching import REPO, free_ports
from ppmulti.common.paths import BENCH_PROBE
from ppmulti.procs.launch.netcheck import (ALLREDUCE_STEPS, Allreduce, Link, RankTiming, Route, allreduce_plan,
                                          allreduce_report, bus_bandwidth, ifname_env, read_timings, route_interface)
from ppmulti.procs.launch.plan import LaunchPlan

RATE_MBIT = 20


def _ip(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def namespaces():
    """Two namespaces, each with a veth pair to a bridge in this one (node 0's address is on the bridge, so every
    node reaches every other, as gloo's full mesh needs); traffic into the second namespace rate-limited. Returns
    (namespace, node 0's interface, the namespace's interface, node 0's address, the namespace's address) per
    namespace. Removed afterwards."""
    absent = missing_programs("ip", "tc")
    require_system(f"{', '.join(absent)} not installed" if absent else None, "apt-get install iproute2")
    require_system(None if os.geteuid() == 0 else "network namespaces need root", "run the suite as root")
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    net = next(n for n in random.sample(range(100, 250), 150) if f"10.{n}." not in used)
    tag = f"p{os.getpid() % 100000}"
    bridge, master = f"{tag}br", f"10.{net}.0.1"
    nodes, made = [], []
    try:
        _ip("ip", "link", "add", bridge, "type", "bridge")
        made.append(bridge)
        _ip("ip", "addr", "add", f"{master}/24", "dev", bridge)
        _ip("ip", "link", "set", bridge, "up")
        for i in (1, 2):
            ns, here, there, addr = f"{tag}n{i}", f"{tag}h{i}", f"{tag}t{i}", f"10.{net}.0.{i + 1}"
            _ip("ip", "netns", "add", ns)
            nodes.append((ns, bridge, there, master, addr))
            _ip("ip", "link", "add", here, "type", "veth", "peer", "name", there)
            made.append(here)
            _ip("ip", "link", "set", there, "netns", ns)
            _ip("ip", "link", "set", here, "master", bridge)
            _ip("ip", "link", "set", here, "up")
            _ip("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", there)
            _ip("ip", "-n", ns, "link", "set", there, "up")
            _ip("ip", "-n", ns, "link", "set", "lo", "up")
        # everything into node 2 at most RATE_MBIT: node 0's end of its pair
        _ip("tc", "qdisc", "add", "dev", f"{tag}h2", "root", "tbf", "rate", f"{RATE_MBIT}mbit", "burst", "32kbit",
            "latency", "400ms")
        yield nodes
    finally:
        for ns, *_ in nodes:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in reversed(made):
            subprocess.run(["ip", "link", "del", link], capture_output=True)   # a pair goes with its namespace
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert tag not in left, left
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert tag not in links, links


def test_socket_interface_variables_follow_the_route_unless_set():
    route = Route("eth1", "10.0.0.2")
    assert ifname_env(route, {}) == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1"}
    assert ifname_env(route, {"NCCL_SOCKET_IFNAME": "ib0"}) == {"GLOO_SOCKET_IFNAME": "eth1"}
    assert ifname_env(Route(None, "10.0.0.2"), {}) == {} and ifname_env(None, {}) == {}
    assert route_interface("127.0.0.1") == Route("lo", "127.0.0.1")


def test_allreduce_report_states_bus_bandwidth_and_names_the_slowest_node():
    # 3 ranks, 30 MB: a ring all-reduce moves 2(3-1)/3 x 30 MB = 40 MB per rank; 0.4s -> 100 MB/s
    assert bus_bandwidth(30_000_000, 3, 0.4) == pytest.approx(100e6)
    assert bus_bandwidth(8_000_000, 2, 1.0) == pytest.approx(8e6)   # n = 2: the buffer once each way
    ranks = (RankTiming(0, 0, 0.10), RankTiming(1, 0, 0.12), RankTiming(2, 1, 0.40), RankTiming(3, 1, 0.38),
             RankTiming(4, 2, 0.39), RankTiming(5, 2, 0.40))
    links = [Link(1, "b (10.0.0.2)", "eth1", 4_000_000, 0.004), Link(2, "c (10.0.0.3)", "eth1", 4_000_000, 2.0)]
    lines = allreduce_report(Allreduce(30_000_000, ranks, {1: 0.03, 2: 1.5}), "gloo", links)
    # 6 ranks: 2(6-1)/6 x 30 MB = 50 MB; the slowest rank's 0.40s bounds all -> 125 MB/s
    assert lines == [
        "network: all-reduce 125.0 MB/s across 6 ranks on 3 nodes (bus bandwidth 2(n-1)/n x 30 MB / 0.400s, "
        f"the slowest rank's median of {ALLREDUCE_STEPS}; gloo)",
        "network: all-reduce of each node with node 0 alone (2 ranks, bus bandwidth = bytes / time): "
        "node 1 1.00 GB/s, node 2 20.0 MB/s",
        "network: TCP from node 0: node 1 1.00 GB/s, node 2 2.0 MB/s",
        "network: slowest: node 2 at c (10.0.0.3) (20.0 MB/s all-reduce with node 0, 2.0 MB/s TCP)"]
    # no pairs: the TCP link names the node; neither: the node whose ranks waited longest
    only_tcp = allreduce_report(Allreduce(30_000_000, ranks, {}), "NCCL", links)
    assert only_tcp[0].endswith("; NCCL)") and only_tcp[-1] == "network: slowest: node 2 at c (10.0.0.3) (2.0 MB/s TCP)"
    alone = allreduce_report(Allreduce(3_000_000_000, (RankTiming(0, 0, 1.0), RankTiming(1, 1, 2.0)), {}), "NCCL")
    assert alone[0].startswith("network: all-reduce 1.50 GB/s across 2 ranks on 2 nodes")
    assert alone[-1] == "network: slowest: node 1 (its ranks' all-reduce 1.50 GB/s)"
    assert allreduce_report(Allreduce(1, (), {}), "gloo") == []


def test_allreduce_plan_runs_the_probe_with_the_gradient_size(tmp_path):
    plan = LaunchPlan(script="tools/train.py", script_args=("-c", "x.yml"), nnodes=2, node_rank=1,
                      master_addr="10.0.0.1", check_network=True, network_check_mb=28.8)
    probe = allreduce_plan(plan, str(tmp_path))
    assert probe.script == str(BENCH_PROBE) and probe.nnodes == 2 and probe.node_rank == 1
    assert probe.script_args == ("allreduce", "--out", str(tmp_path), "--numel", "7200000",
                                 "--steps", str(ALLREDUCE_STEPS), "--pairs")
    (tmp_path / "rank1.json").write_text(json.dumps({"bytes": 28_800_000, "ranks": [
        {"rank": 0, "node": 0, "median_s": 0.5, "min_s": 0.4}, {"rank": 1, "node": 1, "median_s": 0.6, "min_s": 0.5}],
        "pairs": [{"node": 1, "median_s": 0.7}]}))
    assert read_timings(str(tmp_path)) == Allreduce(28_800_000, (RankTiming(0, 0, 0.5), RankTiming(1, 1, 0.6)),
                                                    {1: 0.7})
    assert read_timings(str(tmp_path / "none")) is None


@pytest.mark.slow
@pytest.mark.multiproc
def test_check_network_times_links_and_all_reduces_naming_the_rate_limited_node(namespaces, tmp_path):
    """Three nodes, one rank each: node 0 times each node's TCP link, then the three ranks all-reduce 4 MB through
    gloo over the bridge, all together and node 0 with each node alone; node 0 names node 2 (behind the limit) as
    the slowest with its figures."""
    port = free_ports(2)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "PET_", "MASTER_", "RANK",
                                                                         "WORLD_SIZE", "SLURM_", "GLOO_", "NCCL_"))},
           "PYTHONPATH": str(REPO), "PPMULTI_RDZV_TOKEN": "netns-test-token"}
    (ns1, bridge, there1, master, addr1), (ns2, _, there2, _, addr2) = namespaces

    def launch(rank: int, ns: str | None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "ppmulti.cli", "launch", "--nnodes", "3", "--node_rank", str(rank),
                "--master_addr", master, "--master_port", str(port), "--rdzv-timeout", "90", "--check-network",
                "--network-check-mb", "4", "--log_dir", str(tmp_path / f"log{rank}"), "t.py"]
        if ns:
            argv = ["ip", "netns", "exec", ns, *argv]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=tmp_path)

    start = time.monotonic()
    procs = [launch(0, None), launch(1, ns1), launch(2, ns2)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=300)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"--check-network on 3 nodes: {time.monotonic() - start:.1f}s")
    print("".join(line + "\n" for line in outputs[0].splitlines() if "network" in line))
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    node0 = outputs[0]
    # a node is named by its host name and the address node 0 sees ("vm (10.x.0.2)"), and the interface it uses
    for rank, addr, there in ((1, addr1, there1), (2, addr2, there2)):
        assert re.search(rf"network: node {rank} at (\S+ \()?{re.escape(addr)}\)? over {there}: ", node0), node0
    slowest = re.search(r"network: slowest node (\d) at (.+?): ([\d.]+) MB/s, ([\d.]+)x slower than node 1", node0)
    assert slowest and slowest.group(1) == "2" and addr2 in slowest.group(2), node0
    # about the limit (20 Mbit/s = 2.5 MB/s), and far below the free link
    assert 1.0 < float(slowest.group(3)) < RATE_MBIT / 8 * 1.3 and float(slowest.group(4)) > 3, node0
    # the all-reduce ran on the three ranks through gloo, and the limit bounds it: each rank moves 2(3-1)/3 x 4 MB,
    # node 2 receives its share at 2.5 MB/s at most
    total = re.search(r"network: all-reduce ([\d.]+) (MB|GB)/s across 3 ranks on 3 nodes \(bus bandwidth "
                      r"2\(n-1\)/n x 4 MB / ([\d.]+)s, .*; gloo\)", node0)
    assert total and total.group(2) == "MB", node0
    rate, seconds = float(total.group(1)), float(total.group(3))
    assert abs(rate - 2 * 2 / 3 * 4 / seconds) < 0.05 * rate and rate < RATE_MBIT / 8 * 1.3, node0
    # node 0 with each node alone through gloo: node 2's pair is bounded by the limit, node 1's is far above it
    pairs = re.search(r"network: all-reduce of each node with node 0 alone \(2 ranks, bus bandwidth = bytes / time\): "
                      r"node 1 ([\d.]+) (MB|GB)/s, node 2 ([\d.]+) MB/s", node0)
    assert pairs, node0
    pair1 = float(pairs.group(1)) * (1000 if pairs.group(2) == "GB" else 1)
    assert float(pairs.group(3)) < RATE_MBIT / 8 * 1.3 and pair1 > 3 * float(pairs.group(3)), node0
    assert re.search(r"network: TCP from node 0: node 1 [\d.]+ [MG]B/s, node 2 [\d.]+ MB/s", node0), node0
    named = re.search(rf"network: slowest: node 2 at (\S+ \()?{re.escape(addr2)}\)? \(([\d.]+) MB/s all-reduce "
                      r"with node 0, ([\d.]+) MB/s TCP\)", node0)
    assert named and float(named.group(2)) == float(pairs.group(3)), node0
    for other in outputs[1:]:
        assert "network check done (node 0 reports the figures)" in other, other
    assert "netns-test-token" not in "".join(outputs)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_machines_in_namespaces_all_reduce_over_the_routes_interface(namespaces, tmp_path):
    """Node 0 here, node 1 in a namespace behind a veth pair: each node's address for Paddle is the one its route to
    node 0 uses (Paddle's own pick, the host name's address, is not reachable from the namespace and its HTTP master
    never starts), gloo gets the veth as GLOO_SOCKET_IFNAME, and the two ranks all-reduce."""
    import json

    from launching import ALLREDUCE

    port, out = free_ports(2), tmp_path / "out"
    ns, here, there, master, addr1 = namespaces[0]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "PET_", "MASTER_", "RANK",
                                                                         "WORLD_SIZE", "SLURM_", "GLOO_", "NCCL_"))},
           "PYTHONPATH": str(REPO)}
    procs = []
    for rank in (0, 1):
        argv = [sys.executable, "-m", "ppmulti.cli", "launch", "--nnodes", "2", "--node_rank", str(rank),
                "--master_addr", master, "--master_port", str(port), "--rdzv-timeout", "90",
                "--log_dir", str(tmp_path / f"log{rank}"), ALLREDUCE, str(out)]
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *argv] if rank else argv, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert f"node 0: gloo and NCCL use {here} ({master}), which holds the master address" in outputs[0], outputs[0]
    assert f"node 1: --host {addr1} for Paddle's launcher" in outputs[1], outputs[1]
    assert f"node 1: gloo and NCCL use {there} ({addr1}), which carries the route to node 0" in outputs[1]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world_size"], r["sum"]) for r in records] == [(0, 2, 1.0), (1, 2, 1.0)]
    assert records[1]["env"]["PADDLE_CURRENT_ENDPOINT"].startswith(addr1 + ":")
