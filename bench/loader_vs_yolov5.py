"""The training loader alone, ppmulti's against ultralytics/yolov5's, on the same JPEGs, side by side in one run.

What is compared
    YOLOv5's recipe on both sides: yolov5s, hyp.scratch-low (mosaic 1.0, HSV, fliplr 0.5), --img 640, --batch 16,
    shuffled, no cache (or --cache ram on both).
      * ppmulti -- the loader ``ppmulti/rank/bench_probe.py loader`` builds from the YOLOv5 flags
                   ``--cfg yolov5s --data DATA.yaml --hyp hyp.scratch-low.yaml --img 640 --batch 16``
                   (the YOLOv5 reader: ppmulti's YOLOv5 ops, uint8 batches normalised on the device), twice:
                   as a GPU run builds it (``ppmulti``: YOLOv5's HSV gains drawn in the loader and applied on
                   the GPU) and as a CPU run builds it (``ppmulti-hsv-host``: the gains applied in the loader).
                   What the GPU's share would cost on this CPU is reported beside (``device_ms_per_img``, the
                   trainer's to_model_input on the loader's batches; on a GPU it runs there).
      * yolov5  -- ``utils.dataloaders.create_dataloader`` of a YOLOv5 checkout (``--yolov5 DIR``) with
                   the same yaml files, in its own venv (bench/vs_yolov5.py's ``ensure_venv``, offline env).
                   YOLOv5 caps its workers at os.cpu_count(); the bench lifts that cap (``os.cpu_count`` answers
                   the asked number in its process) so that both sides run the asked workers.
    Measured per case, in a fresh process:
      * img/s with W loader workers (1, 2, 4): batches drawn as fast as they come, the model never run; the
        first batch (worker start) is not timed; epochs follow each other as in training (ppdet's loader starts
        its workers again every epoch, YOLOv5's InfiniteDataLoader keeps them: each tool as it trains).
      * CPU ms per image in-process (workers 0): time.process_time() over --cpu-images images after one warm-up
        batch: decode + augment + batch + collate, everything the cores spend on loading.
    The cases alternate (ppmulti, ppmulti-hsv-host, yolov5, ppmulti ...) so that background load hits both.

Images: --images (128) JPEGs at 640x480, quality 90, cut at random places and scales from the real photographs
that every YOLOv5 checkout ships (data/images/bus.jpg, zidane.jpg), mirrored at random; 1-8 random boxes each
(3 classes). Written once to a temp dir (or --data DIR, kept).

Run:  python bench/loader_vs_yolov5.py --yolov5 DIR [--workers 1 2 4] [--rounds 2] [--cache ram] [--mosaic-buffer 64]
Writes bench/results/loader_vs_yolov5.json and .md (--out) and prints the markdown table.
"""

from __future__ import annotations

import argparse
import glob
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
sys.path.insert(0, str(REPO / "bench"))
from vs_yolov5 import (DEFAULT_VENV, HYP, _offline_yolov5, _run_env, _torchvision_nms_shim,  # noqa: E402
                       ensure_venv)

PHOTOS = ("bus.jpg", "zidane.jpg")


# ============================================================================ the images
def make_images(yolov5: Path, out: Path, n: int, seed: int = 0) -> Path:
    """``n`` 640x480 JPEG crops of YOLOv5's sample photographs with random YOLO labels; returns the data yaml."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    photos = [cv2.imread(str(yolov5 / "data" / "images" / p)) for p in PHOTOS]
    if any(p is None for p in photos):
        raise SystemExit(f"--yolov5 {yolov5}: data/images/{' and '.join(PHOTOS)} are needed for the images")
    (out / "images" / "train").mkdir(parents=True, exist_ok=True)
    (out / "labels" / "train").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        im = photos[i % len(photos)]
        h, w = im.shape[:2]
        ch = int(min(h, w * 0.75) * rng.uniform(0.6, 1.0))
        cw = int(ch / 0.75)
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = cv2.resize(im[y:y + ch, x:x + cw], (640, 480), interpolation=cv2.INTER_AREA)
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        cv2.imwrite(str(out / "images" / "train" / f"im{i:04d}.jpg"), crop, [cv2.IMWRITE_JPEG_QUALITY, 90])
        lines = []
        for _ in range(int(rng.integers(1, 9))):
            bw, bh = rng.uniform(0.05, 0.5, 2)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            lines.append(f"{int(rng.integers(0, 3))} {cx:.5f} {cy:.5f} {bw:.5f} {bh:.5f}")
        (out / "labels" / "train" / f"im{i:04d}.txt").write_text("\n".join(lines) + "\n")
    yaml = out / "data.yaml"
    yaml.write_text(f"path: {out}\ntrain: images/train\nval: images/train\nnames: [a, b, c]\n")
    return yaml


# ============================================================================ timing, shared by both workers
def _time_batches(loader, batches: int, batch: int, images_of) -> float:
    """img/s over ``batches`` batches after the first; the loader is iterated again as epochs end."""
    times: list[float] = []
    while len(times) <= batches:
        for b in loader:
            times.append(time.perf_counter())
            if len(times) > batches:
                break
    span = times[-1] - times[0]
    return batches * batch / span if span > 0 else 0.0


def _cpu_per_image(loader, images: int, batch: int) -> float:
    """CPU ms per image of an in-process loader (workers 0) after one warm-up batch."""
    it = iter(loader)
    next(it)
    n, t0 = 0, time.process_time()
    while n < images:
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            continue
        n += batch
    return (time.process_time() - t0) / n * 1000


# ============================================================================ ppmulti side (ppmulti's env)
def _ppmulti_worker(argv: list[str]) -> None:
    a = _worker_args(argv)
    sys.path.insert(0, str(REPO))
    from ppdet.core.workspace import create

    from ppmulti.rank import dist
    from ppmulti.rank.bench_probe import _ppdet_config
    from ppmulti.common.yamlread import reader_ops
    from ppmulti.rank.data.cache import prebuild_cache

    flags = ["--cfg", "yolov5s", "--data", a.data, "--hyp", str(REPO / "configs" / "hyps" / HYP), "--img", "640",
             "--batch", str(a.batch), "--workers", str(a.workers)]
    if a.cache:
        flags += ["--cache", a.cache]
    if a.mosaic_buffer is not None:
        flags += ["--mosaic-buffer", str(a.mosaic_buffer)]
    # --hsv device: the loader a GPU run builds (the HSV gains drawn here, applied on the GPU)
    _, cfg = _ppdet_config(argparse.Namespace(one_size=0), flags, device="gpu" if a.hsv == "device" else "cpu")
    dist.set_cpu_threads(1)
    dataset = create("TrainDataset")()
    loader = create("TrainReader")(dataset, a.workers)
    prebuild_cache(dataset, cfg)   # --cache ram/disk: built before the workers fork, as the Trainer does
    mosaic = reader_ops(cfg, "YOLOv5Mosaic")[0]
    result = {"side": "ppmulti" if a.hsv == "device" else "ppmulti-hsv-host", "workers": a.workers,
              "cache": a.cache, "mosaic_buffer": int(mosaic.get("buffer", 0))}
    if a.workers == 0:
        result["cpu_ms_per_img"] = _cpu_per_image(loader, a.images, a.batch)
        result["device_ms_per_img"] = _device_per_image(loader, cfg, a.batch)
    else:
        result["img_s"] = _time_batches(loader, a.batches, a.batch, None)
    Path(a.out).write_text(json.dumps(result))


def _device_per_image(loader, cfg, batch: int, batches: int = 2) -> float:
    """ms per image of what the trainer does to a batch on the device before the model (to_model_input: the
    HSV gains when the loader left them, the permute, /255), run here on the CPU with one thread."""
    from ppmulti.rank.data.device import input_norm, to_model_input

    norm, total = input_norm(cfg), 0.0
    it = iter(loader)
    for _ in range(batches):
        data = next(it)
        t0 = time.process_time()
        to_model_input(data, norm)["image"].numpy()
        total += time.process_time() - t0
    return total / (batches * batch) * 1000


# ============================================================================ YOLOv5 side (its venv)
def _yolov5_worker(argv: list[str]) -> None:
    a = _worker_args(argv)
    out, yolov5, _ = _offline_yolov5(argparse.Namespace(out=str(Path(a.out).parent), yolov5=a.yolov5))
    asked = max(1, a.workers)
    os.cpu_count = lambda: asked   # create_dataloader caps workers at os.cpu_count(); both sides run `asked`
    _torchvision_nms_shim()   # torchvision's CUDA-built ops do not load beside the CPU torch (vs_yolov5.py)
    sys.path.insert(0, str(yolov5))
    import yaml
    from utils.dataloaders import create_dataloader

    import torch

    torch.set_num_threads(1)   # as in a DataLoader worker (torch sets 1 there), and as ppmulti's side runs
    hyp = yaml.safe_load((yolov5 / "data" / "hyps" / HYP).read_text())
    data = yaml.safe_load(Path(a.data).read_text())
    train = str(Path(data["path"]) / data["train"])
    loader, _ = create_dataloader(train, 640, a.batch, 32, single_cls=False, hyp=hyp, augment=True,
                                  cache=a.cache or False, rect=False, rank=-1, workers=a.workers, prefix="",
                                  shuffle=True)
    result = {"side": "yolov5", "workers": a.workers, "cache": a.cache}
    if a.workers == 0:
        result["cpu_ms_per_img"] = _cpu_per_image(loader, a.images, a.batch)
    else:
        result["img_s"] = _time_batches(loader, a.batches, a.batch, None)
    Path(a.out).write_text(json.dumps(result))


def _worker_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="loader_vs_yolov5.py worker")
    p.add_argument("--data", required=True)
    p.add_argument("--yolov5", default="")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=24)
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--cache", default="")
    p.add_argument("--hsv", choices=["host", "device"], default="device")
    p.add_argument("--mosaic-buffer", type=int, default=None)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


# ============================================================================ the runner
def _sweep_loader_shm(before: set[str]) -> None:
    """Remove the shared-memory blocks Paddle's loader workers of a finished case left in /dev/shm: a case stops
    iterating mid-epoch and exits, and batches its workers had prefetched stay there (``paddle_<pid>_...``, the
    pid a dead worker's; a live process's blocks are never touched)."""
    for path in set(glob.glob("/dev/shm/paddle_*")) - before:
        try:
            pid = int(Path(path).name.split("_")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            Path(path).unlink(missing_ok=True)
        except (ValueError, IndexError, PermissionError):
            continue


def run_case(side: str, python: str, common: list[str], workers: int, out: Path, cwd: Path) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    worker = f"{side.split('-')[0]}-worker"   # ppmulti-hsv-host runs the ppmulti worker
    cmd = [python, str(Path(__file__).resolve()), worker, *common, "--workers", str(workers),
           "--out", str(out)]
    before = set(glob.glob("/dev/shm/paddle_*"))
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=_run_env())
    _sweep_loader_shm(before)
    if proc.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        return {"side": side, "workers": workers, "error": f"exit {proc.returncode}", "log_tail": tail}
    return json.loads(out.read_text())


SIDES = ("ppmulti", "ppmulti-hsv-host", "yolov5")


def summarise(results: list[dict], workers: list[int]) -> dict:
    table: dict = {}
    for side in SIDES:
        row = {}
        cpu = [r["cpu_ms_per_img"] for r in results if r["side"] == side and "cpu_ms_per_img" in r]
        row["cpu_ms_per_img"] = round(statistics.median(cpu), 2) if cpu else None
        device = [r["device_ms_per_img"] for r in results if r["side"] == side and "device_ms_per_img" in r]
        if device:
            row["device_ms_per_img_on_this_cpu"] = round(statistics.median(device), 2)
        for w in workers:
            rates = [r["img_s"] for r in results if r["side"] == side and r.get("workers") == w and "img_s" in r]
            row[f"img_s_{w}w"] = round(statistics.median(rates), 1) if rates else None
        table[side] = row
    y = table["yolov5"]["cpu_ms_per_img"]
    for side, key in (("ppmulti", "cpu_ratio_ppmulti_over_yolov5"),
                      ("ppmulti-hsv-host", "cpu_ratio_ppmulti_hsv_host_over_yolov5")):
        p = table[side]["cpu_ms_per_img"]
        table[key] = round(p / y, 3) if p and y else None
    return table


def markdown(summary: dict, workers: list[int], meta: dict) -> str:
    head = "| | CPU ms per image, in-process | " + " | ".join(f"img/s, {w} worker{'s' * (w > 1)}"
                                                              for w in workers) + " |"
    lines = [head, "| --- | --- |" + " --- |" * len(workers)]
    for side in SIDES:
        row = summary[side]
        cells = [str(row["cpu_ms_per_img"])] + [str(row[f"img_s_{w}w"]) for w in workers]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"CPU ratio ppmulti / yolov5: {summary['cpu_ratio_ppmulti_over_yolov5']} with the HSV gains "
                 f"on the GPU (0.5 would be half of YOLOv5's), "
                 f"{summary['cpu_ratio_ppmulti_hsv_host_over_yolov5']} with them "
                 f"in the loader (a CPU run); the GPU's share run on this CPU: "
                 f"{summary['ppmulti'].get('device_ms_per_img_on_this_cpu')} ms per image. "
                 f"{meta['images']} JPEGs 640x480 q90 from YOLOv5's data/images photographs; "
                 f"--img 640 --batch {meta['batch']}, hyp.scratch-low, cache: {meta['cache'] or 'none'}, "
                 f"ppmulti's mosaic buffer: {meta['mosaic_buffer']} (0: YOLOv5's draw); "
                 f"medians of {meta['rounds']} alternated rounds; {meta['when']}, {meta['cpus']} CPUs. "
                 f"Command: `{meta.get('command', 'python bench/loader_vs_yolov5.py')}`.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    modes = {"ppmulti-worker": _ppmulti_worker, "yolov5-worker": _yolov5_worker}
    if argv[:1] and argv[0] in modes:
        return modes[argv[0]](argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--yolov5", required=True, help="an ultralytics/yolov5 checkout")
    ap.add_argument("--venv", default=str(DEFAULT_VENV), help="the YOLOv5 venv (bench/vs_yolov5.py makes it)")
    ap.add_argument("--torch", dest="torch_spec", default="torch==2.13.0")
    ap.add_argument("--torchvision", dest="torchvision_spec", default="torchvision==0.28.0")
    ap.add_argument("--data", help="a directory for the images (kept; default: a temp dir, removed)")
    ap.add_argument("--images", type=int, default=128, help="JPEGs to make")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="loader workers per img/s case")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=24, help="timed batches per img/s case")
    ap.add_argument("--cpu-images", type=int, default=64, help="images per in-process CPU case")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of all cases")
    ap.add_argument("--cache", choices=["", "ram"], default="",
                    help="pass --cache ram to both sides (ppmulti's needs its --cache flag)")
    ap.add_argument("--mosaic-buffer", type=int, default=None,
                    help="ppmulti's --mosaic-buffer N: the mosaic's extra tiles from each loader's last N images "
                         "(default: the reader's own, 0: from the whole set, as YOLOv5 loads them)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "loader_vs_yolov5.json"))
    args = ap.parse_args(argv)
    yolov5 = Path(args.yolov5).resolve()
    if not (yolov5 / "utils" / "dataloaders.py").is_file():
        raise SystemExit(f"error: --yolov5 {args.yolov5}: not a YOLOv5 checkout (no utils/dataloaders.py)")
    python = ensure_venv(Path(args.venv), yolov5, args.torch_spec, args.torchvision_spec)
    tmp = Path(tempfile.mkdtemp(prefix="ppmulti_loader_bench_"))
    try:
        data_dir = Path(args.data) if args.data else tmp / "data"
        yaml_path = data_dir / "data.yaml"
        if not yaml_path.is_file():
            make_images(yolov5, data_dir, args.images)
        common = ["--data", str(yaml_path), "--yolov5", str(yolov5), "--batch", str(args.batch),
                  "--batches", str(args.batches), "--images", str(args.cpu_images)]
        if args.cache:
            common += ["--cache", args.cache]
        ppmulti_only = [] if args.mosaic_buffer is None else ["--mosaic-buffer", str(args.mosaic_buffer)]
        results = []
        for r in range(args.rounds):
            for w in [0, *args.workers]:
                for side, py, cwd, extra in (("ppmulti", sys.executable, REPO, ["--hsv", "device", *ppmulti_only]),
                                             ("ppmulti-hsv-host", sys.executable, REPO,
                                              ["--hsv", "host", *ppmulti_only]),
                                             ("yolov5", str(python), yolov5, [])):
                    res = run_case(side, py, common + extra, w, tmp / "runs" / f"{side}_w{w}_r{r}.json", cwd)
                    what = (f"{res['cpu_ms_per_img']:.2f} CPU ms/img" if "cpu_ms_per_img" in res
                            else f"{res['img_s']:.1f} img/s" if "img_s" in res else res.get("error"))
                    print(f"round {r + 1}/{args.rounds} {side:16s} workers {w}: {what}", flush=True)
                    results.append(res)
        meta = {"command": "python bench/loader_vs_yolov5.py " + " ".join(argv),   # each results file: its command
                "images": args.images, "batch": args.batch, "rounds": args.rounds, "cache": args.cache,
                "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "images_from": f"{', '.join(PHOTOS)} of the YOLOv5 checkout, random 640x480 crops, JPEG q90",
                "mosaic_buffer": next((r["mosaic_buffer"] for r in results if "mosaic_buffer" in r), None)}
        summary = summarise(results, args.workers)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "summary": summary, "runs": results}, indent=1) + "\n")
        md = markdown(summary, args.workers, meta)
        out.with_suffix(".md").write_text(md)
        print(md)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
