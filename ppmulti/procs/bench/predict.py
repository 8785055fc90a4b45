"""``ppmulti bench --predict``: the scaling model's table for a model and cluster, beside the published figures."""

from __future__ import annotations

from ppmulti.procs.bench import scaling as sc


def predict_report(model: str, step_s: float | None, params: float | None, gpus: int, nodes: int,
                   cluster: sc.Cluster) -> str:
    """Markdown: predicted speed-ups for 1, 2, 4, ... ``gpus`` devices per node and 1..``nodes`` nodes, then
    the model against YOLOv5's and PaddleDetection's published timings."""
    d_params, d_step, origin = sc.MODELS[model]
    params = d_params if params is None else params
    step_s = d_step if step_s is None else step_s
    if step_s != d_step or params != d_params:
        origin = f"--step-time/--params given; {model}'s defaults: {origin}"
    gpu_list = [g for g in (1, 2, 4, 8, 16) if g <= gpus] or [gpus]
    if gpus not in gpu_list:
        gpu_list.append(gpus)
    node_list = list(range(1, nodes + 1))
    rows = sc.predict_table(step_s, params, gpu_list, node_list, cluster)
    lines = [f"## Predicted data-parallel speed-up: {model}",
             "",
             f"{params / 1e6:.2f}M parameters -> gradients K = {4 * params / 1e6:.1f} MB; "
             f"compute {step_s * 1e3:.1f} ms per step on one device ({origin}).",
             f"Links: intra-node {_bw(cluster.intra_bandwidth)}, inter-node {_bw(cluster.inter_bandwidth)} per node; "
             f"latency {cluster.intra_latency * 1e6:g} / {cluster.inter_latency * 1e6:g} us; overlap "
             f"{cluster.overlap:.0%} of communication with backward. Speed-up = throughput against one device "
             "at the same per-device batch.",
             "",
             "| nodes | " + " | ".join(f"{g} GPU/node" for g in gpu_list) + " |",
             "| --- | " + " | ".join("---" for _ in gpu_list) + " |"]
    for m in node_list:
        cells = []
        for p in rows:
            if p.nodes == m:
                cells.append(f"{p.speedup:.2f}x ({p.exposed_s * 1e3:.1f} ms comm)")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", _published_yolov5(cluster), "", _published_ppyoloe(cluster)]
    return "\n".join(lines) + "\n"


def _bw(value: float) -> str:
    return f"{value / 1e9:.1f} GB/s ({value * 8 / 1e9:.0f} Gbit/s)"


def _published_yolov5(cluster: sc.Cluster) -> str:
    pub = sc.YOLOV5L_A100
    t1 = pub.step_s(1)
    nbytes = 4 * pub.params
    nv = sc.Cluster(intra_bandwidth=sc.LINKS["nvlink-a100"], overlap=cluster.overlap)
    pcie = sc.Cluster(intra_bandwidth=sc.LINKS["pcie4"], overlap=cluster.overlap)
    lines = [f"### Beside the published figures: {pub.name}",
             "",
             f"Source: {pub.source}. Inputs: {pub.note}; {pub.params / 1e6:.1f}M parameters "
             f"(K = {nbytes / 1e6:.0f} MB).",
             "",
             "| GPUs | published epoch | published speed-up | step (published) | model, NVLink A100 | model, PCIe 4 | "
             "bandwidth that explains the step alone |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for n, seconds in pub.times_s.items():
        a = sc.predict_step(t1, pub.params, n, 1, nv).speedup
        b = sc.predict_step(t1, pub.params, n, 1, pcie).speedup
        bw = sc.implied_bandwidth(nbytes, n, t1, pub.step_s(n))
        lines.append(f"| {n} | {int(seconds // 60)}:{int(seconds % 60):02d} | {pub.speedups()[n]:.2f}x | "
                     f"{pub.step_s(n) * 1e3:.0f} ms | {a:.2f}x | {b:.2f}x | "
                     f"{'-' if bw is None else f'{bw / 1e9:.1f} GB/s'} |")
    lines += ["",
              "Where they agree: the step grows from 168 ms (1 GPU) to 190-205 ms (2-8 GPUs), and that growth follows "
              "2(N-1)/N: it is what a ring all-reduce of 186 MB costs at an effective 8-11 GB/s with nothing "
              "overlapped, the same figure at N = 2, 4 and 8. Where they differ: on NVLink (230 GB/s) the model "
              "predicts 7.9x at 8 GPUs against the published 6.6x. The 20-35 ms per step is more than NVLink's "
              "all-reduce time; what the model leaves out and the published run pays is DDP's bucketing and "
              "synchronisation, the 2-N dataloaders sharing the host's CPU cores (mosaic augmentation on CPU), "
              "and stragglers, none of which depend on the link."]
    return "\n".join(lines)


def _published_ppyoloe(cluster: sc.Cluster) -> str:
    pub = sc.PPYOLOE_S_V100
    t8 = pub.step_s(8)
    lines = [f"### Beside the published figures: {pub.name}", "",
             f"Source: {pub.source}. Inputs: {pub.note}; {pub.params / 1e6:.2f}M parameters "
             f"(K = {4 * pub.params / 1e6:.1f} MB).", "",
             "| link between nodes | model: 4 nodes vs 1 | published |", "| --- | --- | --- |"]
    for label in ("100Gbit", "25Gbit", "10Gbit", "1Gbit"):
        c = sc.Cluster(intra_bandwidth=sc.LINKS["nvlink-v100"], inter_bandwidth=sc.parse_bandwidth(label),
                       overlap=cluster.overlap)
        one = sc.predict_step(t8, pub.params, 8, 1, c)
        four = sc.predict_step(t8, pub.params, 8, 4, c)
        lines.append(f"| {label} | {four.speedup / one.speedup:.2f}x | 3.0x (PP-YOLOE-s, COCO); "
                     f"{sc.PPYOLOE_X_SPEEDUP_4NODES}x (PP-YOLOE-x, Objects365) |")
    f = sc.amdahl_serial_fraction(3.0, 4)
    lines += ["",
              "Where they agree: the model gives the published 3.0x only with about 1 Gbit between the nodes. "
              f"Where they differ: on 10 Gbit or faster a 32 MB all-reduce costs a few ms against a 1 s step, and "
              f"the model predicts 3.85-3.98x. With a fast network the published 3.0x means about {f:.0%} of the "
              "one-node run did not speed up (Amdahl's law). The published figures are whole training runs in "
              "hours: they include ppdet's evaluation, which runs on one card however many nodes there are, plus "
              "start-up and checkpoints. Those are fixed costs, not communication. PP-YOLOE-x has 12x the "
              "gradient bytes but also about 12x the FLOPs per image (206 vs 17 GFLOPs), so its ratio of "
              "communication to compute is about the same; it reached 3.4x."]
    return "\n".join(lines)
