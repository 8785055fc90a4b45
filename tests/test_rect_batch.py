"""--rect's letterbox shapes are grouped by the batch plan's global batch (builder: after lr.plan_batch), so a
resumed run, which keeps its trained batch, groups them as its loader batches them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ppmulti.common.errors import UserError
from ppmulti.rank.engine.builder import _Build
from ppmulti.rank.engine.lr import Trained
from ppmulti.rank.engine.resume_plan import ResumePlan
from ppmulti.rank.plan import ConfigEdit, RunPlan
from ppmulti.rank.yolo_config import apply_edit, apply_rect


class _Cfg(dict):
    """ppdet's AttrDict, as far as the builder's batch steps use it (``cfg.TrainReader``)."""

    def __getattr__(self, name):
        return self[name]


def _toy_config(per_rank: int) -> _Cfg:
    """A config with YOLOv5's reader and dataset, ``per_rank`` images per rank in TrainReader."""
    return _Cfg(TrainReader={"batch_size": per_rank, "shuffle": True,
                             "sample_transforms": [{"YOLOv5Mosaic": {"prob": 1.0}}]},
                TrainDataset={"name": "YOLODataSet"})


def _built(opts: RunPlan, cfg: _Cfg, world: int, trained: Trained | None = None) -> _Build:
    """The builder's steps from the config edit to the dataset's settings: edit, batch plan, --rect's groups."""
    build = _Build(opts)
    build.cfg, build.world = cfg, world
    build.resume = SimpleNamespace(plan=ResumePlan(trained=trained))   # what ResumeHook decided
    apply_edit(cfg, opts.edit)
    build.batch = build._batch_plan()
    cfg.TrainReader["batch_size"] = build.batch.per_rank
    build._group_rect()
    return build


def test_a_resumed_rect_run_groups_shapes_by_its_kept_batch():
    """-c CONFIG (batch_size 16) --resume RUN --rect on 2 ranks, RUN trained with global batch 8 on 2 ranks: the
    plan keeps 8 (4 per rank), so each step's images are 8 consecutive ones and the shapes are grouped by 8. The
    edit used to group them by batch_size x world = 32 before the plan: four steps letterboxed to one shape."""
    opts = RunPlan(config="c.yml", resume="runs/train/exp", edit=ConfigEdit(rect=True))
    build = _built(opts, _toy_config(16), world=2, trained=Trained(global_batch=8, world_size=2))
    assert (build.batch.global_batch, build.batch.per_rank, build.batch.accumulate) == (8, 4, 1)
    assert build.cfg["TrainDataset"]["rect_batch"] == 8 == build.batch.global_batch


def test_a_resumed_rect_run_on_another_world_size():
    """Trained with global batch 16 on 4 ranks, resumed on 2 with --batch given nowhere: the plan keeps the effective
    batch 16 at 4 per rank (global 8, accumulate 2); the shapes follow the 8 a step loads."""
    opts = RunPlan(config="c.yml", resume="runs/train/exp", edit=ConfigEdit(rect=True))
    build = _built(opts, _toy_config(4), world=2, trained=Trained(global_batch=16, world_size=4))
    assert (build.batch.global_batch, build.batch.accumulate) == (8, 2)
    assert build.cfg["TrainDataset"]["rect_batch"] == 8


@pytest.mark.parametrize("batch, world, config_per_rank, want", [
    (16, 2, 4, 16),      # --batch: the global batch
    (None, 2, 4, 8),     # the config's batch_size x world
    (None, 1, 6, 6),
])
def test_a_fresh_rect_run_groups_by_the_planned_global_batch(batch, world, config_per_rank, want):
    opts = RunPlan(config="c.yml", batch=batch, edit=ConfigEdit(rect=True))
    build = _built(opts, _toy_config(config_per_rank), world=world)
    assert build.cfg["TrainDataset"]["rect_batch"] == want == build.batch.global_batch
    assert build.cfg["TrainReader"]["shuffle"] is False and build.cfg["TrainDataset"]["rect"] is True


def test_no_rect_sets_no_groups():
    build = _built(RunPlan(config="c.yml", edit=ConfigEdit(imgsz=None)), _toy_config(4), world=2)
    assert "rect_batch" not in build.cfg["TrainDataset"]


def test_the_config_checks_stay_in_the_edit():
    cfg = _toy_config(4)
    cfg["TrainDataset"]["name"] = "COCODataSet"
    with pytest.raises(UserError, match="--rect works with YOLOv5 data yamls"):
        apply_rect(cfg)
    with pytest.raises(UserError, match="--rect needs the YOLOv5 reader"):
        apply_rect(_Cfg(TrainReader={"batch_size": 4}, TrainDataset={"name": "YOLODataSet"}))
