"""Start-up time: a training loader's first 3 batches as the dataset grows, ppmulti against ultralytics/yolov5.

What is measured
    Wall seconds from starting a fresh Python process to its loader handing over the 3rd batch (imports, config,
    dataset scan, loader set-up, 3 batches of 16 at 640 px with YOLOv5's hyp.scratch-low augmentations, no loader
    workers), for YOLO-format training sets of 128, 12,800 and 128,000 images: hard links of one base set of 128
    demo JPEGs and their labels (``ppmulti data demo``'s generator), so only the number of files grows.
      * ppmulti -- the loader ``tools/train.py --cfg yolov5n --data ... --img 640 --batch 16 --workers 0`` builds
                   (the same config edits, dataset and reader as a training; the model is never built).
      * yolov5  -- YOLOv5's own ``utils.dataloaders.create_dataloader`` on the same folder, in the bench's torch
                   venv (bench/vs_yolov5.py's ``ensure_venv``; --yolov5 DIR, a checkout).
    First start: neither tool's scan cache exists (ppmulti's labels/train.ppmulti.cache and YOLOv5's
    labels/train.cache are removed). Second start: the same command again, reading the cache the first wrote.
    The files stay in the page cache between runs (hard links of 128 files: a warm-cache figure for both).
    What matters is how much each start grows with the number of images; the 128-image row is the base.

Run:  python bench/startup.py [--yolov5 DIR] [--sizes 128 12800 128000] [--rounds 3] [--out FILE]
Writes bench/results/startup.json (--out): every run, and the medians in the printed table.
The hard-link trees live in a temp dir (under --workdir) removed at the end; prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HYP = REPO / "configs" / "hyps" / "hyp.scratch-low.yaml"
BATCHES, BATCH, IMG = 3, 16, 640


# ----------------------------------------------------------------------------- the workers (one fresh process each)
def _ppmulti_worker(argv: list[str]) -> None:
    data, out = argv
    sys.path.insert(0, str(REPO))
    from ppdet.core.workspace import create

    from ppmulti.rank import dist
    from ppmulti.rank.bench_probe import _ppdet_config

    imported = time.time()
    ns = argparse.Namespace(one_size=0)
    _, cfg = _ppdet_config(ns, ["--cfg", "yolov5n", "--data", data, "--img", str(IMG), "--batch", str(BATCH),
                                "--hyp", str(HYP), "--workers", "0", "--device", "cpu"])
    dist.set_cpu_threads(1)
    dataset = create("TrainDataset")()
    dataset.parse_dataset()        # the scan (the reader's own call then finds it done)
    scanned = time.time()
    loader = create("TrainReader")(dataset, 0)
    n = 0
    for _ in loader:
        n += 1
        if n >= BATCHES:
            break
    Path(out).write_text(json.dumps({"done": time.time(), "imported": imported, "scanned": scanned,
                                     "images": len(dataset.roidbs)}))


def _yolov5_worker(argv: list[str]) -> None:
    yolov5, images, out = argv
    sys.path.insert(0, str(REPO / "bench"))
    from vs_yolov5 import OFFLINE_ENV, _torchvision_nms_shim

    os.environ.update(OFFLINE_ENV)
    _torchvision_nms_shim()     # the CPU torch with PyPI's CUDA torchvision (see bench/vs_yolov5.py)
    sys.path.insert(0, yolov5)
    import yaml
    from utils.dataloaders import create_dataloader

    import torch  # noqa: F401  (imported by create_dataloader's module anyway; timed apart from the scan)

    imported = time.time()
    hyp = yaml.safe_load(Path(HYP).read_text())
    loader, dataset = create_dataloader(images, IMG, BATCH, 32, hyp=hyp, augment=True, workers=0, shuffle=True)
    scanned = time.time()
    n = 0
    for _ in loader:
        n += 1
        if n >= BATCHES:
            break
    Path(out).write_text(json.dumps({"done": time.time(), "imported": imported, "scanned": scanned,
                                     "images": len(dataset)}))


# ----------------------------------------------------------------------------- the trees and the runs
def base_set(work: Path) -> Path:
    from ppmulti.common.synthdata import generate

    root = work / "base"
    generate(root, fmt="yolo", n_train=128, n_val=1, size=640, seed=0)
    return root


def tree(base: Path, work: Path, n: int) -> Path:
    """``n`` training images: hard links of the base set's 128 images and labels, numbered."""
    root = work / f"n{n}"
    ims, lbs = root / "images" / "train", root / "labels" / "train"
    ims.mkdir(parents=True)
    lbs.mkdir(parents=True)
    src_ims = sorted((base / "images" / "train").iterdir())
    for i in range(n):
        im = src_ims[i % len(src_ims)]
        os.link(im, ims / f"{i:07d}{im.suffix}")
        lb = base / "labels" / "train" / (im.stem + ".txt")
        if lb.exists():
            os.link(lb, lbs / f"{i:07d}.txt")
    import yaml

    names = yaml.safe_load((base / "data.yaml").read_text())["names"]
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "names": names}))
    return root


def timed(cmd: list[str], out: Path, log: Path, cwd: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if proc.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    rec = json.loads(out.read_text())
    return {"seconds": rec["done"] - t0, "dataset_s": rec["scanned"] - rec["imported"], "images": rec["images"]}


def run_case(tool: str, root: Path, start: str, work: Path, yolov5: Path | None, python5: Path | None) -> dict:
    if start == "first":
        for cache in (root / "labels" / "train.ppmulti.cache", root / "labels" / "train.cache"):
            cache.unlink(missing_ok=True)
    out, log = work / f"{tool}-{root.name}-{start}.json", work / f"{tool}-{root.name}-{start}.log"
    me = str(Path(__file__).resolve())
    if tool == "ppmulti":
        return timed([sys.executable, me, "ppmulti-worker", str(root / "data.yaml"), str(out)], out, log)
    return timed([str(python5), me, "yolov5-worker", str(yolov5), str(root / "images" / "train"), str(out)],
                 out, log, cwd=yolov5)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--yolov5", type=Path, help="a YOLOv5 checkout (git clone https://github.com/ultralytics/yolov5); "
                                               "without it only ppmulti is measured")
    p.add_argument("--venv", type=Path, default=REPO / "bench" / ".venv-yolov5", help="the bench's torch venv")
    p.add_argument("--torch", default="torch==2.13.0")
    p.add_argument("--torchvision", default="torchvision==0.28.0")
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 12800, 128000])
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "startup.json")
    p.add_argument("--rounds", type=int, default=1, help="repeat each first/second pair, report the medians")
    p.add_argument("--workdir", type=Path, help="where the hard-link trees go (default: a temp dir, removed)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ppmulti-worker"]:
        return _ppmulti_worker(argv[1:])
    if argv[:1] == ["yolov5-worker"]:
        return _yolov5_worker(argv[1:])
    a = parse_args(argv)
    python5 = None
    if a.yolov5:
        sys.path.insert(0, str(REPO / "bench"))
        from vs_yolov5 import ensure_venv

        python5 = ensure_venv(a.venv, a.yolov5.resolve(), a.torch, a.torchvision)
    work = Path(tempfile.mkdtemp(prefix="ppmulti-startup-", dir=a.workdir))
    tools = ["ppmulti"] + (["yolov5"] if a.yolov5 else [])
    rows = []
    try:
        base = base_set(work)
        for n in a.sizes:
            root = tree(base, work, n)
            for rnd in range(a.rounds):
                for tool in tools:     # the tools alternate so that background load hits both
                    for start in ("first", "second"):
                        r = run_case(tool, root, start, work, a.yolov5 and a.yolov5.resolve(), python5)
                        rows.append({"tool": tool, "images": n, "start": start, "round": rnd, **r})
                        print(f"{tool:8s} {n:>7d} images, {start:6s} start: {r['seconds']:6.1f} s "
                              f"(dataset set-up {r['dataset_s']:.1f} s)", flush=True)
            shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
              "batches": BATCHES, "batch": BATCH, "img": IMG, "rows": rows}
    a.out.write_text(json.dumps(record, indent=1))
    base_n = min(a.sizes)
    print(f"\nmedians of {a.rounds} round(s); dataset = building the dataset object (scan or cache read), "
          f"imports excluded\n\n| tool | images | first start (s) | second start (s) | first, added over {base_n} "
          f"| second, added over {base_n} | dataset, first (s) | dataset, second (s) |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tool in tools:
        def med(n: int, st: str, key: str) -> float:
            return statistics.median(r[key] for r in rows if (r["tool"], r["images"], r["start"]) == (tool, n, st))

        for n in a.sizes:
            f, s = med(n, "first", "seconds"), med(n, "second", "seconds")
            print(f"| {tool} | {n:,} | {f:.1f} | {s:.1f} | {f - med(base_n, 'first', 'seconds'):+.1f} | "
                  f"{s - med(base_n, 'second', 'seconds'):+.1f} | {med(n, 'first', 'dataset_s'):.1f} | "
                  f"{med(n, 'second', 'dataset_s'):.1f} |")

if __name__ == "__main__":
    main()
