"""``ppmulti bench --quick`` for real: every probe runs as real processes (2 gloo ranks included), and the
table, JSON and PNG come out with every row and positive numbers. Also the report from a fixed result."""

import json
import re

import pytest

from ppmulti.procs.bench import report


@pytest.mark.slow
@pytest.mark.multiproc
def test_bench_quick_measures_every_row(quick_bench):
    """Without --out the report lands in a fresh runs/bench/exp of the current directory, nothing in the source tree."""
    out = quick_bench
    assert "results go to runs/bench/exp" in (out.parents[2] / "console.txt").read_text()
    before, after = (out.parents[2] / "source_tree.txt").read_text().split("\n--\n")
    assert before == after
    md = (out / "bench.md").read_text()
    rows = [line for line in md.splitlines() if re.match(r"^\| (ppyoloe_s|yolov5s) \| [12] \|", line)]
    assert len(rows) == 4, md
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        img_s, step, first, rss = float(cells[3]), cells[5], cells[6], cells[7]
        assert img_s > 0, line
        assert float(step.split()[0]) > 0 and float(first.split()[0]) > 0, line
        ranks = int(cells[1])
        assert len(rss.split(" / ")) == ranks and all(float(v.split()[0]) > 100 for v in rss.split(" / ")), line
    for label in ("ppmulti loop vs ppdet's Trainer", "data loader alone vs what the model consumes",
                  "2 ranks vs 1 (ppyoloe_s)", "2 ranks vs 1 (yolov5s)", "gloo all-reduce"):
        assert label in md, label
    data = json.loads((out / "bench.json").read_text())
    assert data["ppdet"]["ppdet_img_s"] > 0 and data["ppdet"]["ratio"] > 0
    # like for like: ppdet's Trainer ran on the same convolution kernel as ppmulti's loop
    kernels = data["ppdet"]["conv_kernels"]
    assert len(kernels) == 1 and kernels[0].startswith(("oneDNN", "Paddle's conv2d")), kernels
    assert data["loader"]["loader_img_s"] > 0 and data["loader"]["ratio"] > 0
    assert data["allreduce"]["seconds"] > 0 and data["allreduce"]["bytes"] == 4 * data["rows"][0]["params"]
    two = [row for row in data["rows"] if row["ranks"] == 2]
    assert all(row["speedup"] > 0 and row["threads"] == 1 for row in two)   # 2 cores / 2 ranks
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _result():
    row = {"model": "m", "ranks": 1, "img_s": 4.0, "step_s": 2.0, "launch_to_first_step_s": 9.5,
           "peak_rss_mb": [600.0], "cpu_util": 0.9, "data_wait_s": 0.01, "threads": 2, "params": 100}
    two = dict(row, ranks=2, img_s=6.8, step_s=2.35, peak_rss_mb=[610.0, 605.0], threads=1, speedup=1.7)
    return {"plan": {"img": 160, "batch": 8, "steps": 12, "warmup": 2, "workers": 1, "repeat": 3},
            "machine": {"cores": 2, "load_1min": 0.5}, "rows": [row, two],
            "ppdet": {"model": "m", "ppdet_img_s": 4.1, "ppmulti_img_s": 4.0, "ratio": 4.0 / 4.1},
            "loader": {"model": "m", "loader_img_s": 40.0, "model_img_s": 4.0, "ratio": 10.0, "worker_num": 1},
            "allreduce": {"model": "m", "ranks": 2, "bytes": 400, "seconds": 0.02, "share_of_step": 0.0085,
                          "effective_GB_s": 0.00002}}


def test_report_from_a_fixed_result(tmp_path):
    paths = report.write(_result(), tmp_path)
    md = paths["md"].read_text()
    assert "| m | 1 | 2 | 4.00 | 1.00x | 2000 ms | 9.5 s | 600 MB | 0.90 cores | 10 ms |" in md
    assert "| m | 2 | 1 | 6.80 | 1.70x | 2350 ms | 9.5 s | 610 MB / 605 MB |" in md
    assert "| 4.00 vs 4.10 img/s | 0.98 | >= 0.97 |" in md
    assert "40.0 vs 4.00 img/s | 10.0x | >= 3x |" in md
    assert "| 2 ranks vs 1 (m) | 6.80 vs 4.00 img/s | 1.70x | >= 1.7x |" in md
    assert "median of 3 interleaved round(s)" in md
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert json.loads(paths["json"].read_text())["rows"][1]["speedup"] == 1.7
