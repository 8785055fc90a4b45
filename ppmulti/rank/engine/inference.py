"""Using trained weights: evaluate, predict onto PNGs, export a Paddle inference model (NMS in or out)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ppmulti.rank import config as config_mod
from ppmulti.rank import dist
from ppmulti.common.errors import UserError
from ppmulti.common.atomic import atomic_write_text

log = logging.getLogger("ppmulti")


def _weights_path(cfg, weights: str | None) -> str:
    path = weights or cfg.get("weights")
    if not path:
        raise UserError("no weights given: pass --weights RUN_DIR/weights/best.pdparams")
    p = Path(path)
    if p.is_dir() and (p / "weights" / "best.pdparams").is_file():
        return str(p / "weights" / "best.pdparams")
    if not p.is_file() and not Path(str(p) + ".pdparams").is_file():
        run = p.parent
        found = [name for name in ("best", "last") if (run / "weights" / f"{name}.pdparams").is_file()]
        if found:   # PaddleDetection's output/CONFIG/model_final of a run that has ppmulti's weights only
            raise UserError(f"weights file not found: {path}; {run} holds "
                            + " and ".join(f"weights/{n}.pdparams" for n in found)
                            + f" (runs that finish write model_final.pdparams): pass "
                              f"-o weights={run / 'weights' / found[0]}")
        raise UserError(f"weights file not found: {path}")
    return str(p)


def _built(config: str, overrides: list[str], edit: Callable[[Any], None] | None):
    """The config loaded (then ``edit``-ed) and its model built on the right device, with its initial weights."""
    from ppmulti.rank.compat import import_ppdet

    import_ppdet()   # first: a bare ``import ppdet`` prints its numba notice (twice) on the console
    from ppdet.core.workspace import create

    from ppmulti.rank.ppdet_bridge import select_device

    dist.init()
    cfg = config_mod.load(config, overrides)
    if edit is not None:
        edit(cfg)
    select_device(cfg)
    return cfg, create(cfg.architecture)


def save_initial_weights(config: str, overrides: list[str], dst: Path,
                         edit: Callable[[Any], None] | None = None) -> None:
    """The config's model as built, before any training (its layers' initialisers), saved as ``dst``: what
    ultralytics exports for a model yaml (`yolo export model=yolo11n.yaml`)."""
    import paddle

    _, model = _built(config, overrides, edit)
    paddle.save(model.state_dict(), str(dst))


def build_model(config: str, overrides: list[str], weights: str | None, edit: Callable[[Any], None] | None = None):
    """Load the config (then ``edit`` it, when given), build its model on the right device and load weights
    (shapes checked)."""
    from ppmulti.rank.engine.checkpoint import load_weights

    cfg, model = _built(config, overrides, edit)
    model.load_meanstd(cfg["TestReader"]["sample_transforms"])
    path = _weights_path(cfg, weights)
    missing, unexpected = load_weights(model, path)
    if missing:
        log.warning("%s: %d model parameters missing from the file", path, len(missing))
    model.eval()
    return cfg, model


@dataclass(frozen=True)
class ValOutputs:
    """YOLOv5 val.py's results directory (PROJECT/NAME, numbered unless ``exist_ok``): results.json always,
    labels/<stem>.txt with ``save_txt``, the detections as COCO json in ``predictions`` when named."""

    project: Path
    name: str = "exp"
    exist_ok: bool = False
    save_txt: bool = False
    save_conf: bool = False
    predictions: str | None = None
    plots: bool = True   # confusion_matrix.png, PR/F1/P/R_curve.png (off: --noplots)


def evaluate(config: str, overrides: list[str], weights: str | None, save_json: str | None = None,
             edit: Callable[[Any], None] | None = None, outputs: ValOutputs | None = None,
             verbose: bool = False) -> dict:
    """The bbox mAP (the config's metric: COCO or VOC) of the weights on the config's EvalDataset (sharded across
    ranks when launched); ``edit`` changes the loaded config first (tools/eval.py's YOLOv5 val.py flags);
    ``outputs``: what rank 0 writes into a results directory (its path in the result as ``save_dir``)."""
    from ppmulti.rank.engine.evaluator import make_evaluator

    cfg, model = build_model(config, overrides, weights, edit)
    from ppmulti.rank.data import coco, voc

    coco.swap_in(cfg)   # the data checked at the scan as training checks it: one line for a broken file, bad
    voc.swap_in(cfg)    # images skipped and named, the ground truth scored as the scan cleaned it
    if not cfg.get("use_gpu", False):   # training's kernels (ppmulti's oneDNN convolution and SiLU), so that its own
        from ppmulti.rank.ops.cpu import setup_cpu_ops   # evaluation is reproduced on any CPU, not within rounding

        setup_cpu_ops(model)
    config_mod.check_dataset(cfg, "EvalDataset")
    evaluator = make_evaluator(cfg, worker_num=cfg.get("worker_num", 0))
    # YOLOv5 val.py's table: every class's row under 50 classes or with --verbose, else the 'all' row
    evaluator.table = "classes" if verbose or len(evaluator.catid2clsid) < 50 else "all"
    evaluator.keep_batches = 3 if outputs is not None and outputs.plots else 0   # val_batch0-2_*.jpg
    try:
        result = evaluator.evaluate(model).as_dict()
    finally:
        evaluator.close()
    if save_json and dist.is_main():
        atomic_write_text(save_json, json.dumps(result, indent=2) + "\n")
    if outputs is not None and dist.is_main():
        result["save_dir"] = str(write_val_outputs(evaluator, result, outputs))
    return result


def write_val_outputs(evaluator, result: dict, outputs: ValOutputs) -> Path:
    """The results directory of one evaluation (see ``ValOutputs``); returns its path."""
    from ppmulti.common.rundir import new_run_dir
    from ppmulti.rank.engine.labels import clip_boxes, label_lines

    save_dir = new_run_dir(outputs.project, outputs.name, outputs.exist_ok)
    atomic_write_text(save_dir / "results.json", json.dumps(result, indent=2) + "\n")
    keys = ("image_id", "category_id", "bbox", "score")   # pycocotools' loadRes added more to each in place
    detections = [{k: d[k] for k in keys} for d in evaluator.last_detections]
    if outputs.predictions:
        atomic_write_text(save_dir / outputs.predictions, json.dumps(detections) + "\n")
    if outputs.plots and evaluator.last_diagnostics is not None:
        from ppmulti.rank.engine.plots import PR_PNG, plot_diagnostics, plot_pr

        if evaluator.last_pr is not None:
            plot_pr(evaluator.last_pr, save_dir / PR_PNG)
        plot_diagnostics(evaluator.last_diagnostics, save_dir)
        from ppmulti.rank.engine.pictures import draw_val_batches

        draw_val_batches(evaluator.last_val_batches, evaluator.last_diagnostics.names, save_dir)
    if outputs.save_txt:
        import numpy as np

        labels = save_dir / "labels"
        labels.mkdir(exist_ok=True)
        images = {int(np.asarray(r["im_id"]).reshape(-1)[0]): r for r in evaluator.dataset.roidbs}
        by_image: dict[int, list[dict]] = {}
        for det in detections:
            by_image.setdefault(int(det["image_id"]), []).append(det)
        catid2clsid = evaluator.catid2clsid
        for im_id, dets in by_image.items():
            record = images[im_id]
            rows = np.asarray([[d["bbox"][0], d["bbox"][1], d["bbox"][0] + d["bbox"][2], d["bbox"][1] + d["bbox"][3],
                                d["score"], catid2clsid[d["category_id"]]]
                               for d in sorted(dets, key=lambda d: -d["score"])], dtype=np.float64)
            width, height = float(record["w"]), float(record["h"])
            lines = label_lines(clip_boxes(rows, width, height), width, height, outputs.save_conf)
            (labels / f"{Path(record['im_file']).stem}.txt").write_text("\n".join(lines) + "\n")
    return save_dir


def _collect_images(image: str | None, image_dir: str | None) -> list[str]:
    from ppmulti.common.paths import IMAGE_SUFFIXES

    images: list[str] = []
    if image:
        if not Path(image).is_file():
            raise UserError(f"image not found: {image}")
        images.append(image)
    if image_dir:
        d = Path(image_dir)
        if not d.is_dir():
            raise UserError(f"image directory not found: {image_dir}")
        images.extend(str(p) for p in sorted(d.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise UserError(f"no images ({'/'.join(IMAGE_SUFFIXES)}) in {image_dir}")
    if not images:
        raise UserError("nothing to predict: pass --infer_img FILE or --infer_dir DIR")
    return images


def predict(config: str, overrides: list[str], weights: str | None, image: str | None,
            image_dir: str | None, output_dir: str, threshold: float = 0.5) -> list[Path]:
    """Detect objects in images; write each with its boxes drawn as a PNG, plus detections.json."""
    from PIL import Image

    from ppmulti.rank.compat import import_ppdet

    import_ppdet()   # before ppdet's own imports below: its numba notice stays off the console
    from ppdet.core.workspace import create
    from ppdet.data.source.category import get_categories
    from ppdet.metrics.coco_utils import get_infer_results
    import paddle

    images = _collect_images(image, image_dir)
    cfg, model = build_model(config, overrides, weights)
    dataset = create("TestDataset")()
    dataset.set_images(images)
    loader = create("TestReader")(dataset, 0)
    imid2path = dataset.get_imid2path()
    anno = dataset.get_anno()
    clsid2catid, catid2name = get_categories(cfg.metric, anno_file=anno if anno and Path(anno).is_file() else None)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_image: dict[int, list[dict]] = {}
    with paddle.no_grad():
        for data in loader:
            outs = model(data)
            res = get_infer_results({"bbox": outs["bbox"].numpy(), "bbox_num": outs["bbox_num"].numpy(),
                                     "im_id": data["im_id"].numpy()}, clsid2catid)
            for im_id in data["im_id"].numpy().reshape(-1):
                by_image.setdefault(int(im_id), [])
            for det in res.get("bbox", []):
                by_image[int(det["image_id"])].append(det)
    written: list[Path] = []
    records = []
    for im_id, dets in sorted(by_image.items()):
        src = Path(imid2path[im_id])
        img = Image.open(src).convert("RGB")
        kept = [d for d in dets if d["score"] >= threshold]
        draw_boxes(img, kept, catid2name)
        dst = out / (src.stem + ".png")
        img.save(dst, format="PNG")
        written.append(dst)
        records.append({"image": str(src), "output": str(dst), "detections": [
            {"category": catid2name.get(d["category_id"], str(d["category_id"])), "score": round(float(d["score"]), 4),
             "bbox_xywh": [round(float(v), 2) for v in d["bbox"]]} for d in kept]})
        log.info("%s: %d objects >= %.2f -> %s", src.name, len(kept), threshold, dst)
    atomic_write_text(out / "detections.json", json.dumps(records, indent=2) + "\n")
    return written


PALETTE = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240),
           (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128)]


def draw_boxes(img, detections: list[dict], catid2name: dict) -> None:
    """Draw COCO-style detections (bbox x,y,w,h) with class name and score onto a PIL image.

    Written here because ppdet 2.6.0's visualizer calls ``ImageDraw.textsize``, which Pillow 10 removed.
    """
    from PIL import ImageDraw

    draw = ImageDraw.Draw(img)
    for det in detections:
        x, y, w, h = det["bbox"]
        # a box the model turned inside out, or far outside the image (an untrained head): drawn within the image
        x1, x2 = sorted((min(max(x, 0), img.width), min(max(x + w, 0), img.width)))
        y1, y2 = sorted((min(max(y, 0), img.height), min(max(y + h, 0), img.height)))
        x, y, w, h = x1, y1, x2 - x1, y2 - y1
        color = PALETTE[int(det["category_id"]) % len(PALETTE)]
        draw.rectangle([x, y, x + w, y + h], outline=color, width=2)
        label = f"{catid2name.get(det['category_id'], det['category_id'])} {det['score']:.2f}"
        left, top, right, bottom = draw.textbbox((x, y), label)
        th = bottom - top
        draw.rectangle([x, max(0, y - th - 2), x + (right - left) + 4, max(th + 2, y)], fill=color)
        draw.text((x + 2, max(0, y - th - 2)), label, fill=(255, 255, 255))


def leave_nms_out(model) -> None:
    """Make the model's head return decoded boxes and scores without NMS: boxes [B, N, 4] (x1, y1, x2, y2 in
    original-image pixels) and scores [B, C, N] (ppdet's ``exclude_nms``, honoured by PP-YOLOE's and ppmulti's
    YOLOv5 head)."""
    # include_self: UltraYOLO (YOLOv8/11) holds its NMS itself
    heads = [layer for layer in model.sublayers(include_self=True) if hasattr(layer, "exclude_nms")]
    if not heads:
        raise UserError(f"--no-nms: {type(model).__name__}'s head cannot leave NMS out (no exclude_nms); "
                        f"export with NMS in the graph")
    for head in heads:
        head.exclude_nms = True


def export_model(cfg, model, output_dir: str) -> Path:
    """ppdet's exporter on a built model: the program (``model.pdmodel`` on Paddle 2.6, ``model.json`` on
    Paddle 3: ``compat.exported_program_name()``), ``model.pdiparams`` and ``infer_cfg.yml`` in
    ``output_dir/<config name>``, which is returned. On Paddle 3 also ``model.pdmodel`` where Paddle can still
    write it (``write_legacy_program``), so that PaddleDetection release/2.6's deploy/python/infer.py finds it."""
    import copy

    from ppmulti.rank.compat import exported_program_name, paddle3, writes_legacy_program

    tried = paddle3() and writes_legacy_program(cfg)
    legacy = copy.deepcopy(model) if tried else None   # to_static converts the layer it is given in place
    dst = Path(output_dir) / cfg["filename"]
    existed = dst.exists()
    try:
        dst = _ppdet_export(cfg, model, output_dir)
    except Exception as exc:   # noqa: BLE001 - to_static's errors come in Paddle's own types
        from ppmulti.rank.compat import export_refusal

        why = export_refusal(str(cfg.get("architecture")), exc)
        if why is None:
            raise
        if not existed:   # ppdet writes infer_cfg.yml before to_static fails: no half-written model left behind
            import shutil

            shutil.rmtree(dst, ignore_errors=True)
        raise UserError(f"{cfg.get('architecture')} ({cfg['filename']}) cannot be exported on Paddle "
                        f"{_paddle_version()}: {why}") from None
    for name in (exported_program_name(), "model.pdiparams"):
        if not (dst / name).is_file():
            raise RuntimeError(f"export finished but {dst / name} is missing")
    if legacy is not None:
        write_legacy_program(cfg, legacy, dst)
    elif paddle3():
        log.info("model.pdmodel not written: Paddle %s writes %s (%s) only as model.json, which serves Paddle "
                 "Inference 3 and PaddleDetection develop's deploy, not release/2.6's (it looks for model.pdmodel)",
                 _paddle_version(), cfg.get("architecture"), cfg["filename"])
    return dst


def _ppdet_export(cfg, model, output_dir: str | Path, program_guard: Any = None) -> Path:
    """ppdet's Trainer.export; ``program_guard`` (a context) is entered around the export only: the Trainer is
    built outside it, in dygraph (under Paddle 3's OldIrGuard the ModelEMA that ppdet's Trainer builds for
    ``use_ema`` configs fails: ``paddle.zeros_like`` refuses its eager tensors)."""
    import contextlib

    from ppdet.engine import Trainer

    from ppmulti.rank.compat import full_graph_to_static

    cfg["model"] = model  # ppdet's Trainer takes a ready model from the config
    # ppdet's Trainer opens a VisualDL writer in the working directory (vdl_log_dir/scalar) when use_vdl is on,
    # as ppmulti's runtime.yml has it for training's own log; an export logs nothing
    cfg["use_vdl"] = False
    # the weights are in the model already: the ModelEMA ppdet's Trainer builds for use_ema has no part in an
    # export, and ppdet 2.6.0 builds it wrong for a frozen weight with ema_filter_no_grad (compat.model_ema, F14):
    # release/2.7's RT-DETR configs but R18-vd's stopped here with `'set' object has no attribute 'append'`
    cfg["use_ema"] = False
    trainer = Trainer(cfg, mode="test")
    with full_graph_to_static(), (program_guard or contextlib.nullcontext()):
        trainer.export(str(output_dir))
    return Path(output_dir) / cfg["filename"]   # ppdet keeps the config file's stem here


def write_legacy_program(cfg, model, dst: Path) -> bool:
    """Paddle 3: the same model exported once more as Paddle's old program, ``model.pdmodel`` beside ``model.json``
    in ``dst`` (they share ``model.pdiparams``, which must come out byte for byte the same), for the deploy code
    written for Paddle 2 (PaddleDetection release/2.6's deploy/python/infer.py looks for model.pdmodel only).
    A model Paddle cannot write that way (compat.legacy_program_guard) gets one WARNING line; returns whether
    model.pdmodel was written."""
    import copy
    import filecmp
    import shutil
    import tempfile

    from ppmulti.rank.compat import LEGACY_PROGRAM, legacy_program_guard

    with tempfile.TemporaryDirectory(prefix="ppmulti-legacy-") as tmp:
        try:
            out = _ppdet_export(copy.copy(cfg), model, tmp, legacy_program_guard())   # its own model key
        except Exception as exc:  # noqa: BLE001 - Paddle's converter raises anything; the PIR export stands
            log.warning("model.pdmodel not written: Paddle %s cannot export %s as its old program (%s); model.json "
                        "serves Paddle Inference 3 and PaddleDetection develop's deploy, not release/2.6's",
                        _paddle_version(), cfg.get("architecture"), _last_line(exc)[:200])
            return False
        if not filecmp.cmp(out / "model.pdiparams", dst / "model.pdiparams", shallow=False):
            log.warning("model.pdmodel not written: the old program's parameters differ from model.json's")
            return False
        shutil.copyfile(out / LEGACY_PROGRAM, dst / LEGACY_PROGRAM)
    return True


def _last_line(exc: BaseException) -> str:
    """The line of a converter error that names the cause (its first is "In transformed code:")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.strip().startswith("[")]
    return lines[-1] if lines else type(exc).__name__


def _paddle_version() -> str:
    import paddle

    return paddle.__version__


def export(config: str, overrides: list[str], weights: str | None, output_dir: str, nms: bool = True,
           edit: Callable[[Any], None] | None = None) -> Path:
    """Write a Paddle inference model with ppdet's exporter (see ``export_model``); ``nms=False`` leaves NMS
    out of the graph (``leave_nms_out``); ``edit`` changes the loaded config first."""
    cfg, model = build_model(config, overrides, weights, edit)
    if not nms:
        leave_nms_out(model)
    return export_model(cfg, model, output_dir)
