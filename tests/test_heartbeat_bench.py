"""``ppmulti bench --heartbeat``: the same training with and without the watchdog's progress reports, in one run
(the session's quick_bench), and its line in the report."""

import json

import pytest

from ppmulti.procs.bench import report
from test_perf_bench import _result


def test_report_shows_the_progress_reports_cost(tmp_path):
    result = _result()
    result["heartbeat"] = {"model": "m", "ranks": 2, "step_s_with": 2.35, "step_s_without": 2.34,
                           "overhead": 2.35 / 2.34 - 1, "beat_us": 0.6, "beats_per_step": 3,
                           "beat_share_of_step": 0.6e-6 * 3 / 2.35}
    md = report.write(result, tmp_path)["md"].read_text()
    assert ("| watchdog progress reports (m, 2 ranks): step with vs without | 2.350 vs 2.340 s (+0.4%); "
            "3 reports x 0.60 us | 0.0001% of a step | <= 1% |") in md


@pytest.mark.slow
@pytest.mark.multiproc
def test_bench_heartbeat_runs_both_variants(quick_bench):
    """conftest.quick_bench ran the quick bench with --heartbeat: its first model on 2 ranks with and without."""
    h = json.loads((quick_bench / "bench.json").read_text())["heartbeat"]
    assert h["model"] == "ppyoloe_s" and h["ranks"] == 2 and h["step_s_with"] > 0 and h["step_s_without"] > 0
    assert 0 < h["beat_us"] < 1000 and h["beats_per_step"] == 3
    assert "watchdog progress reports (ppyoloe_s, 2 ranks)" in (quick_bench / "bench.md").read_text()
