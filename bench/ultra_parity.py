"""mAP of one ultralytics-trained best.pt as ultralytics' own val and ppmulti's `ppmulti yolo val` give it.

What is measured
    The demo data set (ppmulti.common.synthdata, seed 0: 256 train / 64 val images of 256 x 256, 3 classes, YOLO
    layout with data.yaml) is written to WORK/demo. For each model yaml (yolo11n.yaml, yolov8n.yaml, yolo26n.yaml)
    ultralytics trains from scratch on it on the CPU (``yolo detect train ... pretrained=False seed=0``) unless
    WORK/runs/<model>/weights/best.pt exists. That one best.pt is then validated on the val split at the same
    imgsz and batch by
      * ultralytics: ``YOLO(best.pt).val(data=..., imgsz=..., batch=..., device="cpu")``, what ``yolo val``
        runs (its defaults: rect batches, conf 0.001, iou 0.7, max_det 300; for YOLO26 its nms=None, which
        reads the one-to-many head through NMS), and with rect=False;
      * ppmulti: ``ppmulti yolo val model=best.pt data=... imgsz=... batch=...`` (rect and nms=None by default, as
        ultralytics' val) and with rect=False (a square top-left letterbox);
      * YOLO26 also end to end (``nms=False``: the one-to-one head, top-k without NMS) both sides.
    ppmulti's mAP is pycocotools' (COCOeval); ultralytics' is its own AP (101-point, trapezoid); ppmulti prints
    the same detections scored ultralytics'/YOLOv5's way in its table's "all" row, recorded here too.

Usage (an ultralytics venv of your own; never a ppmulti dependency)
    python -m venv /path/ultra && /path/ultra/bin/pip install ultralytics torch
    python bench/ultra_parity.py --ultra-python /path/ultra/bin/python --work /tmp/parity
    (writes WORK/ultra_parity.json; bench/results/ultra_parity.md holds a run's table)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ULTRA_VAL = """
import json, sys
from ultralytics import YOLO
kw = json.loads(sys.argv[2])
m = YOLO(sys.argv[1]).val(device="cpu", plots=False, verbose=False, **kw)
print("PARITY " + json.dumps({"mAP50": float(m.box.map50), "mAP50_95": float(m.box.map)}))
"""
ALL_ROW = re.compile(r"^\s*all\s+\d+\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", re.M)


def run(cmd: list[str], log: Path, env: dict | None = None) -> str:
    """Run ``cmd`` (niced) with its output into ``log``; the output, or SystemExit naming the log on failure."""
    t = time.time()
    proc = subprocess.run(["nice", "-n", "5", *cmd], capture_output=True, text=True, env=env)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}; see {log}")
    shown = " ".join("SCRIPT" if "\n" in c else c for c in cmd)
    print(f"  {time.time() - t:5.0f} s  {shown[:150]}", flush=True)
    return proc.stdout + proc.stderr


def ultra_val(py: str, weights: Path, data: Path, imgsz: int, batch: int, log: Path, **extra) -> dict:
    kw = {"data": str(data), "imgsz": imgsz, "batch": batch, "project": str(log.parent / "uval"), **extra}
    out = run([py, "-c", ULTRA_VAL, str(weights), json.dumps(kw)], log)
    return json.loads(out.rsplit("PARITY ", 1)[1].splitlines()[0])


def pp_val(cmd: list[str], log: Path) -> dict:
    """ppmulti's result line (pycocotools) and its table's "all" row (ultralytics'/YOLOv5's AP)."""
    out = run(cmd, log, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    row = ALL_ROW.findall(out)
    table = {"mAP50": float(row[-1][2]), "mAP50_95": float(row[-1][3])} if row else {}
    return {"mAP50": result["mAP50"], "mAP50_95": result["mAP50_95"], "table": table}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ultra-python", required=True, help="python of a venv with ultralytics and torch")
    p.add_argument("--work", default="/tmp/ultra_parity", help="data, runs and logs go here")
    p.add_argument("--models", nargs="+", default=["yolo11n.yaml", "yolov8n.yaml", "yolo26n.yaml"])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args(argv)

    from ppmulti.common.synthdata import exists, generate

    work = Path(args.work).resolve()
    data_dir = work / "demo"
    if not exists(data_dir, fmt="yolo"):
        generate(data_dir, fmt="yolo")
    data = data_dir / "data.yaml"
    yolo = str(Path(args.ultra_python).parent / "yolo")
    ppmulti = [str(Path(sys.executable).parent / "ppmulti")]
    common = [f"data={data}", f"imgsz={args.imgsz}", f"batch={args.batch}"]
    rows = []
    for model in args.models:
        name = Path(model).stem
        logs = work / "logs" / name
        logs.mkdir(parents=True, exist_ok=True)
        best = work / "runs" / name / "weights" / "best.pt"
        print(f"{name}:", flush=True)
        if not best.is_file():
            run([yolo, "detect", "train", f"model={model}", *common, f"epochs={args.epochs}", "workers=1",
                 "device=cpu", "seed=0", "pretrained=False", "amp=False", "plots=False",
                 f"project={work / 'runs'}", f"name={name}", "exist_ok=True"], logs / "train.log")
        row = {"model": name, "weights": str(best),
               "ultra": ultra_val(args.ultra_python, best, data, args.imgsz, args.batch, logs / "ultra.log"),
               "ultra_norect": ultra_val(args.ultra_python, best, data, args.imgsz, args.batch,
                                         logs / "ultra_norect.log", rect=False)}
        pp = [*ppmulti, "yolo", "val", f"model={best}", *common, f"project={work / 'ppval'}", f"name={name}",
              "exist_ok=True"]
        row["ppmulti"] = pp_val(pp, logs / "ppmulti.log")
        row["ppmulti_norect"] = pp_val([*pp, "rect=False"], logs / "ppmulti_norect.log")
        if "26" in name:   # the one-to-one head (NMS-free) both sides: nms=False
            row["ultra_e2e"] = ultra_val(args.ultra_python, best, data, args.imgsz, args.batch,
                                         logs / "ultra_e2e.log", nms=False)
            row["ppmulti_e2e"] = pp_val([*pp, "nms=False"], logs / "ppmulti_e2e.log")
        rows.append(row)
        print(json.dumps(row), flush=True)
    (work / "ultra_parity.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"written {work / 'ultra_parity.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
