"""The ``ppmulti bench`` subcommand: measure this machine (table + PNG), or ``--predict`` GPU scaling."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ppmulti.common.errors import UserError
from ppmulti.common.flags import add
from ppmulti.common.rundir import new_run_dir

HELP = "measure training throughput, overheads, start-up and memory here; --predict multi-GPU scaling"
DEFAULT_RUNS = "runs/bench"   # beside runs/train and runs/evolve: results never land in the source tree unasked


def register(subparsers: Any) -> None:
    """Add ``bench`` to the ``ppmulti`` subcommands."""
    p = subparsers.add_parser("bench", help=HELP, description=HELP + ". Measuring writes bench.md, bench.png "
                              f"and bench.json into a new run directory ({DEFAULT_RUNS}/exp, exp2, ... under the "
                              "current directory) or --out; --predict prints a markdown table and needs no GPU.")
    p.add_argument("--out", default=None,
                   help=f"directory for bench.md/png/json (default: a new {DEFAULT_RUNS}/expN in the current "
                        "directory)")
    p.add_argument("--quick", action="store_true", help="a small run (64 px, 5 steps; about a minute on 2 cores)")
    p.add_argument("--models", default="ppyoloe_s,yolov5s",
                   help="models to train, comma-separated: --cfg names (ppyoloe_s, yolov5s, ...) or 'demo' "
                        "(configs/demo/ppyoloe_demo.yml); the first is also run under ppdet's Trainer")
    p.add_argument("--ranks", default="1,2", help="rank counts to compare (default 1,2)")
    add(p, "imgsz", help="image size (default 160; --quick 64)")
    add(p, "batch", help="global batch, split across the ranks (default 16 as the demo: 8 per rank with 2; --quick 4)")
    p.add_argument("--steps", type=int, default=None, help="steps per case (default 12; --quick 5)")
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds, medians reported (default 1)")
    add(p, "workers", default=1, help="data loader workers per rank (default 1)")
    add(p, "multi_scale", help="keep the readers' random training sizes (default: one size, so every step does the "
                               "same work and runs compare)")
    p.add_argument("--heartbeat", action="store_true",
                   help="also train the first model on the most ranks with the watchdog's progress reports off "
                        "(PPMULTI_HEARTBEAT=0), interleaved, and report their cost against a step")
    add(p, "data", help="a demo-format dataset (data.yaml + COCO json) to use instead of generating one")
    p.add_argument("--predict", action="store_true", help="print the scaling model's prediction and exit")
    p.add_argument("--model", default="yolov5l", choices=("yolov5l", "ppyoloe_s"),
                   help="--predict: the model whose published parameters and step time are the defaults")
    p.add_argument("--gpus", type=int, default=8, help="--predict: GPUs per node (default 8)")
    p.add_argument("--nodes", type=int, default=4, help="--predict: nodes (default 4)")
    p.add_argument("--bandwidth", default="100Gbit", help="--predict: each node's network link, e.g. 100Gbit, 25GB/s")
    p.add_argument("--intra", default="nvlink-v100",
                   help="--predict: link inside a node: nvlink-a100, nvlink-v100, pcie3, pcie4 or a bandwidth")
    p.add_argument("--latency", default="10us", help="--predict: per-hop latency between nodes (default 10us)")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="--predict: fraction of the all-reduce hidden behind backward, 0..1 (default 0)")
    p.add_argument("--step-time", "--step_time", dest="step_time",
                   help="--predict: compute time per step on one device, e.g. 170ms (default: the model's)")
    p.add_argument("--params", help="--predict: parameter count, e.g. 46.5M (default: the model's)")
    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected whole numbers separated by commas, e.g. 1,2") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} {text!r}: expected numbers >= 1, e.g. 1,2")
    return values


def output_dir(out: str | None) -> Path:
    """Where a measuring run writes its report: ``--out`` as given, else a fresh ``runs/bench/expN``."""
    if out:
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise UserError(f"--out {out}: exists and is not a directory")
        return path
    return new_run_dir(Path(DEFAULT_RUNS), "exp")


def _model_arg(model: str) -> str:
    # a config or model yaml given by path is read by the probes, which run in their own work directory
    return str(Path(model).resolve()) if Path(model).is_file() else model


def run(args: argparse.Namespace) -> int:
    if args.predict:
        return _predict(args)
    from ppmulti.procs.bench import report, runner

    models = tuple(_model_arg(m.strip()) for m in args.models.split(",") if m.strip())
    if not models:
        raise UserError("--models: give at least one model, e.g. ppyoloe_s,yolov5s")
    ranks = _ints(args.ranks, "--ranks")
    if args.data and not Path(args.data).is_dir():
        raise UserError(f"--data {args.data}: no such directory (generate one with: ppmulti data demo DIR)")
    base = runner.quick_plan() if args.quick else runner.BenchPlan()
    batch = args.batch or base.batch
    for n in ranks:
        if batch % n:
            raise UserError(f"--batch {batch} is not divisible by {n} ranks (--ranks {args.ranks})")
    plan = runner.BenchPlan(
        models=models, ranks=ranks, img=args.imgsz or base.img, batch=batch,
        steps=args.steps or base.steps, warmup=base.warmup, workers=args.workers, repeat=args.repeat,
        train_images=base.train_images, out=output_dir(args.out),
        data=Path(args.data).resolve() if args.data else None,
        timeout=base.timeout, one_size=not args.multi_scale, heartbeat_ab=args.heartbeat)
    print(f"[bench] results go to {plan.out}", flush=True)
    result = runner.measure(plan, progress=lambda s: print(s, flush=True))
    paths = report.write(result, plan.out)
    print(report.markdown(result))
    print(f"written: {paths['md']}, {paths['png']}, {paths['json']}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from ppmulti.procs.bench import scaling as sc
    from ppmulti.procs.bench.predict import predict_report

    if args.gpus < 1 or args.nodes < 1:
        raise UserError(f"--gpus {args.gpus} --nodes {args.nodes}: need at least 1 of each")
    cluster = sc.Cluster(intra_bandwidth=sc.parse_bandwidth(args.intra),
                         inter_bandwidth=sc.parse_bandwidth(args.bandwidth),
                         inter_latency=sc.parse_duration(args.latency, "--latency"),
                         overlap=args.overlap)
    if not 0.0 <= args.overlap <= 1.0:
        raise UserError(f"--overlap {args.overlap}: expected a fraction between 0 and 1")
    step = sc.parse_duration(args.step_time, "--step-time") if args.step_time else None
    if step is not None and step <= 0:
        raise UserError(f"--step-time {args.step_time}: must be positive")
    params = sc.parse_count(args.params) if args.params else None
    print(predict_report(args.model, step, params, args.gpus, args.nodes, cluster), end="")
    return 0
