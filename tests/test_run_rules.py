"""Golden rules of a YOLOv5 command line's run: runs/train/exp numbering, bare --resume, the determinism and
cuDNN switches, and CUDA_DEVICE_ORDER for GPU ranks (pure functions: nothing trains here)."""

from __future__ import annotations

import os
import time

import pytest

from ppmulti.common import envvars as E
from ppmulti.common import gpu_switches
from ppmulti.common.errors import UserError
from ppmulti.common.rundir import new_run_dir, newest_run
from ppmulti.common.train_flags import build_parser, run_output
from ppmulti.procs.launch.flags import build_plan, describe, launch_env, parse_launch_args


def _options(*argv):
    from ppmulti.rank.entry import resolve

    return resolve(build_parser().parse_args(list(argv)))


def _path(p) -> str:
    return None if p is None else str(p).replace("\\", "/")


@pytest.mark.parametrize("project, name, yolo, expected", [
    (None, None, True, "runs/train/exp"),      # YOLOv5's default
    (None, None, False, None),                 # -c lines: ppdet's save_dir/<config name>
    ("p", None, False, "p/exp"),
    (None, "n", True, "runs/train/n"),
    ("p", "n", True, "p/n"),
])
def test_run_output_golden(project, name, yolo, expected):
    assert _path(run_output(project, name, yolo)) == expected


@pytest.mark.parametrize("argv, expected", [
    (["--cfg", "yolov5n", "--data", "d.yaml"], "runs/train/exp"),
    (["--data", "d.yaml", "-c", "configs/yolo.yml"], "runs/train/exp"),
    (["--cfg", "yolov5n", "--name", "x", "--project", "p"], "p/x"),
    (["--cfg", "yolov5n", "--output", "o/r"], "o/r"),
    (["-c", "configs/yolo.yml"], None),
    (["-c", "configs/yolo.yml", "--name", "x"], "runs/train/x"),
])
def test_yolov5_command_lines_default_to_runs_train_exp(argv, expected):
    assert _path(_options(*argv).output) == expected


def test_numbering_follows_yolov5_increment_path(tmp_path):
    names = [new_run_dir(tmp_path, "exp").name for _ in range(3)]
    assert names == ["exp", "exp2", "exp3"]
    (tmp_path / "exp2").rmdir()
    assert new_run_dir(tmp_path, "exp").name == "exp2"      # the lowest free number, as YOLOv5
    assert new_run_dir(tmp_path, "exp").name == "exp4"
    (tmp_path / "exp" / "marker").write_text("x")
    again = new_run_dir(tmp_path, "exp", exist_ok=True)     # --exist-ok: the same directory, kept as it is
    assert again == tmp_path / "exp" and (again / "marker").is_file()
    assert new_run_dir(tmp_path / "new", "exp", exist_ok=True).is_dir()


def test_bare_resume_finds_the_newest_run_under_runs_train_and_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    older = tmp_path / "output" / "yolov5_s_300e_coco" / "weights" / "last.pdstate"
    newer = tmp_path / "runs" / "train" / "exp2" / "weights" / "last.pdstate"
    for i, f in enumerate((older, newer)):
        f.parent.mkdir(parents=True)
        f.write_text("x")
        os.utime(f, (time.time() - 100 + i * 50,) * 2)
    assert newest_run(None).resolve() == newer.parent.parent.resolve()
    # a YOLOv5 line without --project/--name searches both roots, not only its default runs/train/exp
    os.utime(older, (time.time() + 10,) * 2)
    assert _path(_options("--cfg", "yolov5n", "--resume").resume) == "output/yolov5_s_300e_coco"
    # --project/--name given: only there
    assert _path(_options("--cfg", "yolov5n", "--resume", "--project", "runs/train").resume) == "runs/train/exp2"


def test_opt_yaml_record_names_the_model():
    opts = _options("--cfg", "yolov5n.yaml", "--data", "d.yaml", "--batch", "32")
    assert opts.record["model"] == "yolov5n.yaml" and opts.record["batch"] == 32 and opts.record["seed"] == 0
    assert _options("-c", "configs/yolo.yml").record is None    # ppdet lines keep ppdet's files only


YOLO, PPDET = True, False


@pytest.mark.parametrize("deterministic, benchmark, yolo, environ, mode", [
    (None, False, YOLO, {}, "deterministic"),            # YOLOv5 trains deterministically by default
    (None, False, PPDET, {}, "default"),                 # ppdet's tools/train.py sets nothing
    (True, False, PPDET, {}, "deterministic"),
    (False, False, YOLO, {}, "default"),                 # --no-deterministic
    (None, True, YOLO, {}, "benchmark"),                 # --cudnn-benchmark wins over the YOLOv5 default
    (None, True, PPDET, {}, "benchmark"),
    (None, False, YOLO, {"FLAGS_cudnn_exhaustive_search": "1"}, "default"),   # the user's own FLAGS_ stand
    (True, False, YOLO, {"FLAGS_cudnn_exhaustive_search": "1"}, "deterministic"),   # an explicit flag wins
])
def test_switch_resolution_golden(deterministic, benchmark, yolo, environ, mode):
    switches = gpu_switches.resolve(deterministic, benchmark, yolo, environ)
    assert switches.mode == mode
    if mode == "deterministic":
        assert switches.flags["FLAGS_cudnn_deterministic"] is True
        assert switches.flags["FLAGS_cudnn_exhaustive_search"] is False   # Paddle refuses both at once
        assert switches.env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    elif mode == "benchmark":
        assert switches.flags == {"FLAGS_cudnn_exhaustive_search": True, "FLAGS_cudnn_deterministic": False}
        assert switches.env == {}
    else:
        assert switches.flags == {} and switches.env == {}


def test_deterministic_and_benchmark_together_are_refused():
    with pytest.raises(UserError, match="--deterministic and --cudnn-benchmark"):
        gpu_switches.resolve(True, True, False, {})
    with pytest.raises(UserError, match="--deterministic and --cudnn-benchmark"):
        _options("--cfg", "yolov5n", "--deterministic", "--cudnn-benchmark")
    assert _options("--cfg", "yolov5n", "--cudnn_benchmark").switches.mode == "benchmark"
    assert _options("--cfg", "yolov5n", "--no-deterministic").switches.mode == "default"


def test_switches_set_only_the_flags_this_paddle_defines():
    from ppmulti.rank import compat

    done, absent = compat.set_defined_flags({"FLAGS_cudnn_deterministic": True, "FLAGS_no_such_flag_x": 1})
    import paddle

    if paddle.is_compiled_with_cuda():
        assert done == ["FLAGS_cudnn_deterministic"]
    else:   # CPU builds define no cuDNN flags: nothing set, nothing raised
        assert "FLAGS_cudnn_deterministic" in absent
    assert "FLAGS_no_such_flag_x" in absent


def _plan(argv):
    return build_plan(parse_launch_args(argv), {}, set(), 4)


def test_gpu_ranks_get_nvidia_smi_order_unless_the_user_chose():
    gpu = _plan(["--gpus", "0,1", "t.py"])
    child, changed, _ = launch_env(gpu, {"PATH": "/bin"})
    assert child[E.CUDA_DEVICE_ORDER] == "PCI_BUS_ID" and changed[E.CUDA_DEVICE_ORDER] == "PCI_BUS_ID"
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in describe(gpu, {"PATH": "/bin"})
    child, changed, _ = launch_env(gpu, {"PATH": "/bin", E.CUDA_DEVICE_ORDER: "FASTEST_FIRST"})
    assert child[E.CUDA_DEVICE_ORDER] == "FASTEST_FIRST" and E.CUDA_DEVICE_ORDER not in changed
    cpu = _plan(["--nproc_per_node", "2", "--device", "cpu", "t.py"])
    assert E.CUDA_DEVICE_ORDER not in launch_env(cpu, {"PATH": "/bin"})[0]
    lone = {}
    E.set_visible_gpu(1, lone)        # one GPU, no launcher (tools/train.py --device 1)
    assert lone == {E.FLAGS_SELECTED_GPUS: "1", E.CUDA_DEVICE_ORDER: "PCI_BUS_ID"}


def test_resume_without_model_flags_reads_the_run(tmp_path, monkeypatch):
    """YOLOv5's `train.py --resume`: no other flag; the run's config.yml is the config, its opt.yaml the flags."""
    import yaml

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "train" / "exp"
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "last.pdstate").write_text("x")
    (run / "config.yml").write_text("epoch: 3\n")
    (run / "opt.yaml").write_text(yaml.safe_dump({"model": "yolov5n", "noval": True, "seed": 5, "save_period": 2,
                                                  "cudnn_benchmark": True}))
    opts = _options("--resume")
    assert _path(opts.resume) == "runs/train/exp" and _path(opts.config) == "runs/train/exp/config.yml"
    assert (opts.seed, opts.save_period, opts.validate, opts.switches.mode) == (5, 2, False, "benchmark")
    assert opts.amp_default and opts.record is None          # a YOLOv5 run; its opt.yaml is kept as written
    assert _options("--resume", "--seed", "9").seed == 9       # a flag given again wins
    assert _path(_options("--resume", "runs/train/exp/weights/last").config) == "runs/train/exp/config.yml"
    (run / "opt.yaml").unlink()                                 # a -c run: its config, ppdet's defaults
    opts = _options("--resume")
    assert _path(opts.config) == "runs/train/exp/config.yml" and not opts.amp_default and opts.seed == 0
    (run / "config.yml").unlink()
    with pytest.raises(UserError, match="no config given"):
        _options("--resume")
