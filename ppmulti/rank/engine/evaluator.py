"""Distributed COCO evaluation: each rank predicts its shard, rank 0 scores all of it once with pycocotools."""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass, field

from ppmulti.rank import dist


@dataclass
class EvalResult:
    mAP50: float
    mAP50_95: float
    images: int
    seconds: float
    per_rank_images_per_s: list[float] = field(default_factory=list)
    summary: str = ""

    def as_dict(self) -> dict:
        return {"mAP50": self.mAP50, "mAP50_95": self.mAP50_95, "images": self.images,
                "seconds": round(self.seconds, 3),
                "per_rank_images_per_s": [round(v, 3) for v in self.per_rank_images_per_s]}


def _shard_sampler(n: int, rank: int, world: int):
    """Indices rank, rank+world, ... — no padding, so no image is scored twice."""
    import paddle

    class _Shard(paddle.io.Sampler):
        def __init__(self):
            self.indices = list(range(rank, n, world))

        def __iter__(self):
            return iter(self.indices)

        def __len__(self):
            return len(self.indices)

    return _Shard()


class CocoEvaluator:
    """Builds the eval loader once (this rank's shard) and scores a model on demand."""

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
        sampler = _shard_sampler(len(self.dataset.roidbs), dist.rank(), dist.world_size())
        batch_sampler = paddle.io.BatchSampler(sampler=sampler, batch_size=cfg.EvalReader["batch_size"],
                                               drop_last=False)
        with prints_to_log():   # ppdet's reader parses the annotations again
            self.loader = create("EvalReader")(self.dataset, worker_num, batch_sampler)
        self.clsid2catid = {v: k for k, v in self.dataset.catid2clsid.items()}
        self._coco_gt = None
        self.last_detections: list[dict] = []
        self.last_pr = None   # rank 0: the PR curve of the last scoring (engine.plots.PRCurve)

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

        with paddle.no_grad():
            for data in track(self.loader, "eval", total=len(self.loader)):  # a bar on a rank-0 terminal
                heartbeat.beat("evaluation")   # per batch: a long evaluation is moving, not hung
                outs = model(data)
                outs_np = {"bbox": outs["bbox"].numpy(), "bbox_num": outs["bbox_num"].numpy(),
                           "im_id": data["im_id"].numpy()}
                images += outs_np["im_id"].shape[0]
                detections.extend(get_infer_results(outs_np, self.clsid2catid).get("bbox", []))
        return detections, images, time.time() - tic

    def evaluate(self, model) -> EvalResult:
        """Score ``model`` on the whole eval set; every rank returns the same result."""
        detections, images, seconds = self.predict(model)
        gathered = dist.all_gather_object((detections, images, seconds))
        result = None
        if dist.is_main():
            all_dets = [d for dets, _, _ in gathered for d in dets]
            total = sum(n for _, n, _ in gathered)
            rates = [n / s if s > 0 else 0.0 for _, n, s in gathered]
            self.last_detections = all_dets   # rank 0: every rank's detections (tools/eval.py's --save-txt)
            m50_95, m50, summary = self.score(all_dets)
            result = EvalResult(m50, m50_95, total, max(s for _, _, s in gathered), rates, summary)
        result = dist.all_gather_object(result)[0]
        return result

    def score(self, detections: list[dict]) -> tuple[float, float, str]:
        """(mAP50-95, mAP50, printed summary) of detections against the annotation file."""
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            if self._coco_gt is None:
                self._coco_gt = COCO(self.anno_file)
            self.last_pr = None
            if not detections:
                return 0.0, 0.0, "no detections"
            coco_dt = self._coco_gt.loadRes(detections)
            ev = COCOeval(self._coco_gt, coco_dt, "bbox")
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        from ppmulti.rank.engine.plots import pr_curve

        cats = self._coco_gt.loadCats(self._coco_gt.getCatIds())
        self.last_pr = pr_curve(ev, {c["id"]: c["name"] for c in cats})   # [plots] PR_curve.png on rank 0
        summary = "\n".join(line for line in buf.getvalue().splitlines() if "Average Precision" in line
                            or "Average Recall" in line)
        return max(0.0, float(ev.stats[0])), max(0.0, float(ev.stats[1])), summary
