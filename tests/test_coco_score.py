"""pycocotools scored on its "all" area range alone gives every figure ppmulti reads of a full scoring."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def cs():
    with pytest.MonkeyPatch.context() as mp:   # the scoring case and the two scorings are bench/coco_score.py's
        mp.syspath_prepend(str(BENCH))
        yield importlib.import_module("coco_score")


def test_the_all_range_alone_gives_the_full_scorings_figures(cs):
    from ppmulti.rank.engine.evaluator import class_ap, class_maps
    from ppmulti.rank.engine.plots import pr_curve

    gt, dets = cs.scoring_case()
    full, fast = cs.scored(gt, dets, False), cs.scored(gt, dets, True)
    assert full.stats[0] > 0.01 and full.stats[1] > full.stats[0]   # a scoring with something to compare
    assert list(fast.params.areaRngLbl) == ["all"] and len(full.params.areaRngLbl) == 4
    np.testing.assert_array_equal(fast.stats[:3], full.stats[:3])   # mAP50-95, mAP50, mAP75
    np.testing.assert_array_equal(fast.stats[6:9], full.stats[6:9])   # AR at 1, 10, 100 detections
    all_full = list(full.params.areaRngLbl).index("all")
    for key in ("precision", "recall", "scores"):
        np.testing.assert_array_equal(fast.eval[key][..., 0, :], full.eval[key][..., all_full, :])
    names = {1: "c1", 2: "c2", 3: "c3"}
    a, b = pr_curve(full, names), pr_curve(fast, names)
    np.testing.assert_array_equal(a.precision, b.precision)
    assert a.names == b.names
    ids = {1: 0, 2: 1, 3: 2}
    assert class_maps(fast, ids, fast.stats[0]) == class_maps(full, ids, full.stats[0])
    assert class_ap(fast, names) == class_ap(full, names)
    assert fast.stats[3] == fast.stats[4] == fast.stats[5] == -1   # the ranges not scored
