"""Distributed evaluation: each rank predicts its shard, rank 0 scores all of it once with the config's metric
(COCO: pycocotools; VOC: ppdet's DetectionMAP), as the config asks prints the per-category AP table, writes bbox.json
or only writes it, and computes YOLOv5's diagnostics of the same detections (engine.diagnostics: P, R, the
per-class table, the confusion matrix)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ppmulti.rank import dist
from ppmulti.rank.data.feed import Passes

log = logging.getLogger("ppmulti")
PREDICTIONS = "bbox.json"   # PaddleDetection's name for the detections in COCO form


@dataclass
class EvalResult:
    mAP50: float
    mAP50_95: float
    images: int
    seconds: float
    per_rank_images_per_s: list[float] = field(default_factory=list)
    summary: str = ""
    class_maps: list[float] | None = None   # mAP50-95 per class id (YOLOv5's maps; --image-weights reads it)
    class_ap: dict[str, float] | None = None   # classwise: AP (IoU 0.50:0.95) per category name
    predictions: str | None = None             # where bbox.json was written (output_eval, save_prediction_only)
    precision: float | None = None   # YOLOv5's P and R: the means over classes at the max-mean-F1 confidence
    recall: float | None = None
    val_losses: dict[str, float] | None = None   # the val split's losses (engine.val_loss: YOLOv5's, ultralytics')
    metric: str = "COCO"   # what computed mAP50 (the config's metric: COCO's pycocotools or VOC's DetectionMAP)

    def as_dict(self) -> dict:
        out = {"mAP50": self.mAP50, "mAP50_95": self.mAP50_95, "metric": self.metric, "images": self.images,
               "seconds": round(self.seconds, 3),
               "per_rank_images_per_s": [round(v, 3) for v in self.per_rank_images_per_s]}
        if self.precision is not None:
            out["precision"], out["recall"] = round(self.precision, 5), round(self.recall, 5)
        if self.val_losses is not None:
            out["val_losses"] = {k: round(v, 6) for k, v in self.val_losses.items()}
        if self.class_ap is not None:
            out["class_AP"] = {k: (None if math.isnan(v) else round(v, 4)) for k, v in self.class_ap.items()}
        if self.predictions is not None:
            out["predictions"] = self.predictions
        return out


def shard_indices(n: int, rank: int, world: int, batch: int = 0) -> list[int]:
    """This rank's image indices: rank, rank+world, ... — no padding, so no image is scored twice. With ``batch``
    (rect validation: every ``batch`` consecutive images share one letterbox shape) whole batches in turn, so that
    a rank's batches are the data set's."""
    if batch > 0:
        return [i for start in range(rank * batch, n, world * batch) for i in range(start, min(start + batch, n))]
    return list(range(rank, n, world))


def _shard_sampler(n: int, rank: int, world: int, batch: int = 0):
    """A sampler of ``shard_indices``."""
    import paddle

    class _Shard(paddle.io.Sampler):
        def __init__(self):
            self.indices = shard_indices(n, rank, world, batch)

        def __iter__(self):
            return iter(self.indices)

        def __len__(self):
            return len(self.indices)

    return _Shard()


def make_evaluator(cfg, worker_num: int = 0) -> "CocoEvaluator":
    """The evaluator of the config's ``metric``: VOC's for ``metric: VOC``, COCO's otherwise."""
    return (VocEvaluator if cfg.get("metric") == "VOC" else CocoEvaluator)(cfg, worker_num)


class CocoEvaluator:
    """Builds the eval loader once (this rank's shard) and scores a model on demand."""

    metric = "COCO"
    # what the mAP50 and mAP50-95 this metric reports are, as the console and the per-class table name them
    label = "COCO mAP50 / mAP50-95 (pycocotools, 101-point)"
    classwise_title = "Per-category bbox AP (IoU 0.50:0.95):"

    def __init__(self, cfg, worker_num: int = 0):
        import paddle
        from ppdet.core.workspace import create

        from ppmulti.rank.ranklog import prints_to_log

        self.cfg = cfg
        self.dataset = create("EvalDataset")()
        self.dataset.check_or_download_dataset()
        with prints_to_log():   # pycocotools' notices while the annotations load
            self.dataset.parse_dataset()
        self.anno_file = self.dataset.get_anno()
        batch = int(cfg.EvalReader["batch_size"])
        rect = bool(getattr(self.dataset, "rect", False) and getattr(self.dataset, "rect_size", 0))
        sampler = _shard_sampler(len(self.dataset.roidbs), dist.rank(), dist.world_size(), batch if rect else 0)
        batch_sampler = paddle.io.BatchSampler(sampler=sampler, batch_size=batch, drop_last=False)
        with prints_to_log():   # ppdet's reader parses the annotations again
            self.loader = create("EvalReader")(self.dataset, worker_num, batch_sampler)
        self.passes = Passes(self.loader)   # every evaluation of a run from one loader iterator (data.feed)
        self.catid2clsid = self._class_ids()   # the annotation's category id -> the model's class id
        self.clsid2catid = {v: k for k, v in self.catid2clsid.items()}
        self._coco_gt = None
        self.last_detections: list[dict] = []
        self.last_pr = None   # rank 0: the PR curve of the last scoring (engine.plots.PRCurve)
        self.last_class_maps: list[float] | None = None   # rank 0: mAP50-95 per class id of the last scoring
        self.last_class_ap: dict[str, float] = {}          # rank 0: AP per category name of the last scoring
        self.last_diagnostics = None   # rank 0: engine.diagnostics.Diagnostics of the last scoring (every rank's)
        self.keep_batches = 0   # rank 0 keeps this many first batches for val_batch*.jpg (engine.pictures)
        self.last_val_batches: list = []   # rank 0: those batches of the last prediction (pictures.ValBatch)
        self.val_loss_state = None   # this rank's (sums, batches) of the validation losses (engine.val_loss)
        self._labels: dict[int, object] | None = None   # im_id -> labels (M, 5), from the annotation file
        self.table = "all"   # what evaluate() prints of YOLOv5's table: "all" (its row), "classes" (all rows), None

    def predict(self, model) -> tuple[list[dict], int, float]:
        """This rank's detections in COCO json form, the number of images, and the seconds taken."""
        import paddle
        from ppdet.metrics.coco_utils import get_infer_results

        model.eval()
        detections: list[dict] = []
        images = 0
        tic = time.time()
        from ppmulti.rank import heartbeat
        from ppmulti.rank.engine.progress import track

        from ppmulti.rank.engine.val_loss import ValLoss
        from ppmulti.rank.ops.silu import fused_for_inference

        val_loss = ValLoss.for_model(model, self.labels_of)   # YOLOv5's, ultralytics': their losses, same pass
        self.last_val_batches = []
        keep = self.keep_batches if dist.is_main() else 0
        # CPU: each conv+BN+SiLU layer as one oneDNN convolution for this pass (ops.silu)
        with paddle.no_grad(), val_loss or contextlib.nullcontext(), fused_for_inference(model):
            # without workers: ppmulti's thread, whose errors reach here (Paddle's own would hang, data.feed)
            for data in track(self.passes.next(), "eval", total=len(self.loader)):  # a bar on rank 0
                heartbeat.beat("evaluation")   # per batch: a long evaluation is moving, not hung
                outs = model(data)
                if val_loss is not None:
                    val_loss.add(data)
                outs_np = {"bbox": outs["bbox"].numpy(), "bbox_num": outs["bbox_num"].numpy(),
                           "im_id": data["im_id"].numpy()}
                if len(self.last_val_batches) < keep:
                    self.last_val_batches.append(self._val_batch(data, outs_np))
                images += outs_np["im_id"].shape[0]
                detections.extend(get_infer_results(outs_np, self.clsid2catid).get("bbox", []))
        self.val_loss_state = None if val_loss is None else val_loss.state()
        return detections, images, time.time() - tic

    def close(self) -> None:
        """Stop the loader's workers (and the batches they made ahead for the next evaluation)."""
        self.passes.close()

    def evaluate(self, model) -> EvalResult:
        """Score ``model`` on the whole eval set; every rank returns the same result."""
        from ppmulti.rank.engine.val_loss import combine

        detections, images, seconds = self.predict(model)
        gathered = dist.all_gather_object((detections, images, seconds, self.val_loss_state))
        result = None
        if dist.is_main():
            all_dets = [d for dets, _, _, _ in gathered for d in dets]
            total = sum(n for _, n, _, _ in gathered)
            rates = [n / s if s > 0 else 0.0 for _, n, s, _ in gathered]
            val_losses = combine([state for _, _, _, state in gathered])
            gathered = [g[:3] for g in gathered]
            self.last_detections = all_dets   # rank 0: every rank's detections (tools/eval.py's --save-txt)
            written = self.write_predictions(all_dets)
            if self.cfg.get("save_prediction_only"):
                result = EvalResult(None, None, total, max(s for _, _, s in gathered), rates,
                                    f"{len(all_dets)} detections written to {written}, not scored "
                                    f"(save_prediction_only)", predictions=written)
                _say(result.summary)
            else:
                diag = self.last_diagnostics = self.diagnose(all_dets)   # before score: VOC's reads it
                m50_95, m50, summary = self.score(all_dets)
                result = EvalResult(m50, m50_95, total, max(s for _, _, s in gathered), rates, summary,
                                    self.last_class_maps, predictions=written)
                result.metric = self.metric
                result.val_losses = val_losses
                means = diag.means()
                result.precision, result.recall = means["precision"], means["recall"]
                if self.table:
                    _say(self.table_note(m50, m50_95))
                    _say(diag.table(per_class=self.table == "classes" and len(diag.names) > 1))
                if self.cfg.get("classwise"):
                    result.class_ap = self.last_class_ap
                    _say(classwise_table(self.last_class_ap, title=self.classwise_title))
        result = dist.all_gather_object(result)[0]
        return result

    def table_note(self, m50: float, m50_95: float) -> str:
        """The line above YOLOv5's table: which mAP is the run's (the epoch line's, best weights') and what the
        table's are, so that two mAP50s of one evaluation are never read as one (GFL once showed 0.0029 on the
        epoch line and 0.00466 in the table's 'all' row)."""
        return (f"{self.label}: {m50:.4g} / {m50_95:.4g}; the table below is YOLOv5's (its own interpolation of "
                f"the same detections: trapezoids over 101 recall points, mean over classes with labels)")

    def write_predictions(self, detections: list[dict]) -> str | None:
        """Rank 0: every rank's detections as ``bbox.json`` (PaddleDetection's file) in the config's
        ``output_eval`` directory, or the current one with ``save_prediction_only``; None when neither asks."""
        directory = self.cfg.get("output_eval")
        if not directory and not self.cfg.get("save_prediction_only"):
            return None
        from ppmulti.common.atomic import atomic_write_text

        path = Path(directory or ".") / PREDICTIONS
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = ("image_id", "category_id", "bbox", "score")   # before pycocotools' loadRes adds its own keys
        atomic_write_text(path, json.dumps([{k: d[k] for k in keys} for d in detections]) + "\n")
        return str(path)

    def diagnose(self, detections: list[dict]):
        """YOLOv5's diagnostics (engine.diagnostics) of every rank's detections against the labels of every image
        of the eval set (crowd boxes left out: YOLOv5 has none), class ids as the model numbers them."""
        import numpy as np

        from ppmulti.rank.engine.diagnostics import diagnose

        catid2clsid = self.catid2clsid
        names = self.names()
        by_image: dict[int, list] = {}
        for d in detections:
            if d["category_id"] in catid2clsid:
                x, y, w, h = d["bbox"]
                by_image.setdefault(int(d["image_id"]), []).append(
                    [x, y, x + w, y + h, d["score"], catid2clsid[d["category_id"]]])
        images = []
        for record in self.dataset.roidbs:
            im_id = int(np.asarray(record["im_id"]).reshape(-1)[0])
            images.append((np.asarray(by_image.get(im_id, []), dtype=np.float64).reshape(-1, 6),
                           self.labels_of(im_id)))
        return diagnose(images, names)

    def _class_ids(self) -> dict[int, int]:
        return dict(self.dataset.catid2clsid)

    def names(self) -> list[str]:
        """The class names by the model's class id."""
        gt = self._gt()
        cats = {c["id"]: c["name"] for c in gt.loadCats(gt.getCatIds())}
        count = max(self.catid2clsid.values(), default=-1) + 1
        return [str(cats.get(self.clsid2catid.get(i), i)) for i in range(count)]

    def _empty_pr(self):
        return _no_detection_pr(self._gt())

    def _val_batch(self, data: dict, outs: dict):
        """One batch for val_batch*_labels.jpg / _pred.jpg: its first 16 images back to pixels, their labels and
        detections moved into the input's pixels (scale_factor, and --rect's margin)."""
        import numpy as np

        from ppmulti.common.yamlread import reader_ops
        from ppmulti.rank.engine import pictures

        norm = (reader_ops(self.cfg, "NormalizeImage", "EvalReader") or [{}])[-1]
        images = pictures.to_uint8(data["image"].numpy()[:pictures.MAX_TILES], norm.get("mean", (0, 0, 0)),
                                   norm.get("std", (1, 1, 1)), 255.0 if norm.get("is_scale", True) else 1.0)
        ids = outs["im_id"].reshape(-1)[:len(images)]
        scales = data["scale_factor"].numpy().reshape(-1, 2)
        # --rect's centred letterbox: its margin (top, left) as well
        margins = data["pad_offset"].numpy().reshape(-1, 2) if "pad_offset" in data else np.zeros_like(scales)
        if not hasattr(self, "_files"):
            self._files = {int(np.asarray(r["im_id"]).reshape(-1)[0]): str(r.get("im_file", ""))
                           for r in self.dataset.roidbs}
        starts = np.concatenate(([0], np.cumsum(outs["bbox_num"].reshape(-1))))
        labels, preds = [], []
        for i, im_id in enumerate(ids):
            sy, sx = scales[i]
            gain = np.array([sx, sy, sx, sy])
            top, left = margins[i]
            shift = np.array([left, top, left, top])
            gt = self.labels_of(int(im_id))
            labels.append(np.c_[gt[:, :1], gt[:, 1:] * gain + shift, np.full(len(gt), np.nan)])
            det = np.asarray(outs["bbox"][starts[i]:starts[i + 1]], dtype=np.float64).reshape(-1, 6)
            det = det[det[:, 0] >= 0]   # ppdet's NMS pads an empty result with class -1
            preds.append(np.c_[det[:, :1], det[:, 2:] * gain + shift, det[:, 1]])
        return pictures.ValBatch(images, labels, preds, [self._files.get(int(i), "") for i in ids])

    def labels_of(self, im_id: int):
        """An image's labels (M, 5: class id, x1, y1, x2, y2 in original pixels) from the annotation file, crowd
        boxes left out (YOLOv5 has none)."""
        import numpy as np

        if self._labels is None:
            gt = self._gt()
            catid2clsid = self.catid2clsid
            by_image: dict[int, list] = {}
            for a in gt.loadAnns(gt.getAnnIds()):
                if not a.get("iscrowd") and a["category_id"] in catid2clsid:
                    x, y, w, h = a["bbox"]
                    by_image.setdefault(int(a["image_id"]), []).append([catid2clsid[a["category_id"]], x, y,
                                                                        x + w, y + h])
            self._labels = {k: np.asarray(v, dtype=np.float64).reshape(-1, 5) for k, v in by_image.items()}
        return self._labels.get(int(im_id), np.zeros((0, 5)))

    def _gt(self):
        """pycocotools' ground truth: the annotations as the scan checked them when the data set was scanned (its
        dropped and clipped boxes, its skipped images: what training and the loader see), else the file."""
        if self._coco_gt is None:
            from pycocotools.coco import COCO

            checked = getattr(self.dataset, "ground_truth", None)   # coco.CachedCOCODataSet's
            with contextlib.redirect_stdout(io.StringIO()):
                if checked is None:
                    self._coco_gt = COCO(self.anno_file)
                else:
                    data, line = checked()
                    self._coco_gt = COCO()
                    self._coco_gt.dataset = data
                    self._coco_gt.createIndex()
            if checked is not None and line and dist.is_main():
                from ppmulti.rank.data.coco import report_line

                report_line(line)
        return self._coco_gt

    def score(self, detections: list[dict]) -> tuple[float, float, str]:
        """(mAP50-95, mAP50, printed summary) of detections against the annotation file."""
        from pycocotools.cocoeval import COCOeval

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            self._gt()
            self.last_pr = None
            self.last_class_maps = None
            self.last_class_ap = {c["name"]: float("nan") for c in self._coco_gt.loadCats(self._coco_gt.getCatIds())}
            if not detections:   # a model that detects nothing yet: zeros, as YOLOv5 shows them
                self.last_pr = self._empty_pr()
                self.last_class_maps = [0.0] * (max(self.catid2clsid.values(), default=-1) + 1)
                return 0.0, 0.0, "no detections"
            coco_dt = self._coco_gt.loadRes(detections)
            ev = COCOeval(self._coco_gt, coco_dt, "bbox")
            all_areas_only(ev)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        from ppmulti.rank.engine.plots import pr_curve

        cats = self._coco_gt.loadCats(self._coco_gt.getCatIds())
        self.last_pr = pr_curve(ev, {c["id"]: c["name"] for c in cats})   # [plots] PR_curve.png on rank 0
        self.last_class_maps = class_maps(ev, self.catid2clsid, max(0.0, float(ev.stats[0])))
        self.last_class_ap = class_ap(ev, {c["id"]: c["name"] for c in cats})
        summary = "\n".join(line for line in buf.getvalue().splitlines()
                            if ("Average Precision" in line or "Average Recall" in line) and "area=   all" in line)
        return max(0.0, float(ev.stats[0])), max(0.0, float(ev.stats[1])), summary


class VocEvaluator(CocoEvaluator):
    """``metric: VOC`` as PaddleDetection's VOCMetric scores it: ppdet's ``DetectionMAP`` at IoU 0.5 with the
    config's ``map_type`` (11point, its default, or integral), boxes marked difficult neither counted nor
    penalised, in the images' own pixels. Each rank predicts its shard as for COCO. One difference: ppdet's
    VOCMetric skips a whole eval batch whose images have no detection at all, labels included (its
    ``bboxes.shape == (1, 1)`` test), which raises recall; here every image's labels count. VOC has no mAP50-95:
    the one reported is YOLOv5's (its interpolation, the per-class table's) over the non-difficult boxes, so the
    run's best weights and fitness still have one."""

    metric = "VOC"
    classwise_title = "Per-category bbox AP (VOC, IoU 0.5):"

    def __init__(self, cfg, worker_num: int = 0):
        super().__init__(cfg, worker_num)
        self.map_type = str(cfg.get("map_type", "11point"))
        self.label = f"VOC mAP50 (ppdet's DetectionMAP, {self.map_type}) / mAP50-95 (YOLOv5's interpolation)"

    def _class_ids(self) -> dict[int, int]:
        # detections keep the model's class ids: every one it can predict (num_classes), the label list's too
        count = max(int(self.cfg.get("num_classes") or 0), max(self.dataset.cname2cid.values(), default=-1) + 1)
        return {cid: cid for cid in range(count)}

    def names(self) -> list[str]:
        by_id = {cid: name for name, cid in self.dataset.cname2cid.items()}
        return [str(by_id.get(i, i)) for i in range(max(self.catid2clsid, default=-1) + 1)]

    def _records(self):
        import numpy as np

        for record in self.dataset.roidbs:
            im_id = int(np.asarray(record["im_id"]).reshape(-1)[0])
            boxes = np.asarray(record.get("gt_bbox", np.zeros((0, 4))), dtype=np.float64).reshape(-1, 4)
            classes = np.asarray(record.get("gt_class", np.zeros((0, 1))), dtype=np.int64).reshape(-1)
            difficult = np.asarray(record.get("difficult", np.zeros(len(classes))), dtype=np.int64).reshape(-1)
            yield im_id, boxes, classes, difficult

    def labels_of(self, im_id: int):
        """An image's non-difficult labels (M, 5: class id, x1, y1, x2, y2), as YOLOv5's VOC conversion keeps."""
        import numpy as np

        if self._labels is None:
            self._labels = {}
            for iid, boxes, classes, difficult in self._records():
                keep = difficult == 0
                self._labels[iid] = np.c_[classes[keep], boxes[keep]].astype(np.float64).reshape(-1, 5)
        return self._labels.get(int(im_id), np.zeros((0, 5)))

    def _gt(self):
        raise AssertionError("a VOC data set has no COCO annotation file")

    def score(self, detections: list[dict]) -> tuple[float, float, str]:
        """(mAP50-95 from YOLOv5's diagnostics, VOC mAP50, summary); ``self.last_diagnostics`` is this scoring's
        (evaluate() diagnoses first)."""
        import numpy as np
        from ppdet.metrics.map_utils import DetectionMAP

        names = self.names()
        voc = DetectionMAP(class_num=max(len(names), 1), overlap_thresh=0.5, map_type=self.map_type,
                           is_bbox_normalized=False, evaluate_difficult=False, catid2name=dict(enumerate(names)))
        by_image: dict[int, list] = {}
        for d in detections:
            x, y, w, h = d["bbox"]
            by_image.setdefault(int(d["image_id"]), []).append([x, y, x + w, y + h, d["score"], d["category_id"]])
        for im_id, boxes, classes, difficult in self._records():
            dets = np.asarray(by_image.get(im_id, []), dtype=np.float64).reshape(-1, 6)
            voc.update(dets[:, :4], dets[:, 4], dets[:, 5], boxes, classes, difficult)
        voc.accumulate()
        m50 = max(0.0, float(voc.get_map()))
        diag = self.last_diagnostics
        m50_95 = diag.means()["mAP50_95"] if diag is not None else 0.0
        self.last_pr = None
        self.last_class_maps = None
        if diag is not None:
            overall = m50_95
            per_class = dict(zip(diag.metrics.classes.tolist(), diag.metrics.ap50_95.tolist()))
            self.last_class_maps = [per_class.get(i, overall) for i in range(len(names))]
        self.last_class_ap = self._class_aps(voc, names)
        summary = (f"VOC mAP50 ({self.map_type}, IoU 0.5, ppdet's DetectionMAP) = {m50:.4f}; "
                   f"mAP50-95 (YOLOv5's interpolation; VOC has none) = {m50_95:.4f}")
        return m50_95, m50, summary

    def _class_aps(self, voc, names: list[str]) -> dict[str, float]:
        """AP50 per class name (NaN without labels), by the same map_type: each class scored alone."""
        import copy as copy_mod

        out = {}
        for c, name in enumerate(names):
            one = copy_mod.copy(voc)
            one.class_score_poss = [p if i == c else [] for i, p in enumerate(voc.class_score_poss)]
            one.class_gt_counts = [n if i == c else 0 for i, n in enumerate(voc.class_gt_counts)]
            if not one.class_gt_counts[c]:
                out[name] = float("nan")
                continue
            one.accumulate()
            out[name] = float(one.get_map())
        return out


def all_areas_only(coco_eval) -> None:
    """Score the "all" area range alone: every figure ppmulti reads of a COCOeval (mAP50, mAP50-95, the PR curve,
    per-class AP) is that range's, and pycocotools evaluates each range on its own (its per-image matching, the
    most of its time, once per range), so the small, medium and large ranges cost three quarters of the time and
    change none of them. ``summarize()`` then shows -1 for those ranges; the summary keeps the "all" lines."""
    params = coco_eval.params
    keep = list(params.areaRngLbl).index("all")
    params.areaRng = [params.areaRng[keep]]
    params.areaRngLbl = ["all"]


def _no_detection_pr(gt):
    """The PR curve of no detections against ``gt`` (pycocotools' COCO): precision 0 at every recall point for each
    category with labels, the categories COCOeval's own curve keeps; PR_curve.png still shows them."""
    import numpy as np

    from ppmulti.rank.engine.plots import PRCurve

    labelled = sorted({a["category_id"] for a in gt.loadAnns(gt.getAnnIds()) if not a.get("iscrowd")})
    names = {c["id"]: c["name"] for c in gt.loadCats(gt.getCatIds())}
    return PRCurve(recall=np.linspace(0.0, 1.0, 101), precision=np.zeros((len(labelled), 101)),
                   names=[str(names.get(c, c)) for c in labelled])


def class_maps(coco_eval, catid2clsid: dict, overall: float) -> list[float]:
    """mAP50-95 per class id from pycocotools' precision array (IoU x recall x class x area x max dets; all
    areas, 100 detections), YOLOv5's ``maps``: a class with no ground truth keeps the overall mAP."""
    import numpy as np

    precision = coco_eval.eval["precision"]
    out = [overall] * (max(catid2clsid.values(), default=-1) + 1)
    for k, cat in enumerate(coco_eval.params.catIds):
        p = precision[:, :, k, 0, -1]
        p = p[p > -1]
        if p.size and cat in catid2clsid:
            out[catid2clsid[cat]] = float(np.mean(p))
    return out


def class_ap(coco_eval, names: dict) -> dict[str, float]:
    """AP (IoU 0.50:0.95, all areas, 100 detections) per category name, as PaddleDetection's classwise COCO
    evaluation computes it: the mean of pycocotools' precision over IoUs and recalls; NaN for a category
    without ground truth."""
    import numpy as np

    precision = coco_eval.eval["precision"]
    out = {}
    for k, cat in enumerate(coco_eval.params.catIds):
        p = precision[:, :, k, 0, -1]
        p = p[p > -1]
        out[str(names.get(cat, cat))] = float(np.mean(p)) if p.size else float("nan")
    return out


def classwise_table(aps: dict[str, float], pairs: int = 3,
                    title: str = "Per-category bbox AP (IoU 0.50:0.95):") -> str:
    """The per-category AP as a text table, ``pairs`` (category, AP) columns a row."""
    cells = [(name, "nan" if math.isnan(ap) else f"{ap:0.3f}") for name, ap in aps.items()]
    width = max([len("category")] + [len(n) for n, _ in cells])
    header = " | ".join(f"{'category':<{width}} | {'AP':>5}" for _ in range(min(pairs, len(cells)) or 1))
    lines = [title, header, "-" * len(header)]
    for i in range(0, len(cells), pairs):
        lines.append(" | ".join(f"{n:<{width}} | {a:>5}" for n, a in cells[i:i + pairs]))
    return "\n".join(lines)


def _say(text: str) -> None:
    """Rank 0's message: into the run's log when training set one up, else on stderr (tools/eval.py)."""
    if log.handlers:   # ranklog.setup_rank_logging's (a training); Paddle's own root handlers do not count
        for line in text.splitlines():
            log.info("%s", line)
    else:
        print(text, file=sys.stderr)
