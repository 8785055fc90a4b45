"""`ppmulti bench`'s rank side: measuring probes, each run as its own process (or as each rank of a launch).

``python ppmulti/rank/bench_probe.py MODE --out FILE ...`` (the file path form is what ``ppmulti launch`` needs):

- ``train``     ppmulti's Trainer for ``--steps`` steps with its normal hooks; per-step wall times,
                first-step time, CPU time, threads, peak resident memory (ru_maxrss) of each rank.
- ``ppdet``     ppdet's own Trainer on the same config and steps (the overhead reference).
- ``loader``    the training data loader alone: batches/s with the model never run.
- ``allreduce`` all-reduce of a float32 buffer as large as the model's gradients, timed (2+ ranks); each record
                also holds every rank's timing and node (gathered), and with ``--pairs`` each node's all-reduce
                with node 0 alone, which ``ppmulti launch --check-network`` reports.

Each writes one JSON record per rank. Rank-side code: it never starts processes; ``ppmulti.procs.bench.runner``
does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

if __package__ in (None, ""):   # run as a file by the launcher: make `ppmulti` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


class _Stop(Exception):
    """Raised from a hook to end a probe's training after its steps."""


def _train_args(argv: list[str]):
    from ppmulti.common.train_flags import build_parser
    from ppmulti.rank.entry import resolve

    return resolve(build_parser().parse_args(argv))


def _size_fix(one_size: int):
    """The probe's own change to the edited config (``build_trainer(after_edit=...)``): one training size."""
    return (lambda cfg: _fix_size(cfg, one_size)) if one_size else None


def _fix_size(cfg, size: int) -> None:
    """Train at one size: the readers' random multi-scale makes steps differ up to 6x in work, so ten steps
    of two runs would compare the sizes each happened to draw instead of the loops."""
    from ppmulti.common.yamlread import reader_ops

    for body in reader_ops(cfg, "BatchRandomResize"):
        body["target_size"], body["random_size"] = [size], True


def _write(out: str, record: dict) -> None:
    from ppmulti.common.atomic import atomic_write_text

    rank = int(record.get("rank", 0))
    path = Path(out)
    if path.suffix != ".json":
        path.mkdir(parents=True, exist_ok=True)
        path = path / f"rank{rank}.json"
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def _usage() -> dict:
    t = os.times()
    return {"cpu_s": t.user + t.system, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _beat_cost() -> dict:
    """What one progress report costs (microseconds, median of 5 x 20,000 on a scratch record) and how many a
    training step makes: the watchdog's share of a step, precise where two whole runs differ by noise."""
    import statistics
    import tempfile

    from ppmulti.rank.heartbeat import Heartbeat

    with tempfile.TemporaryDirectory() as tmp:
        beat = Heartbeat(tmp, 0).beat
        runs = []
        for _ in range(5):
            t = time.perf_counter()
            for i in range(20_000):
                beat("forward", i)
            runs.append((time.perf_counter() - t) / 20_000 * 1e6)
    # data, forward, backward (ppmulti.rank.engine.trainer)
    return {"beat_us": statistics.median(runs), "beats_per_step": 3}


def probe_train(ns, train_argv: list[str]) -> dict:
    from ppmulti.rank.engine.hooks import Hook
    from ppmulti.rank.engine.builder import build_trainer

    opts = _train_args(train_argv)
    times: list[float] = []
    data_times: list[float] = []

    class Record(Hook):
        def after_step(self, trainer, epoch, step, outputs, lr, data_time):
            times.append(time.time())
            data_times.append(data_time)
            if len(times) == 1:
                self.cpu0 = _usage()["cpu_s"]
            if len(times) >= ns.steps:
                raise _Stop

    trainer = build_trainer(opts, after_edit=_size_fix(ns.one_size))
    trainer.default_hooks()
    rec = Record()
    trainer.register(rec)
    try:
        trainer.train()
    except _Stop:
        pass
    usage = _usage()
    warm = min(ns.warmup, len(times) - 2)
    span = times[-1] - times[warm]
    steps = len(times) - 1 - warm
    return {"mode": "train", "rank": trainer.rank, "world": trainer.world,
            "threads": getattr(trainer, "threads", None), "global_batch": trainer.batch.global_batch,
            "first_step_at": times[0], "step_times": times,
            "img_s": steps * trainer.batch.global_batch / span if span > 0 else 0.0,
            "step_s": span / steps if steps else 0.0,
            # CPU seconds per wall second after the first step: 1.0 = one core busy
            "cpu_util": (usage["cpu_s"] - rec.cpu0) / (times[-1] - times[0]) if len(times) > 1 else 0.0,
            "data_s": sum(data_times[warm + 1:]) / max(1, steps),
            # this rank's CPU seconds per image it trained (loader workers not included)
            "cpu_s_per_img": (usage["cpu_s"] - rec.cpu0) / max(1, (len(times) - 1) * trainer.batch.per_rank),
            "params": sum(int(p.size) for p in trainer.model.parameters() if not p.stop_gradient),
            "worker_num": int(trainer.cfg.get("worker_num", 0)),
            "conv_kernel": trainer.conv_kernel,
            **_beat_cost(), **usage}


def _ppdet_config(ns, train_argv: list[str], device: str = "cpu"):
    """The config ppmulti would train, loaded for ppdet's own pieces: (options, cfg) with the batch and workers;
    ``device`` decides where YOLOv5's HSV gains go, as on the Trainer's device (``gpu``: left to the device)."""
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.data.cache import apply_cache
    from ppmulti.rank.data.device import place_hsv

    from ppmulti.rank.yolo_config import apply_edit

    opts = _train_args(train_argv)
    cfg = config_mod.load(opts.config, opts.overrides)
    if opts.edit:
        apply_edit(cfg, opts.edit)
    if ns.one_size:
        _fix_size(cfg, ns.one_size)
    apply_cache(cfg, opts.cache)   # --cache, as the Trainer's builder applies it
    place_hsv(cfg, device)
    if opts.batch:
        cfg.TrainReader["batch_size"] = int(opts.batch)
    if opts.edit and opts.edit.rect:   # one process: the global batch is its batch
        from ppmulti.rank.yolo_config import set_rect_batch

        set_rect_batch(cfg, int(cfg.TrainReader["batch_size"]))
    if opts.workers is not None:
        cfg["worker_num"] = int(opts.workers)
    return opts, cfg


def probe_ppdet(ns, train_argv: list[str]) -> dict:
    """ppdet's Trainer on the config ppmulti would train (same edits, batch and threads)."""
    import paddle
    from ppdet.engine import Trainer
    from ppdet.engine.callbacks import Callback

    from ppmulti.rank import compat
    from ppmulti.rank import dist
    from ppmulti.rank.data.device import host_normalize

    opts, cfg = _ppdet_config(ns, train_argv)
    host_normalize(cfg)   # ppdet's Trainer feeds the model the loader's batch as it is
    cfg["use_vdl"] = False   # else ppdet's Trainer writes a VisualDL log into the working directory
    compat.set_device("cpu")
    threads = dist.set_cpu_threads(1)
    paddle.seed(opts.seed)
    times: list[float] = []

    class Capture(Callback):
        def on_step_end(self, status):
            if status.get("mode") == "train":
                times.append(time.time())
                if len(times) >= ns.steps:
                    raise _Stop

    trainer = Trainer(cfg, mode="train")
    # the same convolution kernel as ppmulti's Trainer picks on this CPU (the oneDNN op unless
    # PPMULTI_CPU_CONV=paddle), so that the ratio measures the loop, not the kernel
    from ppmulti.rank.ops.cpu import setup_cpu_ops

    conv_kernel = setup_cpu_ops(trainer.model)
    # ppdet's own callbacks stay (log printer, checkpointer, VisualDL as configured), as ppmulti's hooks do
    compat.add_trainer_callbacks(trainer, Capture(trainer))
    try:
        trainer.train(validate=False)
    except _Stop:
        pass
    batch = int(cfg.TrainReader["batch_size"])
    warm = min(ns.warmup, len(times) - 2)
    span = times[-1] - times[warm]
    steps = len(times) - 1 - warm
    return {"mode": "ppdet", "rank": 0, "world": 1, "threads": threads, "global_batch": batch,
            "conv_kernel": conv_kernel,
            "first_step_at": times[0], "img_s": steps * batch / span if span > 0 else 0.0,
            "step_s": span / steps if steps else 0.0, **_usage()}


def probe_loader(ns, train_argv: list[str]) -> dict:
    """The loader alone, built as the Trainer builds it (same reader, batch, worker_num, cache)."""
    from ppdet.core.workspace import create

    from ppmulti.rank.data.cache import prebuild_cache

    from ppmulti.rank import dist

    opts, cfg = _ppdet_config(ns, train_argv)
    dist.set_cpu_threads(1)
    dataset = create("TrainDataset")()
    loader = create("TrainReader")(dataset, cfg.get("worker_num", 0))
    prebuild_cache(dataset, cfg)   # --cache: built before the workers fork, as the Trainer's builder does
    batch = int(cfg.TrainReader["batch_size"])
    times: list[float] = []
    epoch = 0
    while len(times) < ns.steps:
        dataset.set_epoch(epoch)
        for _ in loader:
            times.append(time.time())
            if len(times) >= ns.steps:
                break
        epoch += 1
    warm = min(ns.warmup, len(times) - 2)
    span = times[-1] - times[warm]
    # CPU seconds per image of loading, measured in this process (worker_num 0): what the loader takes
    # from the cores the ranks compute on, independent of how busy the machine is
    inline = create("TrainReader")(dataset, 0)
    cpu0, n = _usage()["cpu_s"], 0
    for _ in inline:
        n += 1
        if n >= max(2, ns.steps // 2):
            break
    cpu_per_img = (_usage()["cpu_s"] - cpu0) / (n * batch)
    return {"mode": "loader", "rank": 0, "world": 1, "global_batch": batch,
            "worker_num": int(cfg.get("worker_num", 0)),
            "img_s": (len(times) - 1 - warm) * batch / span if span > 0 else 0.0,
            "cpu_s_per_img": cpu_per_img, **_usage()}


def _timed_allreduce(buf, steps: int, group=None) -> list[float]:
    """Seconds of each of ``steps`` all-reduces of ``buf`` (after one warm-up: connections, buffers), sorted."""
    import paddle.distributed as pdist

    pdist.all_reduce(buf, group=group)
    samples = []
    for _ in range(steps):
        if group is None:
            pdist.barrier()
        t = time.perf_counter()
        pdist.all_reduce(buf, group=group)
        samples.append(time.perf_counter() - t)
    return sorted(samples)


def probe_allreduce(ns, _argv: list[str]) -> dict:
    """Time one all-reduce of ``--numel`` float32 values (a model's gradients), median of ``--steps``.

    Every rank's record also holds every rank's median and node (gathered). ``--pairs``: then, for each node after
    the first, node 0's first rank and that node's first rank all-reduce the same buffer in a group of two, which
    isolates that node's link to node 0 through the same collective library (``ppmulti launch --check-network``)."""
    import paddle
    import paddle.distributed as pdist

    from ppmulti.common.envvars import worker_info
    from ppmulti.rank import dist

    world = dist.init()
    dist.set_cpu_threads()
    buf = paddle.ones([int(ns.numel)], dtype="float32")
    samples = _timed_allreduce(buf, ns.steps)
    median, low = samples[len(samples) // 2], samples[0]
    mine = paddle.to_tensor([float(worker_info().node_rank), median, low], dtype="float64")
    gathered: list = []
    pdist.all_gather(gathered, mine)
    ranks = [{"rank": r, "node": int(t[0]), "median_s": float(t[1]), "min_s": float(t[2])}
             for r, t in enumerate(x.numpy().tolist() for x in gathered)]
    record = {"mode": "allreduce", "rank": dist.rank(), "world": world, "numel": int(ns.numel),
              "bytes": 4 * int(ns.numel), "median_s": median, "min_s": low, "ranks": ranks}
    if ns.pairs and world > 1:
        first: dict[int, int] = {}
        for r in ranks:
            first.setdefault(r["node"], r["rank"])
        nodes = sorted(first)
        pair_s = paddle.zeros([len(nodes)], dtype="float64")
        for i, node in enumerate(nodes[1:], start=1):
            members = sorted({first[nodes[0]], first[node]})
            group = pdist.new_group(members)   # every rank takes part in making every group
            if dist.rank() in members:
                timed = _timed_allreduce(buf, ns.steps, group)
                pair_s[i] = timed[len(timed) // 2]
            pdist.barrier()
        pdist.all_reduce(pair_s, op=pdist.ReduceOp.MAX)   # both members' medians: the slower one
        record["pairs"] = [{"node": node, "median_s": float(pair_s[i])} for i, node in enumerate(nodes) if i]
    return {**record, **_usage()}


MODES = {"train": probe_train, "ppdet": probe_ppdet, "loader": probe_loader, "allreduce": probe_allreduce}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_argv: list[str] = []
    if "--" in argv:   # everything after -- is tools/train.py's command line
        cut = argv.index("--")
        argv, train_argv = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(prog="probe", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=sorted(MODES))
    ap.add_argument("--out", required=True, help="a .json file, or a directory for rankN.json")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the rate")
    ap.add_argument("--numel", type=float, default=0, help="allreduce: float32 values per all-reduce")
    ap.add_argument("--pairs", action="store_true",
                    help="allreduce: also node 0's first rank with each other node's first rank, in pairs")
    ap.add_argument("--one-size", type=int, default=0, help="train at this one size (no random multi-scale)")
    ns = ap.parse_args(argv)
    record = MODES[ns.mode](ns, train_argv)
    _write(ns.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
