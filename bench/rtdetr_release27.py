"""RT-DETR trained by PaddleDetection release/2.7's own trainer, evaluated by its own eval and by ppmulti's.

    python bench/rtdetr_release27.py --checkout PD27 --pd27-python PD27_VENV/bin/python \\
        [--ppmulti-python VENV_A/bin/python VENV_B/bin/python] [--out bench/results] [--keep WORK]

``PD27`` is a PaddleDetection release/2.7 tree (``git archive release/2.7``); ``PD27_VENV`` a Python 3.10 venv with
paddlepaddle 2.6.2 and the checkout's requirements (its ppdet is the checkout's own: its tools/ put the checkout
first on sys.path). In a work directory laid out as a checkout (the checkout's configs/runtime.yml and
configs/datasets/coco_detection.yml, bench/configs/rtdetr_release27's shrunk R18-vd config, a generated 3-class COCO
set at dataset/coco), release/2.7's tools/train.py trains the config on the CPU, release/2.7's tools/eval.py
evaluates output/<config>/model_final, and ppmulti's tools/eval.py evaluates the same weights with each
``--ppmulti-python`` (a ppmulti venv each: Paddle 3.3.1, 2.6.2). Besides the mAPs each prints (PaddleDetection's
to 3 decimals), the detections each writes (PaddleDetection's bbox.json, ppmulti's --save-json) are scored by one
pycocotools call, unrounded, and compared box by box. Writes rtdetr_release27.json into
``--out``; the table goes to stdout. Not a timing bench: run it whenever.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ppmulti.common.atomic import atomic_write_text

COMMAND = ("python bench/rtdetr_release27.py --checkout PD27 --pd27-python PD27_VENV/bin/python "
           "--ppmulti-python VENV_A/bin/python VENV_B/bin/python")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "bench" / "configs" / "rtdetr_release27"
CONFIG = "configs/rtdetr/rtdetr_r18vd_small_coco.yml"
WEIGHTS = "output/model_final"   # release/2.7 saves into save_dir itself
# pycocotools' summary lines as PaddleDetection's eval prints them
COCO_LINE = re.compile(r"Average Precision\s+\(AP\) @\[ IoU=(?P<iou>0\.50:0\.95|0\.50) +\| area=\s*all \| "
                       r"maxDets=100 \] = (?P<value>-?[0-9.]+)")


def prepare(checkout: Path, work: Path, n_train: int, n_val: int, size: int, seed: int) -> None:
    """``work`` as a checkout holding the shrunk config and a generated COCO set at dataset/coco."""
    sys.path.insert(0, str(REPO))
    from ppmulti.common.synthdata import generate

    for rel in ("configs/runtime.yml", "configs/datasets/coco_detection.yml"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(checkout / rel, work / rel)
    shutil.copytree(CONFIGS / "configs" / "rtdetr", work / "configs" / "rtdetr", dirs_exist_ok=True)
    demo = work / "demo"
    generate(demo, fmt="coco", n_train=n_train, n_val=n_val, size=size, seed=seed)
    coco = work / "dataset" / "coco"
    (coco / "annotations").mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        (demo / "images" / split).rename(coco / f"{split}2017")
        (demo / "annotations" / f"instances_{split}.json").rename(coco / "annotations" / f"instances_{split}2017.json")
    shutil.rmtree(demo)


def run(cmd: list[str], cwd: Path, log: Path, env: dict | None = None) -> str:
    """Run ``cmd``, its output also to ``log``; the output, or exit naming the log when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    log.write_text(out)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}); its output: {log}\n{out[-3000:]}")
    return out


def ppdet_map(out: str) -> dict:
    """mAP50-95 and mAP50 from pycocotools' summary in PaddleDetection's eval output (3 decimals)."""
    found = {m["iou"]: float(m["value"]) for m in COCO_LINE.finditer(out)}
    return {"mAP50_95": found["0.50:0.95"], "mAP50": found["0.50"]}


def python_env(python: str) -> dict:
    """The environment for a venv's python: its bin first on PATH (ppmulti starts its own subprocesses)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    return env


def version(python: str, module: str) -> str:
    proc = subprocess.run([python, "-c", f"import {module}; print({module}.__version__)"], capture_output=True,
                          text=True, env=python_env(python))
    return proc.stdout.strip() or "?"


def detections(path: Path) -> dict:
    """COCO detections keyed by (image, class) -> sorted (score, box) rows."""
    rows: dict = {}
    for d in json.loads(path.read_text()):
        rows.setdefault((d["image_id"], d["category_id"]), []).append((d["score"], *d["bbox"]))
    return {k: sorted(v, reverse=True) for k, v in rows.items()}


def coco_map(annotations: Path, dets: Path) -> dict:
    """pycocotools' bbox mAP50-95 and mAP50 of a detection file, unrounded (both evaluators' files, one way)."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(annotations))
        ev = COCOeval(gt, gt.loadRes(str(dets)), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {"mAP50_95": float(ev.stats[0]), "mAP50": float(ev.stats[1])}


def compare(a: Path, b: Path) -> dict:
    """How far two detection files are apart: counts, and the largest score and box differences of the rows
    paired by rank within each (image, class)."""
    da, db = detections(a), detections(b)
    score = box = 0.0
    for key in set(da) & set(db):
        for ra, rb in zip(da[key], db[key]):
            score = max(score, abs(ra[0] - rb[0]))
            box = max(box, max(abs(x - y) for x, y in zip(ra[1:], rb[1:])))
    return {"detections": [sum(map(len, da.values())), sum(map(len, db.values()))],
            "same_keys": set(da) == set(db), "max_score_diff": score, "max_box_diff_px": box}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", type=Path, required=True, help="a PaddleDetection release/2.7 tree")
    p.add_argument("--pd27-python", required=True, help="Python of a Paddle 2.6.2 venv for the checkout")
    p.add_argument("--ppmulti-python", nargs="+", default=[sys.executable], help="Python of each ppmulti venv")
    p.add_argument("--train", type=int, default=64, help="training images")
    p.add_argument("--val", type=int, default=32, help="validation images")
    p.add_argument("--size", type=int, default=128, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--keep", type=Path, help="work here and keep it; weights trained there before are evaluated "
                   "again, not retrained (default: a temporary directory, removed)")
    args = p.parse_args(argv)
    checkout = args.checkout.resolve()
    if not (checkout / "tools" / "train.py").is_file() or not (checkout / "ppdet").is_dir():
        sys.exit(f"--checkout {checkout}: not a PaddleDetection tree (no tools/train.py, ppdet/)")
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="rtdetr_release27_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if not (work / "dataset" / "coco").is_dir():
            prepare(checkout, work, args.train, args.val, args.size, args.seed)
        pd_env = python_env(args.pd27_python)
        opts = ["-o", "use_gpu=false"]
        if not (work / f"{WEIGHTS}.pdparams").is_file():     # a --keep directory keeps its trained weights
            run([args.pd27_python, str(checkout / "tools" / "train.py"), "-c", CONFIG, *opts], work,
                work / "pd27_train.log", pd_env)
        out = run([args.pd27_python, str(checkout / "tools" / "eval.py"), "-c", CONFIG, *opts, f"weights={WEIGHTS}"],
                  work, work / "pd27_eval.log", pd_env)
        shutil.copyfile(work / "bbox.json", work / "pd27_bbox.json")
        annotations = work / "dataset" / "coco" / "annotations" / "instances_val2017.json"
        rows = [{"evaluator": "PaddleDetection release/2.7 tools/eval.py",
                 "paddle": version(args.pd27_python, "paddle"), **ppdet_map(out),
                 "pycocotools_on_its_detections": coco_map(annotations, work / "pd27_bbox.json")}]
        for i, python in enumerate(args.ppmulti_python):
            pred = work / f"ppmulti{i}_metrics.json"
            out = run([python, str(REPO / "tools" / "eval.py"), "-c", CONFIG, *opts, f"weights={WEIGHTS}",
                       "--save-json", "--project", str(work / "val"), "--name", f"ppmulti{i}", "--exist_ok"],
                      work, work / f"ppmulti{i}_eval.log", python_env(python))
            try:
                summary = json.loads([ln for ln in out.strip().splitlines() if ln.startswith("{")][-1])
            except (IndexError, json.JSONDecodeError):
                sys.exit(f"ppmulti's eval printed no summary line; its output: {work / f'ppmulti{i}_eval.log'}")
            pred.write_text(json.dumps(summary))
            found = sorted((work / "val" / f"ppmulti{i}").glob("*_predictions.json"))
            row = {"evaluator": "ppmulti tools/eval.py", "paddle": version(python, "paddle"),
                   "mAP50_95": summary["mAP50_95"], "mAP50": summary["mAP50"]}
            if found:
                row["pycocotools_on_its_detections"] = coco_map(annotations, found[-1])
                row["vs_release27_detections"] = compare(work / "pd27_bbox.json", found[-1])
            rows.append(row)
        result = {"command": COMMAND,
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "config": CONFIG, "train_images": args.train, "val_images": args.val, "size": args.size,
                  "seed": args.seed, "rows": rows}
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "rtdetr_release27.json", json.dumps(result, indent=1) + "\n")
        print("| evaluator | Paddle | mAP50-95 | mAP50 | pycocotools on its detections (mAP50-95, mAP50) |\n"
              "| --- | --- | --- | --- | --- |")
        for r in rows:
            own = r.get("pycocotools_on_its_detections", {})
            both = f"{own['mAP50_95']:.6f}, {own['mAP50']:.6f}" if own else ""
            print(f"| {r['evaluator']} | {r['paddle']} | {r['mAP50_95']:.4f} | {r['mAP50']:.4f} | {both} |")
        print(json.dumps(result))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
