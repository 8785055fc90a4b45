"""`ppmulti demo`: make the demo data if missing, train the demo config, evaluate, summarise."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ppmulti.common.cpus import usable_cores
from ppmulti.common.errors import UserError
from ppmulti.common.paths import TRAIN_SCRIPT, config_path

DEMO_CONFIG = "demo/ppyoloe_demo.yml"


def _fmt_duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"


def default_nproc() -> int:
    """Two ranks where two cores exist: one Paddle CPU process uses about one core (see STACK notes)."""
    cores = usable_cores()
    return 2 if cores >= 2 else 1


def run_demo(args: argparse.Namespace) -> int:
    from ppmulti.common.synthdata import exists, generate
    from ppmulti.common.rundir import new_run_dir

    start = time.time()
    data = Path(args.data)
    if exists(data, fmt="both"):
        print(f"demo data: using {data}")
    else:
        print(f"demo data: generating into {data} ...", flush=True)
        generate(data, fmt="both")
    data_seconds = time.time() - start

    config = Path(args.config) if args.config else config_path(DEMO_CONFIG)
    overrides = [f"{section}.dataset_dir={data}" for section in ("TrainDataset", "EvalDataset", "TestDataset")]
    overrides += [item for group in (args.opt or []) for item in group]
    output = Path(args.output) if args.output else new_run_dir(Path("output"), config.stem)
    train_argv = ["-c", str(config), "-o", *overrides, "--output", str(output), "--exist-ok", "--eval",
                  "--batch", str(args.batch)]
    if args.epochs:
        train_argv += ["--epochs", str(args.epochs)]
    if args.nproc is None:
        args.nproc = default_nproc()
    if args.nproc < 1:
        raise UserError(f"--nproc {args.nproc}: need at least 1 process")
    print(f"demo: training {config} as {args.nproc} rank(s); run directory {output}", flush=True)
    if args.nproc > 1:
        from ppmulti.procs.launch.command import main as launch_main

        verbose = ["--verbose"] if getattr(args, "verbose", False) else []
        rc = launch_main(["--nproc_per_node", str(args.nproc), *verbose, str(TRAIN_SCRIPT), *train_argv])
    else:
        from ppmulti.procs.train_command import main as train_main

        rc = train_main(train_argv)
    if rc:
        return rc
    metrics_file = output / "metrics.json"
    if not metrics_file.is_file():
        raise UserError(f"training ended without {metrics_file}; see {output / 'train.log'}")
    m = json.loads(metrics_file.read_text())
    total = time.time() - start
    print(f"demo: bbox mAP50 {m['mAP50']:.3f}, mAP50-95 {m['mAP50_95']:.3f} on {m.get('images', '?')} val images "
          f"after {m['epochs']} epochs; {_fmt_duration(total)} in all (data {_fmt_duration(data_seconds)}, "
          f"training {_fmt_duration(m.get('train_seconds', 0))}); {m['world_size']} rank(s), "
          f"global batch {m['global_batch']}")
    print(f"demo: run directory {output} (results.csv, metrics.json, weights/best.pdparams, train.log)")
    return 0
