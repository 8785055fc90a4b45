"""Soak: a 2-rank CPU run of many short epochs, evaluating and checkpointing every epoch, watching each
rank's resident memory for growth after warm-up.

    python bench/soak.py --epochs 40 --out bench/results/soak.json

Each rank's VmRSS is sampled from /proc every second; the figure is the growth of the median RSS of
the last 5 epochs over the median of epochs 4-8 (warm-up: allocator pools, the evaluator, pycocotools
and the first checkpoint all arrive in the first epochs). Goal: under 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EPOCH_LINE = re.compile(r"epoch (\d+) done in")


def rank_pids(marker: str) -> dict[int, int]:
    """{rank: pid} of the training ranks whose command line holds ``marker`` (not their loader children)."""
    found: dict[int, tuple[int, int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker not in cmdline or "worker.py" not in cmdline:
                continue
            environ = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        rank = environ.get(b"PADDLE_TRAINER_ID")
        if rank is not None:
            found[int(proc.name)] = (int(rank), ppid)
    return {rank: pid for pid, (rank, ppid) in found.items() if ppid not in found}


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--train", type=int, default=48, help="training images (small: many short epochs)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "soak.json"))
    args = p.parse_args(argv)

    from ppmulti.common.synthdata import generate

    work = Path(tempfile.mkdtemp(prefix="ppmulti-soak-"))
    data = work / "data"
    generate(data, fmt="coco", n_train=args.train, n_val=16, size=128, seed=5)
    run = work / "run"
    overrides = [f"{s}.dataset_dir={data}" for s in ("TrainDataset", "EvalDataset", "TestDataset")]
    overrides += ["eval_height=128", "eval_width=128", "snapshot_epoch=1", "worker_num=0", "log_iter=50"]
    cmd = [sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", "--log_dir", str(work / "log"),
           str(REPO / "tools" / "train.py"), "-c", str(REPO / "configs/demo/ppyoloe_demo.yml"), "-o", *overrides,
           "--eval", "--batch", "8", "--epochs", str(args.epochs), "--output", str(run)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples: list[tuple[int, int, float]] = []   # (epoch being trained, rank, MB)
    pids: dict[int, int] = {}
    started = time.time()
    while proc.poll() is None:
        time.sleep(1.0)
        if len(pids) < 2:
            pids = rank_pids(str(run))
        log = run / "train.log"
        done = EPOCH_LINE.findall(log.read_text()) if log.is_file() else []
        epoch = int(done[-1]) + 1 if done else 1
        for rank, pid in pids.items():
            mb = rss_mb(pid)
            if mb is not None:
                samples.append((epoch, rank, mb))
    wall = time.time() - started
    if proc.returncode != 0:
        print(f"training failed (exit {proc.returncode}); see {run / 'train.log'}", file=sys.stderr)
        return 1

    result = {"epochs": args.epochs, "train_images": args.train, "wall_seconds": round(wall, 1), "ranks": {}}
    last_from = args.epochs - 4
    for rank in sorted({r for _, r, _ in samples}):
        warm = [mb for e, r, mb in samples if r == rank and 4 <= e <= 8]
        late = [mb for e, r, mb in samples if r == rank and e >= last_from]
        per_epoch = {}
        for e, r, mb in samples:
            if r == rank:
                per_epoch.setdefault(e, []).append(mb)
        base, end = statistics.median(warm), statistics.median(late)
        result["ranks"][rank] = {"warm_mb": round(base, 1), "end_mb": round(end, 1),
                                 "growth_pct": round(100 * (end - base) / base, 2),
                                 "peak_mb": round(max(mb for _, r, mb in samples if r == rank), 1),
                                 "median_mb_by_epoch": {e: round(statistics.median(v), 1)
                                                        for e, v in sorted(per_epoch.items())}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| rank | RSS epochs 4-8 (MB) | RSS last 5 epochs (MB) | growth | peak (MB) |")
    print("| --- | --- | --- | --- | --- |")
    for rank, r in result["ranks"].items():
        print(f"| {rank} | {r['warm_mb']} | {r['end_mb']} | {r['growth_pct']:+.2f}% | {r['peak_mb']} |")
    print(f"{args.epochs} epochs with evaluation and a checkpoint each, {wall:.0f} s; details in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
