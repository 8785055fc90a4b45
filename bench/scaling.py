"""Images/s of the demo config with 1 rank and with 2 ranks on this machine, side by side in one run.

Each case trains the same number of epochs on the same data with the same global batch; the figure is
results.csv's images_per_s (global images per second of training, evaluation excluded), best epoch of
the run after the first (warm-up).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _ips(run: Path) -> float:
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    values = [float(r["images_per_s"]) for r in rows[1:]] or [float(rows[0]["images_per_s"])]
    return max(values)


def train(nproc: int, data: Path, out: Path, epochs: int, batch: int, extra: list[str]) -> float:
    base = ["-c", str(REPO / "configs/demo/ppyoloe_demo.yml"), "-o",
            *[f"{s}.dataset_dir={data}" for s in ("TrainDataset", "EvalDataset", "TestDataset")], *extra,
            "--epochs", str(epochs), "--batch", str(batch), "--output", str(out)]
    if nproc == 1:
        cmd = [sys.executable, str(REPO / "tools/train.py"), *base]
    else:
        cmd = [sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", str(nproc),
               str(REPO / "tools/train.py"), *base]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return _ips(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", help="demo dataset dir (generated if missing)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="global batch")
    ap.add_argument("--train", type=int, default=128, help="training images when generating")
    args, extra = ap.parse_known_args()
    from ppmulti.data.demo import exists, generate

    tmp = Path(tempfile.mkdtemp(prefix="ppmulti_bench_"))
    data = Path(args.data) if args.data else tmp / "data"
    if not exists(data):
        generate(data, n_train=args.train, n_val=32)
    one = train(1, data, tmp / "one", args.epochs, args.batch, extra)
    two = train(2, data, tmp / "two", args.epochs, args.batch, extra)
    result = {"one_rank_img_s": round(one, 2), "two_ranks_img_s": round(two, 2), "speedup": round(two / one, 3)}
    print("| ranks | images/s |\n| --- | --- |")
    print(f"| 1 | {one:.2f} |\n| 2 | {two:.2f} |\nspeed-up 2 vs 1: {two / one:.2f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
