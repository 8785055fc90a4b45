"""The network check of a multi-node launch: the interface each node reaches node 0 over, and each link's speed.

Interface. A node's collectives should leave on the interface its route to node 0 uses (NCCL and gloo otherwise
pick one themselves, and a wrong pick -- a docker bridge, a slow management network -- shows up as a hang or a
slow run). ``route_interface`` asks the kernel: a UDP socket connected to node 0 (nothing is sent) has the
route's source address, and the interface holding that address is the one. The ranks get it as
``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` unless the user set them.

Speed. Inside ppmulti's rendezvous, once every node joined, node 0 sends each node in turn a block of the size of
a gradient all-reduce's traffic (``--network-check-mb``) and times it until the node confirms it has it all; the
node answers with the interface it uses. Node 0 logs one line per node and names the slowest. Every multi-node
launch does a quick one (``QUICK_MB``) before training unless ``--no-network-check``.

All-reduce. ``--check-network`` times the links with the full size, then runs a real collective instead of the
training script: every rank of every node, through Paddle's launcher as training would start (gloo on CPU, NCCL on
GPUs), all-reduces a float32 buffer of ``--network-check-mb`` (default 32 MB: YOLOv5s's 7.2 M gradients x 4 bytes),
``ALLREDUCE_STEPS`` times after one warm-up (``ppmulti/rank/bench_probe.py``'s ``allreduce`` mode, which gathers
every rank's median time and node into each rank's record), then node 0's first rank all-reduces the same buffer
with each other node's first rank alone, in groups of two. An all-reduce ends on every rank together, so the one
across all ranks is bounded by the slowest link and says nothing of which; the pairs isolate each node's link to
node 0 through the same library, as the TCP figure does outside it. Node 0 reports bus bandwidth, the ring
all-reduce's per-rank traffic over the time, ``2(n-1)/n x bytes / seconds`` (the figure nccl-tests calls busbw;
for a pair, bytes / seconds), and names the slowest node by its pair figure with its TCP figure beside. Then it
stops.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ppmulti.common import envvars as E
from ppmulti.common.paths import BENCH_PROBE
from ppmulti.procs.launch.plan import LaunchPlan

QUICK_MB = 4.0             # the check before every multi-node launch: well under a second on any real link
FULL_MB = 32.0             # --check-network: about YOLOv5s's gradients in float32 (7.2 M parameters)
ALLREDUCE_STEPS = 5        # timed all-reduces of --check-network (the median is reported), after one warm-up
_CHUNK = 1 << 20
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Route:
    """How this machine reaches an address: the interface and this machine's address on it."""

    interface: str | None
    source: str


def interface_addresses() -> dict[str, str]:
    """IPv4 address -> interface name, for every interface of this machine that has one."""
    found: dict[str, str] = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            found.setdefault(socket.inet_ntoa(packed[20:24]), name)
    return found


def route_interface(addr: str, port: int = 9) -> Route | None:
    """The interface and source address this machine's route to ``addr`` uses; None when there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))   # UDP: picks the route, sends nothing
            source = s.getsockname()[0]
    except OSError:
        return None
    return Route(interface_addresses().get(source), source)


def ifname_env(route: Route | None, environ: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for the ranks: the route's interface, each unless the user set it."""
    if route is None or not route.interface:
        return {}
    return {name: route.interface for name in (E.GLOO_SOCKET_IFNAME, E.NCCL_SOCKET_IFNAME) if name not in environ}


# --- the speed probe, over a rendezvous connection ---------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """One node's link to node 0 as the probe saw it."""

    node_rank: int
    peer: str
    interface: str | None
    nbytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / max(self.seconds, 1e-9)

    def line(self) -> str:
        over = f" over {self.interface}" if self.interface else ""
        return (f"network: node {self.node_rank} at {self.peer}{over}: {_rate(self.mb_per_s)} "
                f"({self.nbytes / 1e6:g} MB from node 0 in {self.seconds:.2f}s)")


def _rate(mb_per_s: float) -> str:
    return f"{mb_per_s / 1000:.2f} GB/s" if mb_per_s >= 1000 else f"{mb_per_s:.1f} MB/s"


def send_block(conn: socket.socket, nbytes: int) -> None:
    """Node 0: the probe's bytes, after its header line."""
    block = bytes(_CHUNK)
    left = nbytes
    while left > 0:
        conn.sendall(block[:min(left, _CHUNK)])
        left -= _CHUNK


def receive_block(conn: socket.socket, nbytes: int) -> None:
    """A node: read exactly ``nbytes``; OSError when the connection ends first."""
    left = nbytes
    while left > 0:
        chunk = conn.recv(min(left, _CHUNK))
        if not chunk:
            raise ConnectionError("node 0 closed the connection during the network check")
        left -= len(chunk)


def slowest(links: list[Link]) -> str | None:
    """The line naming the slowest node, with how it compares to the fastest; None for no links."""
    if not links:
        return None
    low = min(links, key=lambda link: link.mb_per_s)
    high = max(links, key=lambda link: link.mb_per_s)
    text = f"network: slowest node {low.node_rank} at {low.peer}: {_rate(low.mb_per_s)}"
    if high is not low:
        text += (f", {high.mb_per_s / max(low.mb_per_s, 1e-9):.1f}x slower than node {high.node_rank} "
                 f"({_rate(high.mb_per_s)})")
    return text


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# --- the all-reduce of --check-network, run as the ranks' script -------------------------------------------
def allreduce_plan(plan: LaunchPlan, directory: str) -> LaunchPlan:
    """The plan whose ranks all-reduce ``plan.network_check_mb`` MB of float32 instead of training, all together
    and then node 0 with each node in pairs; each rank writes ``directory/rankN.json``."""
    numel = max(1, int(plan.network_check_mb * 1e6 / 4))
    return replace(plan, script=str(BENCH_PROBE),
                   script_args=("allreduce", "--out", directory, "--numel", str(numel),
                                "--steps", str(ALLREDUCE_STEPS), "--pairs"))


@dataclass(frozen=True)
class RankTiming:
    """One rank's median time of one all-reduce, and the node it ran on."""

    rank: int
    node: int
    seconds: float


@dataclass(frozen=True)
class Allreduce:
    """What the ranks measured: bytes per all-reduce, each rank's median over all ranks, and each node's median
    with node 0 alone (node -> seconds)."""

    nbytes: int
    ranks: tuple[RankTiming, ...]
    pairs: Mapping[int, float]


def read_timings(directory: str) -> Allreduce | None:
    """The all-reduce's timings from a rank record in ``directory``; None when no rank left one."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("rank") and n.endswith(".json"))
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(directory, name)) as fh:
                record = json.load(fh)
            return Allreduce(int(record["bytes"]),
                             tuple(RankTiming(int(r["rank"]), int(r["node"]), float(r["median_s"]))
                                   for r in record["ranks"]),
                             {int(p["node"]): float(p["median_s"]) for p in record.get("pairs", [])})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def bus_bandwidth(nbytes: int, ranks: int, seconds: float) -> float:
    """Bytes/s of a ring all-reduce's bus bandwidth: each rank sends (and receives) 2(n-1)/n x the buffer."""
    return 2 * (ranks - 1) / ranks * nbytes / max(seconds, 1e-9)


def _gbs(bytes_per_s: float) -> str:
    return _rate(bytes_per_s / 1e6)


def allreduce_report(result: Allreduce, backend: str, links: Sequence[Link] = ()) -> list[str]:
    """Node 0's lines after the all-reduce: its bus bandwidth across all ranks, each node's with node 0 alone, each
    node's TCP link (``links``), and the slowest node named with its figures."""
    timings, nbytes = result.ranks, result.nbytes
    if not timings:
        return []
    n = len(timings)
    worst = max(t.seconds for t in timings)
    nodes = sorted({t.node for t in timings})
    lines = [f"network: all-reduce {_gbs(bus_bandwidth(nbytes, n, worst))} across {n} ranks on {len(nodes)} nodes "
             f"(bus bandwidth 2(n-1)/n x {nbytes / 1e6:g} MB / {worst:.3f}s, the slowest rank's median of "
             f"{ALLREDUCE_STEPS}; {backend})"]
    pairs = {node: bus_bandwidth(nbytes, 2, s) for node, s in sorted(result.pairs.items())}
    if pairs:
        lines.append("network: all-reduce of each node with node 0 alone (2 ranks, bus bandwidth = bytes / time): "
                     + ", ".join(f"node {node} {_gbs(rate)}" for node, rate in pairs.items()))
    tcp = {link.node_rank: link for link in links}
    if tcp:
        lines.append("network: TCP from node 0: "
                     + ", ".join(f"node {link.node_rank} {_rate(link.mb_per_s)}" for link in links))
    # the slowest: by the pair all-reduce, else the TCP link (each isolates a node), else the longest-waiting ranks
    if pairs:
        node = min(pairs, key=pairs.__getitem__)
    elif tcp:
        node = min(tcp, key=lambda k: tcp[k].mb_per_s)
    else:
        by_node = {k: max(t.seconds for t in timings if t.node == k) for k in nodes}
        node = max(by_node, key=by_node.__getitem__)
    figures = []
    if node in pairs:
        figures.append(f"{_gbs(pairs[node])} all-reduce with node 0")
    if node in tcp:
        figures.append(f"{_rate(tcp[node].mb_per_s)} TCP")
    if not figures:
        figures.append(f"its ranks' all-reduce {_gbs(bus_bandwidth(nbytes, n, by_node[node]))}")
    where = f" at {tcp[node].peer}" if node in tcp else ""
    lines.append(f"network: slowest: node {node}{where} ({', '.join(figures)})")
    return lines
