"""bench/time_to_accuracy.py's arithmetic: seeds averaged epoch by epoch, the seconds to a target, the comparison
against YOLOv5's mean curve, the --seeds flag, and the command line the results record."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def tta():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("time_to_accuracy", BENCH / "time_to_accuracy.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def curve(seconds, maps):
    return [{"epoch": i + 1, "seconds": s, "mAP50": m} for i, (s, m) in enumerate(zip(seconds, maps))]


def test_mean_curve_averages_seconds_and_map_epoch_by_epoch(tta):
    a = curve([2.0, 2.0, 2.0], [0.1, 0.3, 0.5])
    b = curve([4.0, 4.0, 6.0], [0.3, None, 0.7])
    mean = tta.mean_curve([a, b])
    assert [e["epoch"] for e in mean] == [1, 2, 3]
    assert [e["seconds"] for e in mean] == [3.0, 3.0, 4.0]
    # an epoch one seed did not score has no mean
    assert [e["mAP50"] for e in mean] == [0.2, None, 0.6]


def test_seconds_to_sums_up_to_the_first_epoch_that_reaches(tta):
    c = curve([3.0, 3.0, 4.0, 5.0], [0.1, None, 0.45, 0.4])
    assert tta.seconds_to(c, 0.45) == (10.0, 3)
    assert tta.seconds_to(c, 0.1) == (3.0, 1)
    assert tta.seconds_to(c, 0.5) is None
    assert tta.final_map(c) == 0.4
    assert tta.final_map(curve([1.0], [None])) == 0.0


def test_compare_against_yolov5s_mean_curve(tta):
    yolov5 = curve([7.0] * 4, [0.1, 0.2, 0.3, 0.4])
    y_final = tta.final_map(yolov5)
    y_own = tta.seconds_to(yolov5, y_final)
    fast = tta.compare(curve([5.0] * 4, [0.1, 0.3, 0.4, 0.5]), yolov5, y_final, y_own)
    assert fast["to_yolov5_final"] == (15.0, 3)
    assert fast["ratio_vs_yolov5"] == round(15.0 / 28.0, 3)
    assert fast["yolov5_to_this_final"] is None   # YOLOv5 never reached 0.5
    assert fast["train_seconds"] == 20.0 and fast["final_mAP50"] == 0.5
    slow = tta.compare(curve([8.0] * 4, [0.1, 0.1, 0.2, 0.3]), yolov5, y_final, y_own)
    assert slow["to_yolov5_final"] is None and slow["ratio_vs_yolov5"] is None
    assert slow["yolov5_to_this_final"] == (21.0, 3)


def test_seeds_flag(tta):
    assert tta.parse_args(["--yolov5", "DIR"]).seeds == [0]
    assert tta.parse_args(["--yolov5", "DIR", "--seeds", "0,1,2"]).seeds == [0, 1, 2]
    for bad in ("0,0", "a,1", ","):
        with pytest.raises(SystemExit):
            tta.parse_args(["--yolov5", "DIR", "--seeds", bad])


def test_the_recorded_command_line_holds_no_machine_path(tta):
    argv = ["--yolov5", "/home/me/yolov5", "--venv", "/tmp/v", "--seeds", "0,1", "--data", "/d", "--out", "/o.json"]
    assert tta.vs.portable(argv) == ["--yolov5", "DIR", "--venv", "DIR", "--seeds", "0,1", "--data", "DIR",
                                     "--out", "DIR"]


def test_cases_flag(tta):
    default = tta.parse_args(["--yolov5", "DIR"]).cases
    assert default == [("yolov5", 1, ""), ("ppmulti", 1, ""), ("ppmulti", 2, "")]
    cases = tta.parse_args(["--yolov5", "DIR", "--cases", "ppmulti/2,ppmulti/2+amp,ppmulti/2+buffer64"]).cases
    assert cases == [("yolov5", 1, ""), ("ppmulti", 2, ""), ("ppmulti", 2, "amp"),   # YOLOv5 sets the target
                     ("ppmulti", 2, "buffer64")]
    assert [tta.case_key(*c) for c in cases] == ["yolov5/1", "ppmulti/2", "ppmulti/2+amp", "ppmulti/2+buffer64"]
    assert [tta.OPTIONS[c[2]] for c in cases[2:]] == [["--amp"], ["--mosaic-buffer", "64"]]
    for bad in ("ppmulti/0", "ppmulti/x", "torch/1", "ppmulti/2+fp16", "ppmulti/2+", "ppmulti/1,ppmulti/1"):
        with pytest.raises(SystemExit):
            tta.parse_args(["--yolov5", "DIR", "--cases", bad])
