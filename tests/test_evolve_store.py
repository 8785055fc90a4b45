"""Evolution's YOLOv5 semantics: fitness, mutation, parent selection; evolve.csv, hyp_evolve.yaml, evolve.png."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from ppmulti.common.errors import UserError
from ppmulti.procs.runs import evolve
from ppmulti.procs.runs.evolve import HYP_BOUNDS, EvolveStore

REPO = Path(__file__).resolve().parents[1]
BASE_HYP = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005, "warmup_epochs": 3.0,
            "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "box": 0.05, "cls": 0.5, "cls_pw": 1.0, "obj": 1.0,
            "obj_pw": 1.0, "iou_t": 0.2, "anchor_t": 4.0, "fl_gamma": 0.0, "hsv_h": 0.015, "hsv_s": 0.7,
            "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.5, "shear": 0.0, "perspective": 0.0,
            "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.0, "copy_paste": 0.0}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_seen():
    handler = _Records()
    logger = logging.getLogger("ppmulti")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def test_fitness_formula():
    assert evolve.fitness({"mAP50": 0.6, "mAP50_95": 0.4}) == pytest.approx(0.1 * 0.6 + 0.9 * 0.4)
    assert evolve.FITNESS_WEIGHTS == {"mAP50": 0.1, "mAP50_95": 0.9}


def test_hyp_bounds_cover_yolov5_hyps():
    assert set(HYP_BOUNDS) == set(BASE_HYP)
    assert HYP_BOUNDS["momentum"] == (0.3, 0.6, 0.98) and HYP_BOUNDS["iou_t"][0] == 0
    assert all(lo <= BASE_HYP[k] <= hi for k, (_, lo, hi) in HYP_BOUNDS.items())


def test_mutate_respects_bounds_and_gain_zero():
    rng = np.random.RandomState(0)
    parent = {**BASE_HYP, "not_bounded": 123.456}
    gain0 = [k for k, (g, _, _) in HYP_BOUNDS.items() if g == 0]
    for _ in range(300):
        child = evolve.mutate(parent, rng)
        assert set(child) == set(parent)
        assert any(child[k] != parent[k] for k in HYP_BOUNDS)
        for k, (_, lo, hi) in HYP_BOUNDS.items():
            assert lo <= child[k] <= hi, (k, child[k])
            assert child[k] == float(f"{child[k]:.5g}")
        assert all(child[k] == parent[k] for k in gain0)
        assert child["not_bounded"] == 123.456
        parent = {**child, "not_bounded": 123.456}


def test_mutate_extreme_values_are_clipped():
    rng = np.random.RandomState(1)
    child = evolve.mutate({"lr0": 10.0, "degrees": -5.0}, rng)
    assert child == {"lr0": 0.1, "degrees": 0.0}


def test_select_parent_picks_from_top_n():
    rows = [{"fitness": f / 10, "mAP50": 0.0, "mAP50_95": 0.0, "lr0": float(f)} for f in range(10)]
    rng = np.random.RandomState(0)
    picked = {evolve.select_parent(rows, rng, n=3)["lr0"] for _ in range(200)}
    assert picked <= {7.0, 8.0, 9.0} and len(picked) >= 2
    single = evolve.select_parent(rows, rng, n=5)
    assert set(single) == {"lr0"}
    mean = evolve.select_parent(rows, rng, n=3, method="weighted")["lr0"]
    w = np.array([0.9, 0.8, 0.7]) - 0.7 + 1e-6
    assert mean == pytest.approx(float((w * [9, 8, 7]).sum() / w.sum()))


def test_store_write_read_best(tmp_path):
    store = EvolveStore(tmp_path / "evolve.csv")
    assert store.rows() == [] and evolve.best(store) is None
    rows = [evolve.make_row({"mAP50": 0.5, "mAP50_95": 0.3}, {**BASE_HYP, "lr0": 0.02}),
            evolve.make_row({"mAP50": 0.7, "mAP50_95": 0.4}, BASE_HYP)]
    store.write(rows)
    lines = (tmp_path / "evolve.csv").read_text().splitlines()
    assert lines[0] == "fitness,mAP50,mAP50_95," + ",".join(BASE_HYP) and len(lines) == 3
    back = store.rows()
    assert back == rows and back[1]["fitness"] == pytest.approx(0.1 * 0.7 + 0.9 * 0.4)
    metrics, hyp = evolve.best(store)
    assert metrics["mAP50"] == 0.7 and hyp == BASE_HYP
    with pytest.raises(UserError, match="not a number"):
        evolve.make_row({"mAP50": 0.1, "mAP50_95": 0.1}, {"lr0": "fast"})
    with pytest.raises(UserError, match="cannot be an evolve.csv column"):
        evolve.make_row({"mAP50": 0.1, "mAP50_95": 0.1}, {"a,b": 1.0})


def test_corrupt_line_is_skipped_with_warning(tmp_path, warnings_seen):
    path = tmp_path / "evolve.csv"
    store = EvolveStore(path)
    store.write([evolve.make_row({"mAP50": 0.1 * i, "mAP50_95": 0.05 * i}, {"lr0": 0.01 * (i + 1), "box": 0.05})
                 for i in range(4)])
    lines = path.read_text().splitlines()
    lines.insert(3, "0.5,0.4,0.3,0.0")  # line 4: too few fields (a torn write)
    lines.insert(5, "0.5,0.4,0.3,abc,0.05")  # line 6: non-numeric
    path.write_text("\n".join(lines) + "\n")

    rows = store.rows()
    assert [r["lr0"] for r in rows] == [0.01, 0.02, 0.03, 0.04]
    assert len(warnings_seen) == 2
    assert str(path) in warnings_seen[0] and "line 4" in warnings_seen[0]
    assert "line 6" in warnings_seen[1]
    store.rows()
    assert len(warnings_seen) == 2  # reported once
    path.write_text("lr0,box\n0.1,0.2\n")
    with pytest.raises(UserError, match="not an evolve.csv header"):
        store.rows()


def test_write_best_yaml_and_plot(tmp_path):
    store = EvolveStore(tmp_path / "evolve.csv")
    rng = np.random.RandomState(3)
    with pytest.raises(UserError):
        evolve.write_best_yaml(store, tmp_path / "best.yaml")
    hyps = [evolve.mutate(BASE_HYP, rng) for _ in range(6)]
    rows = [evolve.make_row({"mAP50": 0.1 * i, "mAP50_95": 0.05 * (i % 5)}, h) for i, h in enumerate(hyps)]
    store.write(rows)
    evolve.write_best_yaml(store, tmp_path / "best.yaml")
    text = (tmp_path / "best.yaml").read_text()
    assert yaml.safe_load(text) == hyps[4]          # row 4: the fittest (0.1*0.4 + 0.9*0.2)
    assert "# Best generation: 4\n# Last generation: 5\n" in text
    evolve.plot(store, tmp_path / "evolve.png")
    png = (tmp_path / "evolve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_breed_parent_from_rows_child_differs_within_bounds():
    rng = np.random.RandomState(5)
    parent, child = evolve.breed([], BASE_HYP, rng)
    assert parent == BASE_HYP and child != parent
    rows = [{"fitness": 0.9, "mAP50": 0.9, "mAP50_95": 0.9, **{**BASE_HYP, "lr0": 0.02}}]
    for _ in range(50):
        parent, child = evolve.breed(rows, BASE_HYP, rng)
        assert parent["lr0"] == 0.02 and set(child) == set(BASE_HYP)
        assert any(child[k] != parent[k] for k in child)
        assert all(lo <= child[k] <= hi for k, (_, lo, hi) in HYP_BOUNDS.items())
    only_lr = {"lr0": HYP_BOUNDS["lr0"]}
    _, child = evolve.breed(rows, BASE_HYP, rng, only_lr)
    assert child["lr0"] != 0.02 and all(child[k] == BASE_HYP[k] for k in BASE_HYP if k != "lr0")
