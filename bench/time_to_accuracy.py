"""Time to accuracy: the training seconds ppmulti and ultralytics/yolov5 each need to reach the other's final mAP50.

What is compared
    The same YOLO-format demo set (256 training and 64 validation images of 256 px, made by ppmulti's generator),
    the same model yaml (``--cfg yolov5n``), hyp file (hyp.scratch-low), image size, global batch, epochs and
    loader workers, on CPU, from scratch (``--weights ''``):
      * yolov5    -- ultralytics/yolov5's real ``train.py`` (``train.main``), one process (YOLOv5 refuses DDP on
                     CPU). ``--noval --save-period 1``: it saves every epoch's EMA weights and validates nothing
                     while it trains; after training (untimed) each ``epoch{k}.pt`` is run through YOLOv5's own
                     ``val.run(..., save_json=True)`` (conf 0.001, IoU 0.6, max_det 300: its defaults).
      * ppmulti/1 -- ``tools/train.py`` with the same YOLOv5 flags, one process; it evaluates its EMA weights after
                     every epoch (conf 0.001, IoU 0.6, 300 boxes: the YOLOv5 config's NMS) and writes results.csv.
      * ppmulti/N -- the same with ``--nproc N`` gloo ranks.
      * ppmulti/N+amp -- the same with ``--amp`` (bf16 convolutions on a CPU with AVX512-BF16 or AMX; YOLOv5 trains
                     in float32 on a CPU, its AMP is for CUDA only). Not among the default cases.
      * ppmulti/N+buffer64 -- the same with ``--mosaic-buffer 64``: each mosaic's 3 extra tiles drawn from its
                     loader's last 64 images instead of from the whole training set (YOLOv5's draw, the default).
                     Not among the default cases.
    ``--cases`` picks them (default ``yolov5,ppmulti/1,ppmulti/2``); ``yolov5`` is always run: it sets the target.
    Scoring: both with pycocotools' COCOeval (bbox, stats[1] = mAP50) against ground truth converted from the same
    YOLO label files (ppmulti's evaluator does this itself; YOLOv5's prediction files are scored here against the
    same conversion, image ids matched by file name). Known difference: YOLOv5's val letterboxes rectangular batches
    (``--rect`` shapes, pad 0.5), ppmulti evaluates square letterboxed images.
    Time: training seconds only -- each tool's own epoch timer (YOLOv5: its on_train_epoch_start/end callbacks;
    ppmulti: results.csv epoch_seconds), summed up to the first epoch whose mAP50 reaches the target. Start-up
    and evaluation are excluded on both sides (``bench/startup.py`` measures start-up).
    Threads: torch takes every core in YOLOv5's process; ppmulti's ranks get cores // ranks each.
    Seeds: ``--seeds 0,1,2`` trains every case once per seed (``--seed`` on both sides). On a set this small one
    run's mAP50 moves by several hundredths from epoch to epoch and between seeds, so the summary compares the
    mean curves: each case's mAP50 and seconds averaged over its seeds, epoch by epoch, and the target is the mean
    of YOLOv5's final mAP50 over its seeds. Every seed's own figures are in the rows as well.

Getting YOLOv5 and its venv: as ``bench/vs_yolov5.py`` (``--yolov5 DIR``, a checkout; the bench's own venv with
torch made on first use, offline settings, the torchvision shim). Run it with a Python whose torch wheel pip can get
(torch==2.13.0 lies on this machine's disk for Python 3.11).

Run:  python bench/time_to_accuracy.py --yolov5 DIR [--cfg yolov5n] [--img 256] [--batch 16] [--epochs 30]
                                       [--cases yolov5,ppmulti/1,ppmulti/2,ppmulti/2+amp,ppmulti/2+buffer64]
                                       [--workers 2] [--seeds 0,1,2]
Writes bench/results/time_to_accuracy.json (--out) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_yolov5 as vs  # noqa: E402  (the bench's shared YOLOv5 venv and offline helpers)

REPO = vs.REPO


# ============================================================================ YOLOv5 side (runs in the venv)
def _worker(argv: list[str]) -> None:
    """Train with YOLOv5's train.main (every epoch's weights saved, per-epoch seconds from its callbacks), then
    write every epoch's predictions with val.run(save_json=True); epochs.json in --out lists both."""
    p = argparse.ArgumentParser(prog="time_to_accuracy.py yolov5-worker")
    for flag in ("--yolov5", "--data", "--cfg", "--out"):
        p.add_argument(flag, required=True)
    for flag in ("--img", "--batch", "--epochs", "--workers", "--seed"):
        p.add_argument(flag, type=int, required=True)
    a = p.parse_args(argv)
    out, yolov5, config = vs._offline_yolov5(a)
    import shutil

    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not (config / "Arial.ttf").exists():
        shutil.copyfile(font, config / "Arial.ttf")
    shim = vs._torchvision_nms_shim()
    sys.path.insert(0, str(yolov5))
    sys.argv = ["train.py", "--data", a.data, "--cfg", a.cfg, "--weights", "", "--hyp",
                str(yolov5 / "data" / "hyps" / vs.HYP), "--img", str(a.img), "--batch-size", str(a.batch),
                "--epochs", str(a.epochs), "--device", "cpu", "--workers", str(a.workers), "--seed", str(a.seed),
                "--noval", "--noplots",
                "--save-period", "1", "--exist-ok", "--project", str(out), "--name", "train"]
    import train as yolov5_train
    import val as yolov5_val
    from utils.callbacks import Callbacks

    epochs: list[dict] = []
    started = [0.0]

    def on_epoch_start(*_args, **_kw):
        started[0] = time.perf_counter()

    def on_epoch_end(*_args, epoch=None, **_kw):
        epochs.append({"epoch": int(epoch) + 1, "seconds": round(time.perf_counter() - started[0], 4)})

    callbacks = Callbacks()
    callbacks.register_action("on_train_epoch_start", "bench", on_epoch_start)
    callbacks.register_action("on_train_epoch_end", "bench", on_epoch_end)
    yolov5_train.main(yolov5_train.parse_opt(known=True), callbacks=callbacks)
    weights = out / "train" / "weights"
    for e in epochs:
        w = weights / f"epoch{e['epoch'] - 1}.pt"
        save_dir = out / "val" / f"epoch{e['epoch']}"
        yolov5_val.run(data=a.data, weights=str(w), batch_size=32, imgsz=a.img, device="cpu", workers=a.workers,
                       save_json=True, project=str(out / "val"), name=f"epoch{e['epoch']}", exist_ok=True,
                       plots=False)
        e["predictions"] = str(save_dir / f"{w.stem}_predictions.json")
    (out / "epochs.json").write_text(json.dumps({"epochs": epochs, "torchvision_shim": shim}, indent=1))


# ============================================================================ ppmulti side
def _ground_truth(data: Path, work: Path) -> tuple[str, dict[str, int]]:
    """The val split's labels as a COCO json (ids by file stem, category = class + 1), as ppmulti's evaluator
    converts them; returns its path and {stem: image id}."""
    from ppmulti.rank.data.yolo import coco_json, load_data_yaml, scan

    spec = load_data_yaml(data / "data.yaml")
    records, _ = scan(spec, "val")
    ids = {}
    for i, rec in enumerate(records):
        stem = Path(rec["im_file"]).stem
        ids[stem] = int(stem) if stem.isnumeric() else i
        rec["im_id"] = [ids[stem]]
    path = work / "val_gt.json"
    path.write_text(json.dumps(coco_json(records, spec.names)))
    return str(path), ids


def _map50(gt_path: str, predictions: str, ids: dict[str, int]) -> float:
    """pycocotools mAP50 of a YOLOv5 predictions file (0-based category ids) against the converted labels."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    dets = json.loads(Path(predictions).read_text()) if Path(predictions).is_file() else []
    for d in dets:
        d["category_id"] = int(d["category_id"]) + 1
        if isinstance(d["image_id"], str):
            d["image_id"] = ids[d["image_id"]]
    if not dets:
        return 0.0
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(gt_path)
        ev = COCOeval(gt, gt.loadRes(dets), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[1])


def run_yolov5(python: Path, yolov5: Path, data: Path, a: argparse.Namespace, seed: int, out: Path,
               gt: tuple) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    vs._run([str(python), str(Path(__file__).resolve()), "yolov5-worker", "--yolov5", str(yolov5),
             "--data", str(data / "data.yaml"), "--cfg", f"{a.cfg}.yaml", "--img", str(a.img),
             "--batch", str(a.batch), "--epochs", str(a.epochs), "--workers", str(a.workers), "--seed", str(seed),
             "--out", str(out)],
            out / "log.txt", env=vs._run_env(), cwd=yolov5)
    info = json.loads((out / "epochs.json").read_text())
    epochs = [{"epoch": e["epoch"], "seconds": e["seconds"], "mAP50": round(_map50(gt[0], e["predictions"], gt[1]), 4)}
              for e in info["epochs"]]
    return {"epochs": epochs, "torchvision_shim": info["torchvision_shim"]}


def run_ppmulti(nproc: int, option: str, data: Path, a: argparse.Namespace, seed: int, out: Path) -> dict:
    from ppmulti.common.metrics import read_results

    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), "--data", str(data / "data.yaml"), "--cfg", a.cfg,
           "--weights", "", "--hyp", str(REPO / "configs" / "hyps" / vs.HYP), "--img", str(a.img), "--epochs",
           str(a.epochs), "--batch", str(a.batch), "--device", "cpu", "--workers", str(a.workers),
           "--seed", str(seed), "--output", str(out / "run")]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    cmd += OPTIONS[option]
    amp = option == "amp"
    threads, env = vs.ppmulti_threads(nproc, auto=False)
    vs._run(cmd, out / "log.txt", env=env)
    cols = read_results(out / "run" / "results.csv")
    epochs = [{"epoch": int(e), "seconds": s, "mAP50": None if math.isnan(m) else round(m, 4)}
              for e, s, m in zip(cols["epoch"], cols["epoch_seconds"], cols["mAP50"])]
    run = {"epochs": epochs, "threads": threads}
    if amp:   # what --amp did on this CPU: bf16 convolutions, or "has no effect here" (then the run is float32)
        log = (out / "run" / "train.log").read_text()
        run["amp"] = next((line.split(" ", 2)[-1] for line in log.splitlines()
                           if "AMP on CPU" in line or "--amp has no effect" in line), "not logged")
    return run


def seconds_to(epochs: list[dict], target: float) -> tuple[float, int] | None:
    """(training seconds, epoch) at the first epoch whose mAP50 reaches ``target``; None if none does."""
    total = 0.0
    for e in epochs:
        total += e["seconds"]
        if e["mAP50"] is not None and e["mAP50"] >= target:
            return round(total, 2), e["epoch"]
    return None


def mean_curve(runs: list[list[dict]]) -> list[dict]:
    """One case's seeds averaged epoch by epoch: mean seconds and mean mAP50 (None where a seed has none)."""
    curve = []
    for epoch_runs in zip(*runs):
        maps = [e["mAP50"] for e in epoch_runs]
        curve.append({"epoch": epoch_runs[0]["epoch"],
                      "seconds": round(sum(e["seconds"] for e in epoch_runs) / len(epoch_runs), 4),
                      "mAP50": None if None in maps else round(sum(maps) / len(maps), 4)})
    return curve


def final_map(epochs: list[dict]) -> float:
    """The last epoch's mAP50 that was measured (0 if none was)."""
    return next((e["mAP50"] for e in reversed(epochs) if e["mAP50"] is not None), 0.0)


def compare(epochs: list[dict], yolov5: list[dict], y_final: float, y_own: tuple | None) -> dict:
    """One curve against YOLOv5's: its final mAP50, its training seconds, its seconds to YOLOv5's final (and the
    ratio to YOLOv5's own), and YOLOv5's seconds to its final."""
    final = final_map(epochs)
    reach = seconds_to(epochs, y_final)
    return {"final_mAP50": final, "train_seconds": round(sum(e["seconds"] for e in epochs), 2),
            "to_yolov5_final": reach,
            "ratio_vs_yolov5": round(reach[0] / y_own[0], 3) if reach and y_own else None,
            "yolov5_to_this_final": seconds_to(yolov5, final)}


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct integer seeds, comma-separated, e.g. 0,1,2")
    return seeds


OPTIONS = {"": [], "amp": ["--amp"], "buffer64": ["--mosaic-buffer", "64"]}   # a case's +OPTION: its train flags


def _cases(text: str) -> list[tuple[str, int, str]]:
    """``yolov5,ppmulti/1,ppmulti/2+amp`` as (side, processes, option), YOLOv5 first whether named or not."""
    cases = [("yolov5", 1, "")]
    for name in (c.strip() for c in text.split(",")):
        if name in ("", "yolov5"):
            continue
        side, _, rest = name.partition("/")
        n, plus, option = rest.partition("+")
        if side != "ppmulti" or not n.isdigit() or int(n) < 1 or (plus and option not in set(OPTIONS) - {""}):
            raise argparse.ArgumentTypeError(f"{name!r} is not a case: give yolov5, ppmulti/N, ppmulti/N+amp or "
                                             f"ppmulti/N+buffer64, e.g. yolov5,ppmulti/1,ppmulti/2,ppmulti/2+amp")
        case = ("ppmulti", int(n), option)
        if case in cases:
            raise argparse.ArgumentTypeError(f"{name!r} is named twice in --cases")
        cases.append(case)
    return cases


def case_key(side: str, n: int, option: str) -> str:
    return f"{side}/{n}" + (f"+{option}" if option else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--yolov5", required=True, help="a YOLOv5 checkout (git clone https://github.com/ultralytics/yolov5)")
    ap.add_argument("--venv", default=str(vs.DEFAULT_VENV), help="the bench's own venv for YOLOv5 (made if missing)")
    ap.add_argument("--torch", dest="torch_spec", default="torch==2.13.0", help="pip spec of torch for the venv")
    ap.add_argument("--torchvision", dest="torchvision_spec", default="torchvision==0.28.0",
                    help="pip spec of torchvision (installed with --no-deps)")
    ap.add_argument("--data", help="YOLO-format demo data dir (generated if missing)")
    ap.add_argument("--cfg", default="yolov5n", help="model: YOLOv5's models/<cfg>.yaml and ppmulti's --cfg <cfg>")
    ap.add_argument("--img", type=int, default=256, help="image size, both sides")
    ap.add_argument("--batch", type=int, default=16, help="global batch, both sides")
    ap.add_argument("--epochs", type=int, default=30, help="epochs per run")
    ap.add_argument("--workers", type=int, default=2, help="loader workers per process, both sides")
    ap.add_argument("--cases", type=_cases, default=_cases("yolov5,ppmulti/1,ppmulti/2"),
                    help="the runs, comma-separated: yolov5 (always run), ppmulti/N (N ranks), ppmulti/N+amp "
                         "(with --amp), ppmulti/N+buffer64 (with --mosaic-buffer 64); "
                         "default yolov5,ppmulti/1,ppmulti/2")
    ap.add_argument("--seeds", type=_seeds, default=[0], help="training seeds, every case once per seed: 0,1,2")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "time_to_accuracy.json"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["yolov5-worker"]:
        return _worker(argv[1:])
    a = parse_args(argv)
    from ppmulti.common.atomic import atomic_write_text
    from ppmulti.common.errors import UserError
    from ppmulti.common.synthdata import exists, generate

    yolov5 = Path(a.yolov5).resolve()
    if not (yolov5 / "train.py").is_file() or not (yolov5 / "models" / f"{a.cfg}.yaml").is_file():
        raise UserError(f"--yolov5 {a.yolov5}: not a YOLOv5 checkout with models/{a.cfg}.yaml; "
                        f"get one with: git clone https://github.com/ultralytics/yolov5 {a.yolov5}")
    python = vs.ensure_venv(Path(a.venv), yolov5, a.torch_spec, a.torchvision_spec)
    with tempfile.TemporaryDirectory(prefix="ppmulti_tta_") as tmp_name:
        tmp = Path(tmp_name)
        data = Path(a.data) if a.data else tmp / "data"
        if not exists(data, "yolo"):
            generate(data, fmt="yolo", n_train=256, n_val=64, size=256)
        gt = _ground_truth(data, tmp)
        runs: dict[str, dict[int, dict]] = {}
        for seed in a.seeds:   # the cases interleaved seed by seed: a drift in the machine's speed touches each alike
            for side, n, option in a.cases:
                t = time.time()
                key = case_key(side, n, option)
                out = tmp / f"{key.replace('/', '').replace('+', '_')}_seed{seed}"
                runs.setdefault(key, {})[seed] = (
                    run_yolov5(python, yolov5, data, a, seed, out, gt) if side == "yolov5"
                    else run_ppmulti(n, option, data, a, seed, out))
                print(f"{key} seed {seed}: {time.time() - t:.0f}s wall", flush=True)
    curves = {key: mean_curve([r["epochs"] for r in by_seed.values()]) for key, by_seed in runs.items()}
    y = curves["yolov5/1"]
    y_final = final_map(y)
    y_own = seconds_to(y, y_final)
    summary = [{"case": key, "seeds": a.seeds, **compare(curve, y, y_final, y_own), "mean_epochs": curve}
               for key, curve in curves.items()]
    rows = []
    for key, by_seed in runs.items():
        for seed, run in by_seed.items():   # each seed against the same target: YOLOv5's mean curve
            rows.append({"case": key, "seed": seed, **compare(run["epochs"], y, y_final, y_own),
                         **{k: v for k, v in run.items() if k != "epochs"}, "epochs": run["epochs"]})
    result = {"what": "training seconds to reach the other tool's final mAP50 (pycocotools), evaluation and "
                      "start-up excluded",
              "conditions": {"cfg": a.cfg, "img": a.img, "global_batch": a.batch, "epochs": a.epochs,
                             "workers": a.workers, "hyp": vs.HYP,
                             "data": "ppmulti demo set, 256 train / 64 val, 256 px",
                             "yolov5_commit": vs._yolov5_commit(yolov5), "date": time.strftime("%Y-%m-%d")},
              "seeds": a.seeds, "yolov5_final_mAP50": y_final, "yolov5_seconds_to_own_final": y_own,
              "summary": summary, "rows": rows,
              "rerun": "python bench/time_to_accuracy.py " + " ".join(vs.portable(argv))}
    atomic_write_text(a.out, json.dumps(result, indent=1) + "\n")
    seeds = ",".join(map(str, a.seeds))
    print(f"\nYOLOv5's final mAP50 {y_final:.3f} (mean over seeds {seeds}), "
          + (f"reached by its mean curve in {y_own[0]:.0f} s (epoch {y_own[1]})\n" if y_own else "\n"))
    print("| case | seed | final mAP50 | train s | s to YOLOv5's final (epoch) | ratio | YOLOv5 s to this final |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in summary + rows:
        reach = f"{r['to_yolov5_final'][0]:.0f} ({r['to_yolov5_final'][1]})" if r["to_yolov5_final"] else "not reached"
        back = f"{r['yolov5_to_this_final'][0]:.0f}" if r["yolov5_to_this_final"] else "not reached"
        ratio = f"{r['ratio_vs_yolov5']:.2f}" if r["ratio_vs_yolov5"] is not None else "-"
        seed = r.get("seed", f"mean of {seeds}")
        print(f"| {r['case']} | {seed} | {r['final_mAP50']:.3f} | {r['train_seconds']:.0f} | {reach} | {ratio} "
              f"| {back} |")
    print(f"written {a.out}")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:   # UserError: one line, exit 2
        if type(exc).__name__ == "UserError":
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
