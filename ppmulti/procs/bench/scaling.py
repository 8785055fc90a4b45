"""The data-parallel scaling model: ring all-reduce cost, predicted step time and speed-up (pure functions).

A data-parallel step is compute (forward + backward + update, per device, fixed per-device batch) plus the
all-reduce of the gradients, K = parameters x 4 bytes. A ring all-reduce over N devices sends and receives
2(N-1)/N x K bytes per device, so on links of bandwidth B and per-hop latency L it takes

    t_comm = 2(N-1)/N * K/B + 2(N-1) * L        (per fused bucket for the latency term)

On several nodes the all-reduce is hierarchical (what NCCL's tree/ring and Paddle's hierarchical
all-reduce do): reduce-scatter inside each node over NVLink/PCIe, an inter-node ring among the nodes on
K/g-sized shards — the g shards of a node share its network link, so the node link carries 2(M-1)/M x K —
then an all-gather inside the node. Part of t_comm can hide behind the backward pass (``overlap``: the
fraction of communication that overlaps, at most the backward's share of compute).

Speed-up is throughput against one device with the same per-device batch (weak scaling, how YOLOv5's and
PaddleDetection's published tables were taken): N x t_1 / t_N.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ppmulti.common.errors import UserError

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}
_BW = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKmMgGtT]i?)?\s*(bits|bit|bytes|byte|bps|b|B)?"
                 r"\s*(?:/\s*s|ps)?\s*$")
# Named links: typical all-reduce bus bandwidths (nccl-tests "busbw" figures people quote), not measured here.
LINKS: dict[str, float] = {
    "nvlink-a100": 230e9,   # DGX A100, NVSwitch
    "nvlink-v100": 130e9,   # DGX-1 V100, NVLink hybrid cube mesh
    "pcie3": 12e9,          # PCIe 3.0 x16, about 12 GB/s usable
    "pcie4": 24e9,          # PCIe 4.0 x16
}


def parse_bandwidth(text: str | float) -> float:
    """A link bandwidth in bytes/s: ``100Gbit``, ``100Gb/s``, ``100Gbps`` (bits), ``25GB/s``, ``25GB``,
    ``12GiB/s`` (bytes), a bare number (bytes/s) or a named link (``nvlink-a100``, ``pcie3``, ...)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        name = text.strip().lower()
        if name in LINKS:
            return LINKS[name]
        m = _BW.match(text)
        if not m:
            raise UserError(f"bandwidth {text!r}: expected a number with a unit such as 100Gbit, 25GB/s or "
                            f"10Gbps (b/bit = bits, B = bytes), or one of {', '.join(LINKS)}")
        number, prefix, unit = m.group(1), m.group(2) or "", m.group(3) or ""
        # "M"/"m" both mean mega here: nobody has a millibit link
        value = float(number) * _PREFIX[prefix.lower()]
        bits = unit in ("b", "bit", "bits", "bps")
        if bits:
            value /= 8.0
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"bandwidth {text!r}: must be a positive number")
    return value


_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ns|us|µs|ms|s|min|h)?\s*$")
_DUR_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str | float, what: str = "duration") -> float:
    """Seconds from ``5us``, ``0.17s``, ``170ms``, ``2min``, a bare number (seconds), or ``M:SS`` / ``H:MM:SS``."""
    if isinstance(text, (int, float)):
        value = float(text)
    elif re.match(r"^\s*\d+(:\d{1,2}){1,2}(\.\d+)?\s*$", text):
        value = 0.0
        for part in text.strip().split(":"):
            value = value * 60 + float(part)
    else:
        m = _DUR.match(text)
        if not m:
            raise UserError(f"{what} {text!r}: expected a number with a unit such as 5us, 170ms, 0.17s or 20:39")
        value = float(m.group(1)) * _DUR_UNIT[m.group(2)]
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{what} {text!r}: must not be negative")
    return value


def parse_count(text: str | float) -> float:
    """A parameter count: ``46.5M``, ``7.93m``, ``2e6``, ``1.2G``, ``850k`` or a bare number."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.match(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKmMgGbB])?\s*$", text)
        if not m:
            raise UserError(f"parameter count {text!r}: expected e.g. 46.5M, 7.93M or 2018029")
        value = float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, None: 1.0}[
            m.group(2).lower() if m.group(2) else None]
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"parameter count {text!r}: must be positive")
    return value


def ring_allreduce_seconds(nbytes: float, n: int, bandwidth: float, latency: float = 0.0,
                           buckets: int = 1) -> float:
    """Time of a ring all-reduce of ``nbytes`` over ``n`` devices: 2(n-1)/n * K/B + 2(n-1) * L per bucket."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n == 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bandwidth + 2.0 * (n - 1) * latency * max(1, buckets)


def hierarchical_allreduce_seconds(nbytes: float, gpus_per_node: int, nodes: int, intra_bandwidth: float,
                                   inter_bandwidth: float, intra_latency: float = 0.0,
                                   inter_latency: float = 0.0, buckets: int = 1) -> float:
    """Reduce-scatter in the node, ring across nodes on the shards, all-gather in the node.

    Inside the node: (g-1)/g * K twice over the intra link = a ring all-reduce's volume. Across nodes the
    g shards of K/g run side by side over the node's one link, which carries 2(M-1)/M * K in all.
    """
    inside = ring_allreduce_seconds(nbytes, gpus_per_node, intra_bandwidth, intra_latency, buckets)
    across = ring_allreduce_seconds(nbytes, nodes, inter_bandwidth, inter_latency, buckets)
    return inside + across


def exposed_comm_seconds(compute_s: float, comm_s: float, overlap: float = 0.0,
                         backward_share: float = 2.0 / 3.0) -> float:
    """Communication left on the step after ``overlap`` of it hides behind the backward pass
    (``backward_share`` of compute; about 2/3 for conv nets, backward being ~2x forward)."""
    if not 0.0 <= overlap <= 1.0:
        raise UserError(f"--overlap {overlap}: expected a fraction between 0 and 1")
    hidden = min(overlap * comm_s, backward_share * compute_s)
    return comm_s - hidden


@dataclass(frozen=True)
class Cluster:
    """Where the model runs: links and how comm overlaps."""

    intra_bandwidth: float = LINKS["nvlink-v100"]   # bytes/s inside a node
    inter_bandwidth: float = 100e9 / 8              # bytes/s of each node's network link (100 Gbit)
    intra_latency: float = 5e-6
    inter_latency: float = 10e-6
    overlap: float = 0.0
    bucket_bytes: float = 32 * 2 ** 20             # fused gradient bucket (fuse_grad_size_in_MB 32)


@dataclass(frozen=True)
class Prediction:
    gpus_per_node: int
    nodes: int
    step_s: float
    comm_s: float
    exposed_s: float
    speedup: float          # throughput against one device, same per-device batch

    @property
    def devices(self) -> int:
        return self.gpus_per_node * self.nodes


def predict_step(compute_s: float, params: float, gpus_per_node: int, nodes: int, cluster: Cluster) -> Prediction:
    """Step time and speed-up of ``gpus_per_node`` x ``nodes`` devices for a model of ``params`` parameters."""
    nbytes = 4.0 * params
    buckets = max(1, math.ceil(nbytes / cluster.bucket_bytes))
    if nodes > 1:
        comm = hierarchical_allreduce_seconds(nbytes, gpus_per_node, nodes, cluster.intra_bandwidth,
                                              cluster.inter_bandwidth, cluster.intra_latency,
                                              cluster.inter_latency, buckets)
    else:
        comm = ring_allreduce_seconds(nbytes, gpus_per_node, cluster.intra_bandwidth, cluster.intra_latency, buckets)
    exposed = exposed_comm_seconds(compute_s, comm, cluster.overlap)
    step = compute_s + exposed
    devices = gpus_per_node * nodes
    return Prediction(gpus_per_node, nodes, step, comm, exposed, devices * compute_s / step)


def predict_table(compute_s: float, params: float, gpus: list[int], nodes: list[int],
                  cluster: Cluster) -> list[Prediction]:
    return [predict_step(compute_s, params, g, m, cluster) for m in nodes for g in gpus]


def implied_bandwidth(nbytes: float, n: int, t1: float, tn: float) -> float | None:
    """The bandwidth at which a ring all-reduce alone (no overlap) explains a step of ``tn`` vs ``t1``;
    None when the step did not grow (nothing for communication to explain)."""
    if n < 2 or tn <= t1:
        return None
    return 2.0 * (n - 1) / n * nbytes / (tn - t1)


def amdahl_serial_fraction(speedup: float, n: float) -> float:
    """The part f of the 1-unit run that did not scale, if S = 1 / (f + (1-f)/n)."""
    if n <= 1:
        return 0.0
    return (n / speedup - 1.0) / (n - 1.0)


# ------------------------------------------------------------------ published figures the model is set beside
@dataclass(frozen=True)
class Published:
    """A published data-parallel timing and what the model's inputs are derived from."""

    name: str
    params: float
    source: str
    unit_devices: int                 # devices of the "1x" run the speed-ups are against
    per_device_batch: int
    images: int                       # per epoch
    epochs: int
    times_s: dict[int, float] = field(default_factory=dict)   # devices -> wall seconds for `epochs` epochs
    note: str = ""

    def step_s(self, devices: int) -> float:
        steps = self.epochs * self.images / (self.per_device_batch * devices)
        return self.times_s[devices] / steps

    def speedups(self) -> dict[int, float]:
        base = self.times_s[self.unit_devices]
        return {d: base / t for d, t in self.times_s.items()}


COCO_TRAIN = 118287

YOLOV5L_A100 = Published(
    name="YOLOv5l, 1-8 A100 (one node)",
    params=46.5e6,   # YOLOv5 README: YOLOv5l 46.5M parameters
    source="YOLOv5 'Multi-GPU Training' tutorial: one COCO epoch, batch 16 per GPU, 20:39 / 11:43 / 5:57 / 3:09",
    unit_devices=1, per_device_batch=16, images=COCO_TRAIN, epochs=1,
    times_s={1: 20 * 60 + 39, 2: 11 * 60 + 43, 4: 5 * 60 + 57, 8: 3 * 60 + 9},
    note="step time = 1239 s / (118287 / 16) steps = 0.168 s on one A100")

PPYOLOE_S_V100 = Published(
    name="PP-YOLOE-s, 1 vs 4 nodes x 8 V100",
    params=7.93e6,   # PaddleDetection PP-YOLOE model zoo: 7.93M
    source="PaddleDetection docs/tutorials/DistributedTraining: COCO 300 epochs, 39 h on 1x8 V100, "
           "13 h on 4x8 (3.0x); batch 32 per GPU (model zoo)",
    unit_devices=8, per_device_batch=32, images=COCO_TRAIN, epochs=300,
    times_s={8: 39 * 3600.0, 32: 13 * 3600.0},
    note="step time = 39 h / (300 x 118287 / 256) steps = 1.01 s on 8 V100 (evaluation included)")

# PP-YOLOE-x on Objects365 (same table): 464 h -> 125 h, 3.4x; 98.42M parameters. Kept as a figure only:
# the Objects365 epoch count behind it is not published, so no step time can be derived.
PPYOLOE_X_SPEEDUP_4NODES = 3.4
PPYOLOE_X_PARAMS = 98.42e6

MODELS: dict[str, tuple[float, float, str]] = {
    # name: (parameters, compute seconds per step on one device, where the numbers come from)
    "yolov5l": (YOLOV5L_A100.params, YOLOV5L_A100.step_s(1),
                "46.5M params (YOLOv5 README); 0.168 s/step = 20:39 for one COCO epoch at batch 16 on 1 A100"),
    "ppyoloe_s": (PPYOLOE_S_V100.params, PPYOLOE_S_V100.step_s(8),
                  "7.93M params (PaddleDetection model zoo); 1.01 s/step = 39 h / (300 COCO epochs at 8x32) on "
                  "8 V100, intra-node all-reduce included (<1 ms by this model)"),
}
