"""bench/ppdet_trainer.py's reading of the two trainers' logs: step lines in PaddleDetection's and ppmulti's own
formats, the wall time per step over the same window, the data wait and CPU per step, a log too short for the window;
and the override that pins a config's random training size."""

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ppdet_trainer_bench", BENCH / "ppdet_trainer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def ppdet_line(step, steps, batch_cost, data_cost, epoch=0):
    # PaddleDetection's LogPrinter with log_iter=1 (ppdet/engine/callbacks.py), through its logger's format
    return (f"[11/27 21:41:{step:02d}] ppdet.engine INFO: Epoch: [{epoch}] [{step:{len(str(steps))}d}/{steps}] "
            f"learning_rate: 0.055040 loss_vfl: 1.617506 loss_bbox: 1.227831 loss_dfl: 0.928104 loss: 3.773440 "
            f"eta: 0:00:08 batch_cost: {batch_cost:.4f} data_cost: {data_cost:.4f} ips: 5.2107 images/s")


def ppmulti_line(step, steps, data, epoch=1):
    # ppmulti's ConsoleLogHook: 1-based epoch and step; data is the mean wait per step since its last line
    return (f"21:42:{step:02d} INFO epoch {epoch}/1 step {step}/{steps} loss_vfl=1.6127 loss_bbox=1.1779 "
            f"loss_dfl=1.0287 loss=3.8193 lr=0.008 3.1 img/s (global) data {data:.3f}s/step")


def test_ppdet_steps_and_window(bench):
    arrivals = [10.0, 12.0, 14.5, 16.5, 19.0, 21.0]   # step k's line arrives at arrivals[k]
    lines = [(0.0, "[11/27 21:41:00] ppdet.data.source.coco INFO: Load [224 samples valid, 32 samples invalid]")]
    lines += [(t, ppdet_line(k, 28, 1.9 + 0.01 * k, 0.5 if k == 0 else 0.0002)) for k, t in enumerate(arrivals)]
    lines.append((22.0, "[11/27 21:41:44] ppdet.utils.checkpoint INFO: Save checkpoint: output/picodet"))
    steps = bench.parse_steps("ppdet", lines)
    assert [s.index for s in steps] == list(range(6))
    w = bench.window(steps, skip=2, count=3)
    # steps 2, 3, 4: from step 1's line (12.0) to step 4's (19.0)
    assert w.seconds_per_step == pytest.approx(7.0 / 3)
    assert w.steps == [2.5, 2.0, 2.5] and w.median_step == 2.5
    assert w.data_per_step == pytest.approx(0.0002)
    assert w.first_data == 0.5
    assert w.own_per_step == pytest.approx(statistics_mean([1.92, 1.93, 1.94]))


def test_ppmulti_steps_and_their_data_wait(bench):
    waits = [0.44, 0.001, 0.002, 0.003, 0.001]
    lines = [(0.5, "21:41:48 INFO world size 1, global batch 8 (8 per rank) x accumulate 1 = effective batch 8")]
    lines += [(10.0 + 3 * k, ppmulti_line(k + 1, 28, wait)) for k, wait in enumerate(waits)]
    lines.append((30.0, "21:43:48 INFO epoch 1 done in 111.1s, 2.02 img/s, loss=3.9668"))
    steps = bench.parse_steps("ppmulti", lines)
    assert [s.index for s in steps] == [0, 1, 2, 3, 4]
    w = bench.window(steps, skip=1, count=4)
    assert w.seconds_per_step == pytest.approx(3.0)
    assert w.first_data == pytest.approx(0.44)
    assert w.data_per_step == pytest.approx(0.007 / 4)
    assert w.own_per_step is None and w.cpu_per_step is None


def test_cpu_seconds_per_step_from_the_samples_taken_with_the_lines(bench):
    # (process, workers) CPU seconds when each step's line arrived
    cpu = [(5.0, 1.0), (7.0, 1.2), (9.5, 1.5), (11.5, 1.7)]
    lines = [(10.0 + k, ppmulti_line(k + 1, 28, 0.4), c) for k, c in enumerate(cpu)]
    w = bench.window(bench.parse_steps("ppmulti", lines), skip=1, count=3)
    assert w.cpu_per_step == pytest.approx(6.5 / 3) and w.worker_cpu_per_step == pytest.approx(0.7 / 3)
    assert bench._cpu(w.__dict__) == "2.17 + 0.23"


def test_steps_are_counted_over_epochs(bench):
    lines = [(1.0, ppmulti_line(1, 2, 0.4)), (2.0, ppmulti_line(2, 2, 0.1)),
             (3.0, ppmulti_line(1, 2, 0.01, epoch=2)), (4.0, ppmulti_line(2, 2, 0.02, epoch=2))]
    steps = bench.parse_steps("ppmulti", lines)
    assert [s.index for s in steps] == [0, 1, 2, 3]
    assert [round(s.data, 3) for s in steps] == [0.4, 0.1, 0.01, 0.02]
    lines = [(1.0, ppdet_line(0, 2, 1.0, 0.1)), (2.0, ppdet_line(1, 2, 1.0, 0.1)),
             (3.5, ppdet_line(0, 2, 1.0, 0.3, epoch=1))]
    assert [s.index for s in bench.parse_steps("ppdet", lines)] == [0, 1, 2]


def test_a_log_without_the_window_says_which_steps_are_missing(bench):
    # log_iter left at 20: only every 20th step has a line
    lines = [(float(k), ppdet_line(k, 28, 2.0, 0.0)) for k in (0, 20)]
    with pytest.raises(ValueError, match=r"no line for step\(s\) 1, 2, 3, 4 .*log_iter must be 1"):
        bench.window(bench.parse_steps("ppdet", lines), skip=2, count=3)
    with pytest.raises(ValueError, match="skip >= 1"):
        bench.window(bench.parse_steps("ppdet", lines), skip=0, count=3)


def statistics_mean(values):
    return sum(values) / len(values)


def test_the_size_override_pins_the_configs_batch_random_resize(bench, tmp_path):
    # a PaddleDetection-style config: a base reader file, ppdet's tags, the child overriding a key
    (tmp_path / "_base_").mkdir()
    (tmp_path / "_base_" / "reader.yml").write_text(
        "eval_height: &eval_height 320\n"
        "TrainReader:\n"
        "  batch_transforms:\n"
        "  - BatchRandomResize: {target_size: [256, 320, 384], random_size: True, keep_ratio: False}\n"
        "  - NormalizeImage: {mean: [0., 0., 0.], std: [1., 1., 1.], norm_type: none}\n"
        "  batch_size: 64\n")
    (tmp_path / "model.yml").write_text(
        "_BASE_: ['_base_/reader.yml']\n"
        "LearningRate:\n  schedulers:\n  - !CosineDecay\n    max_epochs: 300\n"
        "TrainReader:\n  batch_size: 32\n")
    cfg = bench.read_config(tmp_path / "model.yml")
    assert cfg["TrainReader"]["batch_size"] == 32 and cfg["eval_height"] == 320
    assert cfg["LearningRate"]["schedulers"] == [{"max_epochs": 300}]
    [override] = bench.size_override(tmp_path / "model.yml", "eval")
    key, value = override.split("=", 1)
    ops = yaml.safe_load(value)   # both trainers read -o values as YAML
    assert key == "TrainReader.batch_transforms"
    assert ops[0] == {"BatchRandomResize": {"target_size": [320], "random_size": True, "keep_ratio": False}}
    assert ops[1]["NormalizeImage"]["norm_type"] == "none"
    assert yaml.safe_load(bench.size_override(tmp_path / "model.yml", "288")[0].split("=", 1)[1])[0][
        "BatchRandomResize"]["target_size"] == [288]
    assert bench.size_override(tmp_path / "model.yml", "random") == []


def test_an_rtdetr_config_is_pinned_to_its_eval_size(bench, tmp_path):
    # release/2.7's RT-DETR form: no eval_height, ``eval_size: [h, w]`` in the model file, its reader in another
    # base, tagged schedulers beside (configs/rtdetr/_base_/ in PaddleDetection release/2.7, shortened)
    (tmp_path / "_base_").mkdir()
    (tmp_path / "_base_" / "rtdetr_r50vd.yml").write_text(
        "architecture: DETR\nuse_focal_loss: True\neval_size: [640, 640]\n")
    (tmp_path / "_base_" / "rtdetr_reader.yml").write_text(
        "TrainReader:\n"
        "  sample_transforms:\n  - Decode: {}\n  - RandomDistort: {prob: 0.8}\n"
        "  batch_transforms:\n"
        "  - BatchRandomResize: {target_size: [480, 640, 800], random_size: True, random_interp: True, "
        "keep_ratio: False}\n"
        "  - NormalizeBox: {}\n  - BboxXYXY2XYWH: {}\n"
        "  batch_size: 4\n")
    (tmp_path / "rtdetr_r18vd_6x_coco.yml").write_text(
        "_BASE_: ['_base_/rtdetr_r50vd.yml', '_base_/rtdetr_reader.yml']\n"
        "LearningRate:\n  schedulers:\n  - !PiecewiseDecay {gamma: 1.0, milestones: [100]}\n"
        "ResNet:\n  depth: 18\n")
    config = tmp_path / "rtdetr_r18vd_6x_coco.yml"
    ops = yaml.safe_load(bench.size_override(config, "eval")[0].split("=", 1)[1])
    assert ops[0]["BatchRandomResize"] == {"target_size": [640], "random_size": True, "random_interp": True,
                                           "keep_ratio": False}
    assert [next(iter(op)) for op in ops] == ["BatchRandomResize", "NormalizeBox", "BboxXYXY2XYWH"]
    assert bench.pinned_sizes(config, "320") == {"train": 320, "eval": 640}
    assert bench.pinned_sizes(config, "random") == {"train": None, "eval": 640}
    assert bench.eval_pixels({"eval_height": 416, "eval_size": [640, 640]}) == 416
    assert bench.eval_pixels({}) is None


def test_the_table_header_says_the_pinned_size_and_the_eval_size(bench):
    side = {"seconds_per_step": 10.0, "data_per_step": 0.001, "cpu_per_step": None, "own_per_step": 9.9}
    config = "configs/rtdetr/rtdetr_r18vd_6x_coco.yml"
    result = {"configs": [{"config": config, "rounds": [{"ppdet": side, "ppmulti": {**side, "seconds_per_step": 8.0},
                                                         "ratio": 1.25}],
                           "median_ppdet": 10.0, "median_ppmulti": 8.0, "median_ratio": 1.25}],
              "machine": {"cpu": "cpu", "cores": 2, "memory_gib": 23.5, "python": "3.10.13"},
              "command": "python bench/ppdet_trainer.py --size 320", "date": "2026-12-02 17:05 UTC",
              "versions": {"paddle": "2.6.2"}, "load_average": [0.1, 1.2], "overrides": ["use_gpu=false"],
              "window": [1, 6], "size": "320", "sizes": {config: {"train": 320, "eval": 640}}}
    table = bench.markdown(result)
    assert f"; {config}: 320 px (its eval size 640 px)." in table
    assert f"| {config} | median | 10.000 | 8.000 | **1.250** |" in table
