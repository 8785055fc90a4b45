"""bench/ultra_train.py's pure parts: results.csv read as epochs, the running order, the mean curves over seeds, the
time to ultralytics' final mAP50, the goal checks, the markdown table and the --cases flag (no training)."""

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

# ultralytics 8.4's results.csv header (BaseTrainer.save_metrics: epoch, cumulative time, losses, metrics, lr),
# the columns ppmulti's `yolo` runs write too
HEADER = ("epoch,time,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision(B),metrics/recall(B),"
          "metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2")


@pytest.fixture(scope="module")
def ut():
    with pytest.MonkeyPatch.context() as mp:   # the bench imports its sibling scripts by name
        mp.syspath_prepend(str(BENCH))
        yield importlib.import_module("ultra_train")


def write_csv(path: Path, rows: list[tuple]) -> Path:
    lines = [HEADER] + [f"{e},{t},1.2,2.3,1.1,0.5,0.4,{m},0.2,1.3,2.4,1.2,0.001,0.001,0.001" for e, t, m in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(model, case, seed, times, maps, final, wall=100.0):
    epochs, before = [], 0.0
    for i, (t, m) in enumerate(zip(times, maps)):
        epochs.append({"epoch": i + 1, "time": t, "seconds": round(t - before, 3), "mAP50": m})
        before = t
    return {"model": model, "case": case, "seed": seed, "wall_s": wall, "cpu_s": 2 * wall, "epochs": epochs,
            "final": {"mAP50": final, "mAP50_95": final / 2}}


def test_read_epochs_takes_cumulative_time_apart(ut, tmp_path):
    csv = write_csv(tmp_path / "results.csv", [(1, 10.5, 0.1), (2, 21.0, ""), (3, 33.25, 0.4567)])
    epochs = ut.read_epochs(csv)
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert [e["time"] for e in epochs] == [10.5, 21.0, 33.25]
    assert [e["seconds"] for e in epochs] == [10.5, 10.5, 12.25]
    assert [e["mAP50"] for e in epochs] == [0.1, None, 0.4567]   # an epoch not validated has none


def test_read_epochs_refuses_a_csv_without_ultralytics_columns(ut, tmp_path):
    bad = tmp_path / "results.csv"
    bad.write_text("epoch,epoch_seconds,mAP50\n1,3.0,0.1\n")
    with pytest.raises(SystemExit, match="not an ultralytics-style"):
        ut.read_epochs(bad)


def test_rotation_moves_every_case_one_place_a_seed(ut):
    order = ut.rotation([0, 1, 2], ["a.yaml"], list(ut.CASES))
    assert [c for _, _, c in order] == ["ultralytics", "ppmulti/1", "ppmulti/2",
                                        "ppmulti/1", "ppmulti/2", "ultralytics",
                                        "ppmulti/2", "ultralytics", "ppmulti/1"]
    two = ut.rotation([5, 6], ["a.yaml", "b.yaml"], ["ultralytics", "ppmulti/2"])
    assert two == [(5, "a.yaml", "ultralytics"), (5, "a.yaml", "ppmulti/2"), (5, "b.yaml", "ultralytics"),
                   (5, "b.yaml", "ppmulti/2"), (6, "a.yaml", "ppmulti/2"), (6, "a.yaml", "ultralytics"),
                   (6, "b.yaml", "ppmulti/2"), (6, "b.yaml", "ultralytics")]


def runs_of_one_model():
    """ultralytics 10 s/epoch to 0.6 (mean final 0.6); ppmulti/1 slower and better; ppmulti/2 fast, crossing 0.6 at
    epoch 3 of its mean curve only through the evaluator's final scores."""
    rs = [run("m", "ultralytics", 0, [10, 20, 30], [0.1, 0.3, 0.55], 0.58, wall=40),
          run("m", "ultralytics", 1, [10, 20, 30], [0.1, 0.3, 0.6], 0.62, wall=44),
          run("m", "ppmulti/1", 0, [11, 22, 33], [0.2, 0.4, 0.61], 0.63, wall=45),
          run("m", "ppmulti/1", 1, [11, 22, 33], [0.2, 0.4, 0.59], 0.61, wall=47),
          run("m", "ppmulti/2", 1, [6, 12, 18], [0.3, 0.5, 0.55], 0.62, wall=25),
          run("m", "ppmulti/2", 0, [7, 14, 20], [0.3, None, 0.55], 0.58, wall=27),
          run("other", "ultralytics", 0, [1, 2, 3], [0.9, 0.9, 0.9], 0.9)]
    return {f"{r['model']} {r['case']} seed {r['seed']}": r for r in rs}


def test_summarize_means_over_seeds_and_the_goal_checks(ut):
    s = ut.summarize(runs_of_one_model(), "m")
    u, one, two = (s["cases"][c] for c in ut.CASES)
    assert u["final_mAP50"] == {"mean": 0.6, "min": 0.58, "max": 0.62, "n": 2}
    assert two["seeds"] == [0, 1] and two["final_mAP50_per_seed"] == [0.58, 0.62]
    assert u["own_final_mAP50"]["mean"] == 0.575   # the runs' own last validation, apart from the evaluator's
    assert u["train_s"]["mean"] == 30 and u["wall_s"]["mean"] == 42 and u["s_per_epoch"] == 10
    # ppmulti/2's mean curve: seconds and cumulative time averaged, an epoch one seed did not score has no mean,
    # the last epoch scored by the evaluator (0.58 and 0.62 -> 0.6)
    assert [e["time"] for e in two["mean_curve"]] == [6.5, 13.0, 19.0]
    assert [e["mAP50"] for e in two["mean_curve"]] == [0.3, None, 0.6]
    g = s["goals"]
    assert g["accuracy"]["ok"] and g["accuracy"]["ppmulti"] == 0.62
    assert not g["speed"]["ok"] and g["speed"]["ratio"] == round(46 / 42, 3)
    assert g["scaling"]["reach"] == (19.0, 3) and g["scaling"]["ratio"] == round(19 / 30, 3)
    assert g["scaling"]["ok"] and "0.63 of ultralytics' 30 s" in g["scaling"]["text"]


def test_scaling_fails_when_the_target_is_never_reached_or_late(ut):
    runs = runs_of_one_model()
    for r in runs.values():
        if r["case"] == "ppmulti/2":
            r["final"]["mAP50"] = 0.5
    g = ut.summarize(runs, "m")["goals"]["scaling"]
    assert not g["ok"] and g["reach"] is None and "in none of its epochs" in g["text"]
    for r in runs.values():
        if r["case"] == "ppmulti/2":
            r["final"]["mAP50"] = 0.7
            r["epochs"] = [dict(e, time=e["time"] * 1.5, seconds=e["seconds"] * 1.5) for e in r["epochs"]]
    g = ut.summarize(runs, "m")["goals"]["scaling"]
    assert not g["ok"] and g["ratio"] == round(28.5 / 30, 3)


def test_goals_need_the_cases_they_compare(ut):
    only_u = {k: r for k, r in runs_of_one_model().items() if r["case"] == "ultralytics"}
    assert ut.summarize(only_u, "m")["goals"] == {}
    no_two = {k: r for k, r in runs_of_one_model().items() if r["case"] != "ppmulti/2"}
    assert set(ut.summarize(no_two, "m")["goals"]) == {"accuracy", "speed"}


def test_markdown_has_a_table_per_model_and_pass_fail(ut):
    runs = runs_of_one_model()
    result = {"started": "2026-12-02 15:00", "finished": "2026-12-02 16:00", "commit": "abc123",
              "command": "python bench/ultra_train.py --ultra-python ULTRA_VENV/bin/python",
              "machine": {"cpu": "CPU", "cores": 2, "platform": "Linux", "load_before": 0.1, "load_max": 0.5},
              "versions": {"ultralytics": "8.4.190"},
              "conditions": {"data": "demo", "keys": "imgsz=160", "seeds": [0, 1]},
              "summary": {m: ut.summarize(runs, m) for m in ("m", "other")}}
    md = ut.markdown(result)
    assert "## m" in md and "## other" in md
    assert "| ultralytics | 0.600 (0.580-0.620) | 0.580 / 0.620 | 0.575 | 42 | 30 | 10.0 | 84 |" in md
    assert "- accuracy: **PASS**" in md and "- speed: **FAIL**" in md and "- scaling: **PASS**" in md
    assert "- ppmulti/2, mean mAP50 by epoch: 0.30 @1 (6 s), - @2 (13 s), 0.60 @3 (19 s)" in md
    assert "ultralytics 8.4.190" in md and "commit abc123" in md


def test_a_resumed_bench_keeps_only_runs_of_its_settings(ut):
    settings = {"epochs": 20, "imgsz": 160, "batch": 16, "workers": 2}
    runs = {"a": {"settings": dict(settings)}, "b": {"settings": {**settings, "epochs": 2}}, "c": {}}
    assert ut.stale_runs(runs, settings) == ["b", "c"]
    assert ut.stale_runs({}, settings) == []
    # records from before --ppmulti-keys ran without any: they resume with none, not with sync_bn=True
    assert ut.stale_runs(runs, {**settings, "ppmulti_keys": []}) == ["b", "c"]
    assert ut.stale_runs(runs, {**settings, "ppmulti_keys": ["sync_bn=True"]}) == ["a", "b", "c"]


def test_curve_text_picks_epochs_evenly_down_from_the_last(ut):
    curve = [{"epoch": i, "time": 10.0 * i, "mAP50": i / 100} for i in range(1, 21)]
    assert ut.curve_text(curve) == ("0.04 @4 (40 s), 0.08 @8 (80 s), 0.12 @12 (120 s), 0.16 @16 (160 s), "
                                    "0.20 @20 (200 s)")
    assert ut.curve_text(curve[:2]) == "0.01 @1 (10 s), 0.02 @2 (20 s)"


def test_cases_flag(ut):
    base = ["--ultra-python", "py"]
    assert ut.parse_args(base).cases == list(ut.CASES)
    assert ut.parse_args([*base, "--cases", "ppmulti/2,ultralytics"]).cases == ["ultralytics", "ppmulti/2"]
    for bad in ("ppmulti/3", "ultralytics,ultralytics", ","):
        with pytest.raises(SystemExit):
            ut.parse_args([*base, "--cases", bad])
    assert ut.parse_args([*base, "--seeds", "0,1,2"]).seeds == [0, 1, 2]
