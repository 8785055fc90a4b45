"""YOLOv5 train.py flags: each one's effect on the resolved config, refusals by name, and a real short run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from ppmulti.rank import yolo_config as yolo_flags
from ppmulti.common.errors import UserError
from ppmulti.common.train_flags import build_parser, parse
from ppmulti.common.yamlread import reader_ops
from ppmulti.rank.entry import resolve
from ppmulti.rank.yolo_config import apply_edit


def _args(*argv):
    return build_parser().parse_args(list(argv))


def _edited(*argv):
    from ppmulti.rank import config

    args = _args(*argv)
    opts = resolve(args)
    cfg = config.load(opts.config, opts.overrides)
    notes = apply_edit(cfg, opts.edit) if opts.edit else []
    return cfg, opts, notes


@pytest.mark.parametrize("name, expected", [
    ("yolov5s", "yolov5/yolov5_s_300e_coco.yml"), ("yolov5n.yaml", "yolov5/yolov5_n_300e_coco.yml"),
    ("models/yolov5x.yaml", "yolov5/yolov5_x_300e_coco.yml"), ("ppyoloe_s", "ppyoloe/ppyoloe_crn_s_300e_coco.yml"),
    ("ppyoloe-l", "ppyoloe/ppyoloe_crn_l_300e_coco.yml"),
])
def test_cfg_names_resolve_to_shipped_configs(name, expected):
    assert yolo_flags.resolve_cfg(name).config.endswith(expected)


def test_cfg_unknown_name_and_yolov5_model_yaml(tmp_path):
    with pytest.raises(UserError, match="not a model name ppmulti knows"):
        yolo_flags.resolve_cfg("yolov9z")
    model = tmp_path / "m.yaml"
    model.write_text("nc: 4\ndepth_multiple: 0.33\nwidth_multiple: 0.5\nanchors:\n  - [10,13, 16,30, 33,23]\n"
                     "  - [30,61, 62,45, 59,119]\n  - [116,90, 156,198, 373,326]\n"
                     "backbone: [" + ", ".join(["[]"] * 10) + "]\nhead: [" + ", ".join(["[]"] * 15) + "]\n")
    choice = yolo_flags.resolve_cfg(str(model))
    assert choice.overrides["depth_mult"] == 0.33 and choice.overrides["width_mult"] == 0.5
    assert choice.overrides["YOLOv5Head"]["anchors"][2] == [[116, 90], [156, 198], [373, 326]]
    assert choice.overrides["num_classes"] == 4
    model.write_text("depth_multiple: 1\nwidth_multiple: 1\nanchors: 3\nbackbone: []\nhead: []\n")
    with pytest.raises(UserError, match="v6 P5"):
        yolo_flags.resolve_cfg(str(model))


def test_model_yaml_reaches_the_built_config(tmp_path):
    model = tmp_path / "yolov5-custom.yaml"
    model.write_text("depth_multiple: 0.33\nwidth_multiple: 0.25\n"
                     "backbone: [" + ", ".join(["[]"] * 10) + "]\nhead: [" + ", ".join(["[]"] * 15) + "]\n")
    cfg, _, _ = _edited("--cfg", str(model))
    assert cfg["width_mult"] == 0.25 and cfg["depth_mult"] == 0.33


def test_hyp_optimizer_schedule_and_imgsz(repo):
    cfg, opts, notes = _edited("--cfg", "yolov5n", "--hyp", str(repo / "configs/hyps/hyp.scratch-med.yaml"),
                               "--optimizer", "AdamW", "--img", "320", "--label-smoothing", "0.1")
    assert cfg["LearningRate"]["base_lr"] == 0.01
    assert cfg["OptimizerBuilder"]["optimizer"] == {"type": "AdamW", "beta1": 0.937, "beta2": 0.999,
                                                     "weight_decay": 0.0005}
    assert cfg["OptimizerBuilder"]["regularizer"] is None
    decay = cfg["LearningRate"]["schedulers"][0]
    assert decay["name"] == "LinearDecay" and decay["min_lr_ratio"] == 0.1   # YOLOv5's default linear, lrf 0.1
    assert cfg["YOLOv5Loss"]["loss_weight"] == {"box": 0.05, "obj": 0.7, "cls": 0.3}
    assert cfg["YOLOv5Loss"]["label_smoothing"] == 0.1 and cfg["YOLOv5Loss"]["img_size"] == 320
    ops = {k: v for op in cfg["TrainReader"]["sample_transforms"] for k, v in op.items()}
    mosaic = ops["YOLOv5Mosaic"]   # YOLOv5's hyp values, written unchanged onto ppmulti's YOLOv5 ops
    assert mosaic["img_size"] == 320 and mosaic["scale"] == 0.9 and mosaic["translate"] == 0.1
    assert mosaic["mixup"] == 0.1 and mosaic["prob"] == 1.0 and mosaic["perspective"] == 0.0
    assert ops["YOLOv5HSV"] == {"hgain": 0.015, "sgain": 0.7, "vgain": 0.4, "on_device": "auto"}
    assert ops["YOLOv5Flip"] == {"fliplr": 0.5, "flipud": 0.0}
    assert not any("perspective" in n or "flipud" in n for n in notes)   # both have an effect now
    assert cfg["eval_size"] == [320, 320]
    assert (cfg["warmup_bias_lr"], cfg["warmup_momentum"]) == (0.1, 0.8)   # YOLOv5's warmup (hooks.warmup)
    assert not any("warmup" in n for n in notes) and opts.validate   # YOLOv5 style validates each epoch


def test_sgd_cos_lr_and_ppyoloe_scaling(repo):
    cfg, _, notes = _edited("-c", str(repo / "configs/demo/ppyoloe_demo.yml"), "--optimizer", "SGD", "--cos-lr",
                            "--img", "320", "--hyp", str(repo / "configs/hyps/hyp.scratch-low.yaml"))
    assert cfg["OptimizerBuilder"]["optimizer"] == {"type": "Momentum", "momentum": 0.937, "use_nesterov": True}
    assert cfg["OptimizerBuilder"]["regularizer"] == {"type": "L2", "factor": 0.0005}
    assert cfg["LearningRate"]["schedulers"][0]["name"] == "CosineDecay"
    resize = cfg["TrainReader"]["batch_transforms"][0]["BatchRandomResize"]
    assert resize["target_size"] == [256, 320]          # 128/160 at eval 160, doubled
    assert any("YOLOv5 loss gain" in n for n in notes)   # PP-YOLOE keeps its own loss weights
    # YOLOv5's check_img_size (train.py: floor 2 x the max stride): rounded up and said, not refused
    cfg, opts, _ = _edited("--cfg", "yolov5n", "--img", "100")
    assert opts.edit.imgsz == 128 and cfg["eval_height"] == 128


def test_run_dir_flags_and_weights_from_scratch():
    opts = resolve(_args("--cfg", "yolov5s", "--project", "p", "--name", "n", "--weights", "",
                                   "--noval", "--nosave", "--save-period", "3", "--freeze", "10"))
    assert opts.output.replace("\\", "/") == "p/n" and "pretrain_weights=" in opts.overrides
    assert not opts.validate and opts.nosave and opts.save_period == 3 and opts.freeze == (10,)
    assert resolve(_args("--cfg", "yolov5s", "--name", "x")).output.replace("\\", "/") == "runs/train/x"
    with pytest.raises(UserError, match="not both"):
        resolve(_args("-c", "a.yml", "--cfg", "yolov5s"))
    with pytest.raises(UserError, match="--patience needs validation"):
        resolve(_args("--cfg", "yolov5s", "--noval", "--patience", "5"))


@pytest.mark.parametrize("argv, message", [
    (["--quad"], "--quad is a YOLOv5 flag that ppmulti does not support"),
    (["--bogus"], "unknown flag --bogus"),
])
def test_unsupported_flags_are_refused_by_name(argv, message):
    with pytest.raises(UserError, match=message):
        parse(["--cfg", "yolov5n", *argv])


def test_cache_flag_as_yolov5_spells_it():
    assert parse(["--cfg", "yolov5n"]).cache is None
    assert parse(["--cfg", "yolov5n", "--cache"]).cache == "ram"       # bare --cache is ram, as in YOLOv5
    assert parse(["--cfg", "yolov5n", "--cache", "disk"]).cache == "disk"
    assert resolve(_args("--cfg", "yolov5n", "--cache", "ram")).cache == "ram"
    with pytest.raises(SystemExit):
        parse(["--cfg", "yolov5n", "--cache", "gpu"])


def test_mosaic_buffer_flag_reaches_the_mosaic_op(repo):
    def buffer(*argv):
        cfg, _, _ = _edited("--cfg", "yolov5n", *argv)
        return reader_ops(cfg, "YOLOv5Mosaic")[0]["buffer"]

    assert buffer() == 0                                  # the reader's own value: YOLOv5's draw
    assert buffer("--mosaic-buffer", "64") == 64
    assert buffer("--mosaic_buffer", "0") == 0            # 0 is a value, not "not given"
    with pytest.raises(UserError, match="--mosaic-buffer -1"):
        buffer("--mosaic-buffer", "-1")
    with pytest.raises(UserError, match="needs the YOLOv5 reader"):
        _edited("-c", str(repo / "configs/demo/ppyoloe_demo.yml"), "--mosaic-buffer", "0")


def test_unsupported_flag_exits_2_with_one_line(repo):
    out = subprocess.run([sys.executable, str(repo / "tools/train.py"), "--cfg", "yolov5n", "--quad"],
                         capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "numba" not in ln]
    assert out.returncode == 2 and lines == [lines[0]] and "--quad" in lines[0] and "Traceback" not in out.stderr


def test_bad_hyp_file(tmp_path):
    bad = tmp_path / "h.yaml"
    bad.write_text("lr0: 0.01\nlearning_rate: 3\n")
    with pytest.raises(UserError, match="unknown hyperparameter 'learning_rate'"):
        yolo_flags.load_hyp(str(bad))
    with pytest.raises(UserError, match="file not found"):
        yolo_flags.load_hyp(str(tmp_path / "none.yaml"))


def test_linear_decay_ends_at_lrf():
    from ppmulti.rank.ppdet_bridge import LinearDecay

    sched = LinearDecay(max_epochs=2, min_lr_ratio=0.1)(1.0, [1, 2], [0.0, 0.5, 1.0], 5)
    seen = []
    for _ in range(10):
        seen.append(round(sched.get_lr(), 4))
        sched.step()
    assert seen[:3] == [0.0, 0.5, 1.0] and seen[-1] == 0.1 and seen == sorted(seen[:3]) + sorted(seen[3:], reverse=True)


def test_freeze_first_layers_of_the_backbone(repo):
    from ppdet.core.workspace import create

    from ppmulti.rank import config
    from ppmulti.rank.engine.trainer import freeze_backbone

    cfg = config.load(repo / "configs/yolov5/yolov5_n_300e_coco.yml")
    model = create(cfg.architecture)
    neck_trainable = sum(not p.stop_gradient for p in model.neck.parameters())
    assert len(freeze_backbone(model, [10])) == 10
    assert all(p.stop_gradient for p in model.backbone.parameters())
    assert sum(not p.stop_gradient for p in model.neck.parameters()) == neck_trainable > 0
    with pytest.raises(UserError, match="layers 0..9"):
        freeze_backbone(model, [3, 12])


@pytest.mark.slow
def test_short_yolov5_training_from_flags(yolov5_run):
    """The README's YOLOv5 line, tiny (conftest.yolov5_run): YOLO data, --cfg by name, --hyp, --img, --cos-lr,
    --save-period, --noplots, PROJECT/exp."""
    run = yolov5_run.path
    assert run == yolov5_run.cwd / "exp"                               # --project and --name
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["epochs"] == 4 and 0.0 <= metrics["mAP50"] <= 1.0
    rows = (run / "results.csv").read_text().splitlines()
    assert len(rows) == 5 and all(r.split(",")[3] != "" for r in rows[1:])   # validated every epoch (the default)
    assert all((run / "weights" / f"epoch{e}.pdparams").is_file() for e in (1, 2, 3, 4))   # --save-period 1
    assert not (run / "results.png").exists() and not (run / "PR_curve.png").exists()   # --noplots
    log = (run / "train.log").read_text()
    assert "train: 48 images" in log and "has no effect here" not in log   # hyp.scratch-low: every key acts
    assert "YOLOv5's warmup, first 8 batches: batches per optimizer step from 1 to" in log   # a third of 4 x 6
    resolved = (run / "config.yml").read_text()
    assert "YOLODataSet" in resolved and "num_classes: 3" in resolved
    hyp = yaml.safe_load((REPO / "configs/hyps/hyp.demo.yaml").read_text())
    assert yaml.safe_load((run / "hyp.yaml").read_text()) == hyp                  # the hyps, beside opt.yaml


def test_ppdet_dataset_yml_with_base_as_data(tmp_path, repo):
    """--data with a ppdet dataset .yml that only says what differs from its _BASE_ file."""
    data = tmp_path / "my_coco.yml"
    data.write_text(f"_BASE_: ['{repo / 'configs/datasets/demo_coco.yml'}']\n"
                    "TrainDataset:\n  dataset_dir: /data/shapes\n")
    cfg, _, _ = _edited("--cfg", "yolov5n", "--data", str(data))
    assert cfg.TrainDataset["dataset_dir"] == "/data/shapes"                       # the file's own value
    assert cfg.TrainDataset["anno_path"] == "annotations/instances_train.json"     # from its base
    assert cfg.EvalDataset["dataset_dir"] == "dataset/demo" and cfg["num_classes"] == 3
    data.write_text("_BASE_: ['missing_base.yml']\n")
    with pytest.raises(UserError, match="missing_base.yml"):
        _edited("--cfg", "yolov5n", "--data", str(data))


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_hyp_yaml_without_hyp_is_what_the_config_trains_with(repo, optimizer):
    """A YOLOv5 line without --hyp writes hyp.yaml too (YOLOv5 writes its default hyps): read back from the resolved
    config, a config given hyp.scratch-low's values gives those values back, key for key."""
    low = yaml.safe_load((repo / "configs/hyps/hyp.scratch-low.yaml").read_text())
    cfg, _, _ = _edited("--cfg", "yolov5n", "--optimizer", optimizer, "--hyp",
                        str(repo / "configs/hyps/hyp.scratch-low.yaml"))
    read = yolo_flags.read_hyp(cfg)
    mapped = {k: float(v) for k, v in low.items() if k in read}
    assert read == mapped
    assert {"lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "box", "cls", "obj", "hsv_h", "mosaic",
            "fliplr", "scale", "translate"} <= set(read)
    bare, _, _ = _edited("--cfg", "yolov5n")                  # no --hyp: the shipped config's own values
    assert yolo_flags.read_hyp(bare)["lr0"] == bare["LearningRate"]["base_lr"]
