"""The network check on real links: nodes in network namespaces joined by veth pairs, one behind a tc rate limit.

Node 0 runs in this namespace, nodes 1 and 2 each in a namespace of their own, reached over their own veth pair;
the pair to node 2 sends at most 20 Mbit/s (a tc token bucket on node 0's end). ``ppmulti launch --check-network``
on the three must name node 2 as the slowest, with about that rate. The test creates the namespaces and links and
removes them (deleting a namespace removes its veth pair); it needs root and iproute2's ``ip`` and ``tc``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from launching import REPO, free_ports
from ppmulti.procs.launch.netcheck import Route, ifname_env, route_interface

RATE_MBIT = 20


def _ip(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def namespaces():
    """Two namespaces, each with a veth pair to this one; the second pair rate-limited. Removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs root with iproute2's ip and tc")
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    net = next(n for n in random.sample(range(100, 250), 150) if f"10.{n}." not in used)
    tag = f"p{os.getpid() % 100000}"
    nodes = []
    try:
        for i in (1, 2):
            ns, here, there = f"{tag}n{i}", f"{tag}h{i}", f"{tag}t{i}"
            nodes.append((ns, here, there, f"10.{net}.{i}.1", f"10.{net}.{i}.2"))
            _ip("ip", "netns", "add", ns)
            _ip("ip", "link", "add", here, "type", "veth", "peer", "name", there)
            _ip("ip", "link", "set", there, "netns", ns)
            _ip("ip", "addr", "add", f"10.{net}.{i}.1/24", "dev", here)
            _ip("ip", "link", "set", here, "up")
            _ip("ip", "-n", ns, "addr", "add", f"10.{net}.{i}.2/24", "dev", there)
            _ip("ip", "-n", ns, "link", "set", there, "up")
            _ip("ip", "-n", ns, "link", "set", "lo", "up")
        # node 0 -> node 2 at most RATE_MBIT
        _ip("tc", "qdisc", "add", "dev", nodes[1][1], "root", "tbf", "rate", f"{RATE_MBIT}mbit", "burst", "32kbit",
            "latency", "400ms")
        yield nodes
    finally:
        for ns, here, *_ in nodes:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", here], capture_output=True)   # gone with the namespace already
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert tag not in left, left


def test_socket_interface_variables_follow_the_route_unless_set():
    route = Route("eth1", "10.0.0.2")
    assert ifname_env(route, {}) == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1"}
    assert ifname_env(route, {"NCCL_SOCKET_IFNAME": "ib0"}) == {"GLOO_SOCKET_IFNAME": "eth1"}
    assert ifname_env(Route(None, "10.0.0.2"), {}) == {} and ifname_env(None, {}) == {}
    assert route_interface("127.0.0.1") == Route("lo", "127.0.0.1")


@pytest.mark.slow
@pytest.mark.multiproc
def test_check_network_names_the_rate_limited_node(namespaces, tmp_path):
    port = free_ports(2)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "PET_", "MASTER_", "RANK",
                                                                         "WORLD_SIZE", "SLURM_"))},
           "PYTHONPATH": str(REPO), "PPMULTI_RDZV_TOKEN": "netns-test-token"}

    def launch(rank: int, master: str, ns: str | None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "ppmulti.cli", "launch", "--nnodes", "3", "--node_rank", str(rank),
                "--master_addr", master, "--master_port", str(port), "--rdzv-timeout", "60", "--check-network",
                "--network-check-mb", "4", "t.py"]
        if ns:
            argv = ["ip", "netns", "exec", ns, *argv]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=tmp_path)

    (_, _, there1, master1, _), (_, _, there2, master2, addr2) = namespaces
    procs = [launch(0, master1, None), launch(1, master1, namespaces[0][0]), launch(2, master2, namespaces[1][0])]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    node0 = outputs[0]
    # a node is named by its host name and the address node 0 sees ("vm (10.x.1.2)"), and the interface it uses
    for rank, addr, there in ((1, namespaces[0][4], there1), (2, addr2, there2)):
        assert re.search(rf"network: node {rank} at (\S+ \()?{re.escape(addr)}\)? over {there}: ", node0), node0
    slowest = re.search(r"network: slowest node (\d) at (.+?): ([\d.]+) MB/s, ([\d.]+)x slower than node 1", node0)
    assert slowest and slowest.group(1) == "2" and addr2 in slowest.group(2), node0
    # about the limit (20 Mbit/s = 2.5 MB/s), and far below the free link
    assert 1.0 < float(slowest.group(3)) < RATE_MBIT / 8 * 1.3 and float(slowest.group(4)) > 3, node0
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
