"""float32 against --amp (bfloat16 convolutions on CPU) side by side in one run: training images/s and final mAP.

What is compared
    Two models on ppmulti's synthetic demo data (256 train / 64 val images, 256 px, three shape classes):
      * demo    -- configs/demo/ppyoloe_demo.yml as ``ppmulti demo`` trains it (global batch 16, --eval,
                   AdamW, 128/160 px), ``--demo-epochs`` epochs (30: the demo's recipe);
      * yolov5s -- ``tools/train.py --cfg yolov5s --data ... --hyp hyp.scratch-low --weights ''`` at ``--img``,
                   global batch 16, ``--yolo-epochs`` epochs, validated after the last one.
    Each one float32 and with ``--amp``, as ``--nproc`` gloo ranks. The two precisions alternate inside every
    round (fp32 first in even rounds, bf16 first in odd ones) so background load lands on both; round r trains
    with ``--seed r`` in both precisions, so the spread between rounds of one precision is the run-to-run noise
    the mAP difference is judged against.
    Images/s = training images / training seconds from results.csv, the first (warm-up) epoch excluded,
    evaluation excluded. mAP = metrics.json (pycocotools bbox, the final weights: EMA where the config uses it).

Run on an idle machine:
    python bench/amp.py                          # 2 rounds, both models, 2 ranks: about 45 min on 2 cores
    python bench/amp.py --quick                  # 1 round, 4 + 4 epochs: a few minutes, figures not to quote
    python bench/amp.py --models yolov5s --rounds 3
Writes bench/results/amp.json (--out) and prints a markdown table. On a CPU without AVX512-BF16/AMX, --amp
has no effect (the runs' logs say so) and the bench refuses to start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HYP = "hyp.scratch-low.yaml"


def _train(cmd: list[str], log: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"training failed (exit {proc.returncode}); see {log}")


def command(model: str, amp: bool, data: Path, out: Path, args: argparse.Namespace, seed: int) -> list[str]:
    train = [sys.executable, str(REPO / "tools" / "train.py")]
    if model == "demo":
        overrides = [f"{s}.dataset_dir={data}" for s in ("TrainDataset", "EvalDataset", "TestDataset")]
        cmd = [*train, "-c", str(REPO / "configs" / "demo" / "ppyoloe_demo.yml"), "-o", *overrides, "--eval",
               "--epochs", str(args.demo_epochs)]
    else:
        cmd = [*train, "--cfg", "yolov5s", "--data", str(data / "data.yaml"), "--weights", "", "--hyp",
               str(REPO / "configs" / "hyps" / HYP), "--img", str(args.img), "--noval",
               "--epochs", str(args.yolo_epochs)]
    cmd += ["--batch", "16", "--device", "cpu", "--seed", str(seed), "--output", str(out / "run"), "--noplots"]
    if args.nproc > 1:
        cmd += ["--nproc", str(args.nproc)]
    return cmd + (["--amp"] if amp else [])


def measure(run: Path) -> dict:
    from ppmulti.common.metrics import read_results

    cols = read_results(run / "results.csv")
    timed = list(zip(cols["images_per_s"], cols["epoch_seconds"]))[1:]
    images, seconds = sum(i * s for i, s in timed), sum(s for _, s in timed)
    metrics = json.loads((run / "metrics.json").read_text())
    log = (run / "train.log").read_text()
    return {"images_per_s": round(images / seconds, 3), "timed_seconds": round(seconds, 1),
            "mAP50": round(metrics["mAP50"], 4), "mAP50_95": round(metrics["mAP50_95"], 4),
            "bf16_convs": "oneDNN bfloat16" in log}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=("demo", "yolov5s"), default=["demo", "yolov5s"])
    ap.add_argument("--rounds", type=int, default=2, help="fp32/bf16 pairs per model (seeds 0..N-1)")
    ap.add_argument("--nproc", type=int, default=2, help="gloo ranks per run (1: one process)")
    ap.add_argument("--demo-epochs", type=int, default=30)
    ap.add_argument("--yolo-epochs", type=int, default=30)
    ap.add_argument("--img", type=int, default=160, help="YOLOv5s image size")
    ap.add_argument("--data", help="demo data dir (both formats; generated if missing)")
    ap.add_argument("--quick", action="store_true", help="1 round of 4 epochs each: a smoke run, not figures")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "amp.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.demo_epochs, args.yolo_epochs = 1, 4, 4
    sys.path.insert(0, str(REPO))
    from ppmulti.common.atomic import atomic_write_text
    from ppmulti.common.cpus import cpu_flags
    from ppmulti.common.synthdata import exists, generate

    if not {"avx512_bf16", "amx_bf16"} & cpu_flags():
        raise SystemExit("this CPU has neither avx512_bf16 nor amx_bf16: --amp has no effect here, nothing to compare")
    tmp = Path(tempfile.mkdtemp(prefix="ppmulti_amp_"))
    data = Path(args.data) if args.data else tmp / "data"
    if not exists(data, "both"):
        generate(data, fmt="both")
    runs: dict[str, dict[str, list[dict]]] = {}
    for model in args.models:
        for r in range(args.rounds):
            for amp in ((False, True) if r % 2 == 0 else (True, False)):
                name = "bf16" if amp else "fp32"
                out = tmp / f"{model}_{name}_{r}"
                t = time.time()
                _train(command(model, amp, data, out, args, seed=r), out.with_suffix(".log"))
                res = {"round": r, "seed": r, **measure(out / "run")}
                runs.setdefault(model, {}).setdefault(name, []).append(res)
                print(f"{model} {name} round {r + 1}/{args.rounds}: {res['images_per_s']:.2f} img/s, mAP50 "
                      f"{res['mAP50']:.3f} mAP50-95 {res['mAP50_95']:.3f} ({time.time() - t:.0f}s wall)", flush=True)
    rows = []
    for model, by in runs.items():
        f32, b16 = by["fp32"], by["bf16"]
        speedups = [b["images_per_s"] / f["images_per_s"] for f, b in zip(f32, b16)]
        rows.append({"model": model, "fp32_images_per_s": [x["images_per_s"] for x in f32],
                     "bf16_images_per_s": [x["images_per_s"] for x in b16], "speedup_per_round": speedups,
                     "median_speedup": round(statistics.median(speedups), 3),
                     "fp32_mAP50_95": [x["mAP50_95"] for x in f32], "bf16_mAP50_95": [x["mAP50_95"] for x in b16],
                     "fp32_mAP50": [x["mAP50"] for x in f32], "bf16_mAP50": [x["mAP50"] for x in b16],
                     "fp32_noise_mAP50_95": round(max(x["mAP50_95"] for x in f32) - min(x["mAP50_95"] for x in f32), 4),
                     "bf16_used": all(x["bf16_convs"] for x in b16)})
    load = os.getloadavg()[0]
    result = {"what": "training images/s (first epoch and evaluation excluded) and final bbox mAP, fp32 vs --amp",
              "conditions": {"nproc": args.nproc, "rounds": args.rounds, "demo_epochs": args.demo_epochs,
                             "yolo_epochs": args.yolo_epochs, "img": args.img, "global_batch": 16,
                             "cores": len(os.sched_getaffinity(0)), "load_average_at_end": round(load, 2)},
              "rows": rows, "runs": runs, "rerun": "python bench/amp.py " + " ".join(argv or sys.argv[1:])}
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print("\n| model | fp32 img/s | bf16 img/s | bf16 / fp32 (median) | fp32 mAP50-95 | bf16 mAP50-95 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {', '.join(map(str, r['fp32_images_per_s']))} | "
              f"{', '.join(map(str, r['bf16_images_per_s']))} | {r['median_speedup']:.2f} | "
              f"{', '.join(map(str, r['fp32_mAP50_95']))} | {', '.join(map(str, r['bf16_mAP50_95']))} |")
    print(f"written {args.out}; load average {load:.2f} on {result['conditions']['cores']} cores"
          + (" (busy: figures provisional)" if load > result["conditions"]["cores"] else ""))


if __name__ == "__main__":
    main()
