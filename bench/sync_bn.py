"""The cost of --sync-bn on CPU ranks: the same 2-rank training with and without it, alternately, side by side.

    python bench/sync_bn.py --data dataset/demo_yolo/data.yaml [--rounds 2] [--img 256] [--epochs 3]

Each run is `tools/train.py --cfg yolov5n.yaml --nproc 2 --device cpu --batch 16 --noval` from scratch; the step time is
the mean of epochs 2..N of results.csv's epoch_seconds over the steps of an epoch (epoch 1 holds the start-up).
Writes bench/results/sync_bn.json and prints a table; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ppmulti.common.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]


def one_run(args: argparse.Namespace, sync: bool, out: Path) -> float:
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), "--data", args.data, "--cfg", "yolov5n.yaml",
           "--weights", "", "--hyp", str(REPO / "configs" / "hyps" / "hyp.scratch-low.yaml"), "--img", str(args.img),
           "--epochs", str(args.epochs), "--batch", str(args.batch), "--device", "cpu", "--nproc", "2",
           "--workers", str(args.workers), "--seed", "0", "--noval", "--output", str(out)]
    cmd += ["--sync-bn"] if sync else []
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = list(csv.DictReader(open(out / "results.csv")))
    return statistics.mean(float(r["epoch_seconds"]) for r in rows[1:]) / args.steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a YOLO data.yaml (ppmulti data demo DIR --format yolo)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--img", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=16, help="global batch (8 per rank)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--train-images", type=int, default=256, help="images in the training split (steps per epoch)")
    args = p.parse_args()
    args.steps = math.ceil(args.train_images / args.batch)
    times: dict[str, list[float]] = {"plain": [], "sync": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in ("plain", "sync"):
                times[mode].append(one_run(args, mode == "sync", Path(tmp) / f"{mode}{r}"))
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join(["python", "bench/sync_bn.py", *sys.argv[1:]]),
              "seconds_per_step": times,
              "ratio_sync_over_plain": statistics.median(times["sync"]) / statistics.median(times["plain"])}
    atomic_write_text(REPO / "bench" / "results" / "sync_bn.json", json.dumps(result, indent=1) + "\n")
    print("| mode | s/step, each round | median |\n| --- | --- | --- |")
    for mode, ts in times.items():
        print(f"| {mode} | {', '.join(f'{t:.3f}' for t in ts)} | {statistics.median(ts):.3f} |")
    print(f"sync / plain: {result['ratio_sync_over_plain']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
