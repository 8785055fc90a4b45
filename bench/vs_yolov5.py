"""Images/s of ppmulti's YOLOv5s against ultralytics/yolov5's own train.py on this CPU, side by side in one run.

What is compared
    The same YOLO-format demo data, image size, global batch, epochs and hyp file (hyp.scratch-low: mosaic,
    HSV, flip), on CPU, from scratch (``--weights ''``):
      * yolov5    -- ultralytics/yolov5's real ``train.py`` (its ``train.main``), one process. YOLOv5 refuses
                     DDP on CPU, so one process is the only way it trains here; torch spreads it over the cores.
      * ppmulti/1 -- ``tools/train.py --cfg yolov5s``, one process (the per-process comparison).
      * ppmulti/N -- the same with ``--nproc N`` gloo ranks (how a user runs ppmulti on an N-core machine).
    Throughput = training images / training seconds, evaluation excluded, the first (warm-up) epoch of every
    run excluded. YOLOv5's seconds are taken from its own callback hooks ``on_train_epoch_start`` ->
    ``on_train_epoch_end`` (data loading, forward, loss, backward, optimizer, scheduler; the validation that
    YOLOv5 runs after its last epoch even under --noval comes after that hook), its images counted in
    ``on_train_batch_end``. ppmulti's come from results.csv (images_per_s x epoch_seconds per epoch, measured
    the same way around its epoch loop). The cases alternate (A B C A B C ...) so background load hits all.
    Threads: torch takes every core in YOLOv5's one process (reported from torch.get_num_threads() inside the
    run); ppmulti's ranks are pinned to cores // ranks through PPMULTI_CPU_THREADS (--threads-auto: ppmulti's
    own rule, the same share unless PPMULTI_CPU_THREADS is set in the environment).
    Both accumulate gradients to YOLOv5's nominal batch of 64 (one optimizer step per 4 batches of 16 once the
    100-iteration warm-up is over): ppmulti does so for a YOLOv5 command line, as here.

Getting YOLOv5 (never a ppmulti dependency)
    git clone https://github.com/ultralytics/yolov5 /path/to/yolov5
    python bench/vs_yolov5.py --yolov5 /path/to/yolov5
    The script makes its own venv (default bench/.venv-yolov5, git-ignored) with ``python -m venv`` and pip
    installs torch (``--torch torch==2.13.0``: the CPU build this machine has; choose yours), torchvision with
    ``--no-deps`` (so pip cannot swap torch), then YOLOv5's requirements.txt constrained to those two.
    Nothing goes into ppmulti's environment.

Offline (this machine reaches PyPI only), set for the YOLOv5 run:
    YOLO_OFFLINE=1          ultralytics' is_online() answers False without probing DNS
    YOLO_AUTOINSTALL=false, YOLOv5_AUTOINSTALL=false   requirement checks never pip-install
    YOLOV5_CONFIG_DIR, YOLO_CONFIG_DIR = <run dir>/config   settings stay out of ~/.config
    Arial.ttf -- YOLOv5's check_dataset() downloads this font unless the config dir has it; the bench puts
                 matplotlib's DejaVuSans.ttf there under that name (only plots use it; --noplots is given).
    check_git_status() is left as it is: it skips a checkout without .git, and in a clone its online probe
    fails (two 5 s connection attempts) before training starts.

torchvision (stated in the output as well)
    PyPI's linux torchvision wheels are CUDA builds: with the CPU torch, torchvision's C++ ops (_C.so) cannot
    load (libtorch_cuda.so missing) and ``import torchvision`` then fails on its own fake registration of
    ``torchvision::nms``. When -- and only when -- _C.so does not load, the YOLOv5 worker registers the schema
    of ``torchvision::nms``/``qnms`` with a pure-torch greedy NMS kernel before importing torchvision, and points
    ``torchvision.ops.nms`` at it. YOLOv5 calls NMS only in validation (after its last epoch here), never in
    the timed training epochs; everything else of torchvision (transforms, datasets) is the real package.

Run:  python bench/vs_yolov5.py --yolov5 DIR [--img 160 320] [--epochs 3] [--rounds 2] [--nproc 2] [--amp]
Writes bench/results/vs_yolov5.json (--out) and prints a markdown table.
      python bench/vs_yolov5.py --yolov5 DIR --check-convert
checks tools/convert_yolov5.py instead: a random yolov5s made in the YOLOv5 venv, converted and run by ppmulti in
a second venv (bench/.venv-convert: ppmulti's site-packages plus torch); max |difference| of the raw head outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO / "bench" / ".venv-yolov5"
HYP = "hyp.scratch-low.yaml"
OFFLINE_ENV = {"YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "false", "YOLOv5_AUTOINSTALL": "false"}


# ============================================================================ YOLOv5 side (runs in the venv)
# Only the standard library and torch here: this part runs under the venv's python, without ppmulti.

def _greedy_nms(boxes, scores, iou_threshold: float):
    """Pure-torch NMS: indices of kept boxes, highest score first (torchvision.ops.nms's contract)."""
    import torch

    order = scores.argsort(descending=True)
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    keep = []
    while order.numel():
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        h = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter).clamp(min=1e-12)
        order = rest[iou <= iou_threshold]
    return torch.stack(keep) if keep else torch.empty(0, dtype=torch.long, device=boxes.device)


_SHIM_LIB = None   # the torch.library handle must outlive the registration


def _torchvision_nms_shim() -> str | None:
    """Make ``import torchvision`` work when its C++ ops cannot load; returns what was done, or None."""
    global _SHIM_LIB
    import importlib.util

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib_path = Path(list(spec.submodule_search_locations)[0]) / "_C.so"
    try:
        torch.ops.load_library(str(lib_path))
        return None                     # a working torchvision: nothing to do
    except (OSError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0].replace(str(lib_path), "torchvision/_C.so")   # no machine paths in results
    _SHIM_LIB = torch.library.Library("torchvision", "DEF")
    _SHIM_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _SHIM_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _SHIM_LIB.impl("nms", _greedy_nms, "CPU")
    import torchvision
    import torchvision.ops
    import torchvision.ops.boxes

    def nms(boxes, scores, iou_threshold):
        return torch.ops.torchvision.nms(boxes, scores, float(iou_threshold))

    torchvision.ops.nms = nms
    torchvision.ops.boxes.nms = nms
    return (f"torchvision {torchvision.__version__}: its C++ ops did not load ({reason}); "
            f"torchvision::nms registered with a pure-torch CPU kernel (used by validation only)")


def _offline_yolov5(a: argparse.Namespace) -> tuple[Path, Path, Path]:
    """(YOLOv5 venv) A mode's --out, --yolov5 checkout and config dir (<out>/config, made here), with YOLOv5's
    offline environment set in this process: OFFLINE_ENV and its settings kept in that config dir."""
    out, yolov5 = Path(a.out), Path(a.yolov5).resolve()
    config = out / "config"
    config.mkdir(parents=True, exist_ok=True)
    os.environ.update(OFFLINE_ENV, YOLOV5_CONFIG_DIR=str(config), YOLO_CONFIG_DIR=str(config))
    return out, yolov5, config


def _worker(argv: list[str]) -> None:
    """Run YOLOv5's train.main with timing hooks; write epochs.json in --out."""
    p = argparse.ArgumentParser(prog="vs_yolov5.py yolov5-worker")
    p.add_argument("--yolov5", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--img", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    out, yolov5, config = _offline_yolov5(a)
    import matplotlib

    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not (config / "Arial.ttf").exists():
        shutil.copyfile(font, config / "Arial.ttf")
    shim = _torchvision_nms_shim()

    import torch

    sys.path.insert(0, str(yolov5))
    sys.argv = ["train.py", "--data", a.data, "--cfg", "yolov5s.yaml", "--weights", "", "--hyp",
                str(yolov5 / "data" / "hyps" / HYP), "--img", str(a.img), "--batch-size", str(a.batch),
                "--epochs", str(a.epochs), "--device", "cpu", "--workers", str(a.workers), "--noval",
                "--noplots", "--nosave", "--exist-ok", "--project", str(out), "--name", "yolov5"]
    import train as yolov5_train
    from utils.callbacks import Callbacks

    epochs: list[dict] = []
    state = {"t0": 0.0, "images": 0, "threads": None}

    def on_train_start(*_args, **_kw):
        state["threads"] = torch.get_num_threads()

    def on_epoch_start(*_args, **_kw):
        state["images"], state["t0"] = 0, time.perf_counter()

    def on_batch_end(_model, _ni, imgs, *_args, **_kw):
        state["images"] += int(imgs.shape[0])

    def on_epoch_end(*_args, epoch=None, **_kw):
        epochs.append({"epoch": int(epoch) + 1, "images": state["images"],
                       "seconds": round(time.perf_counter() - state["t0"], 4)})

    callbacks = Callbacks()
    callbacks.register_action("on_train_start", "bench", on_train_start)
    callbacks.register_action("on_train_epoch_start", "bench", on_epoch_start)
    callbacks.register_action("on_train_batch_end", "bench", on_batch_end)
    callbacks.register_action("on_train_epoch_end", "bench", on_epoch_end)
    yolov5_train.main(yolov5_train.parse_opt(known=True), callbacks=callbacks)
    import torchvision

    info = {"epochs": epochs, "torch_threads": state["threads"], "torch": torch.__version__,
            "torchvision": torchvision.__version__, "torchvision_shim": shim, "argv": sys.argv[1:]}
    (out / "epochs.json").write_text(json.dumps(info, indent=1))   # scratch file in a temp dir


def _convert_reference(argv: list[str]) -> None:
    """(YOLOv5 venv) A random yolov5s with non-trivial BN statistics: sd.pt, ckpt.pt (train.py layout), ref.npz."""
    p = argparse.ArgumentParser(prog="vs_yolov5.py convert-reference")
    p.add_argument("--yolov5", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    out, yolov5, _config = _offline_yolov5(a)
    _torchvision_nms_shim()
    sys.path.insert(0, str(yolov5))
    from copy import deepcopy

    import numpy as np
    import torch
    from models.yolo import Model

    torch.manual_seed(0)
    model = Model(str(yolov5 / "models" / "yolov5s.yaml"), ch=3, nc=3)
    g = torch.Generator().manual_seed(1)
    for m in model.modules():   # fresh BN (mean 0, var 1, weight 1) would hide a swapped buffer
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.data = torch.rand(m.weight.shape, generator=g) + 0.5
            m.bias.data = torch.randn(m.bias.shape, generator=g) * 0.1
            m.running_mean = torch.randn(m.running_mean.shape, generator=g) * 0.1
            m.running_var = torch.rand(m.running_var.shape, generator=g) + 0.5
    model.eval()
    x = np.random.RandomState(0).rand(2, 3, 160, 160).astype("float32")
    half = deepcopy(model).half()
    with torch.no_grad():
        raw = model(torch.from_numpy(x))[1]                 # eval Detect: (decoded, raw [B, na, H, W, no])
        raw16 = deepcopy(half).float()(torch.from_numpy(x))[1]
    torch.save(model.state_dict(), out / "sd.pt")
    torch.save({"epoch": 0, "model": half, "ema": deepcopy(half), "optimizer": None}, out / "ckpt.pt")
    np.savez(out / "ref.npz", x=x, **{f"sd{i}": r.numpy() for i, r in enumerate(raw)},
             **{f"ckpt{i}": r.numpy() for i, r in enumerate(raw16)})


def _convert_compare(argv: list[str]) -> None:
    """(project python + torch) Convert sd.pt and ckpt.pt; ppmulti's raw head outputs vs YOLOv5's."""
    p = argparse.ArgumentParser(prog="vs_yolov5.py convert-compare")
    p.add_argument("--out", required=True)
    out = Path(p.parse_args(argv).out)
    import numpy as np
    import paddle

    from ppmulti.rank.engine.pretrained import convert_file

    ref = np.load(out / "ref.npz")
    report = {}
    for name in ("sd", "ckpt"):
        info = convert_file(str(out / f"{name}.pt"), str(out / f"{name}.pdparams"), "yolov5s")
        import ppmulti.rank.models  # noqa: F401  (registers the model)
        from ppdet.core.workspace import create

        from ppmulti.rank import config as config_mod
        from ppmulti.rank.engine.checkpoint import load_weights

        cfg = config_mod.load(REPO / "configs" / "yolov5" / "yolov5_s_300e_coco.yml", {"num_classes": 3})
        model = create(cfg.architecture)
        missing, unexpected = load_weights(model, out / f"{name}.pdparams")
        model.eval()
        with paddle.no_grad():
            heads = model.yolo_head(model.neck(model.backbone({"image": paddle.to_tensor(ref["x"])})))
        diffs = []
        for i, h in enumerate(heads):
            b, c, hh, ww = h.shape
            ours = h.numpy().reshape(b, 3, c // 3, hh, ww).transpose(0, 1, 3, 4, 2)   # YOLOv5's raw layout
            diffs.append(float(np.abs(ours - ref[f"{name}{i}"]).max()))
        report[name] = {"parameters": info["parameters"], "missing": len(missing), "unexpected": len(unexpected),
                        "max_abs_diff_per_level": diffs,
                        "max_abs_output_per_level": [float(np.abs(ref[f"{name}{i}"]).max()) for i in range(3)]}
    (out / "compare.json").write_text(json.dumps(report))


# ============================================================================ driver (ppmulti's environment)

def _run(cmd: list[str], log: Path, env: dict | None = None, cwd: Path = REPO) -> None:
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n--- last lines of {log}:\n{tail}")


def portable(argv: list[str]) -> list[str]:
    """A bench's command line as its results record it: this machine's paths (checkout, venvs, data, output)
    as DIR."""
    out, paths = [], ("--yolov5", "--venv", "--convert-venv", "--data", "--out")
    for i, arg in enumerate(argv):
        out.append("DIR" if i and argv[i - 1] in paths else arg)
    return out


def _run_env() -> dict:
    """The environment of a timed run's process (the YOLOv5 worker, ppmulti's train.py): this one's, without
    PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _venv(venv: Path, wanted: str, installs: list[list[str]], system_site_packages: bool = False,
          constraints: str | None = None, note: str | None = None) -> Path:
    """``venv``'s python, set up unless its .ready marker already reads ``wanted``: the venv made if it has no
    python (``python -m venv``), ``constraints`` written to <venv>/constraints.txt, ``note`` printed, each of
    ``installs`` pip-installed in order (``pip install -q ARGS``), then the marker written."""
    python = venv / "bin" / "python"
    marker = venv / ".ready"
    if marker.exists() and marker.read_text() == wanted:
        return python
    if not python.exists():
        site = ["--system-site-packages"] if system_site_packages else []
        subprocess.run([sys.executable, "-m", "venv", *site, str(venv)], check=True)
    if constraints is not None:
        (venv / "constraints.txt").write_text(constraints)
    if note:
        print(note, flush=True)
    for args in installs:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True)
    marker.write_text(wanted)
    return python


def ensure_venv(venv: Path, yolov5: Path, torch_spec: str, torchvision_spec: str) -> Path:
    """The bench's own venv with torch, torchvision (--no-deps) and YOLOv5's requirements; returns its python."""
    wanted = f"{torch_spec} {torchvision_spec} {(yolov5 / 'requirements.txt').read_text()}"
    return _venv(venv, wanted, [[torch_spec],
                                ["--no-deps", torchvision_spec],   # pip must not replace the CPU torch
                                ["-c", str(venv / "constraints.txt"), "-r", str(yolov5 / "requirements.txt")]],
                 constraints=f"{torch_spec}\n{torchvision_spec}\n",
                 note=f"setting up {venv} (torch, torchvision, YOLOv5 requirements) ...")


def run_yolov5(python: Path, yolov5: Path, data: Path, img: int, batch: int, epochs: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = _run_env()
    _run([str(python), str(Path(__file__).resolve()), "yolov5-worker", "--yolov5", str(yolov5),
          "--data", str(data / "data.yaml"), "--img", str(img), "--batch", str(batch), "--epochs", str(epochs),
          "--out", str(out)], out / "log.txt", env=env, cwd=yolov5)
    info = json.loads((out / "epochs.json").read_text())
    timed = info["epochs"][1:]
    return {"images": sum(e["images"] for e in timed), "seconds": sum(e["seconds"] for e in timed),
            "threads": info["torch_threads"], "torch": info["torch"], "torchvision": info["torchvision"],
            "torchvision_shim": info["torchvision_shim"], "epochs": info["epochs"]}


def ppmulti_threads(nproc: int, auto: bool, spare: int = 0) -> tuple[int, dict]:
    """Paddle threads per rank for a run, and the environment that makes it so.

    Pinned (default): cores // ranks through PPMULTI_CPU_THREADS -- in one process that is every core, as torch
    takes for YOLOv5. ``auto`` leaves ppmulti's own rule (the same share, less ``spare`` cores: a ``ppmulti yolo``
    run's, unless PPMULTI_CPU_THREADS is set).
    """
    from ppmulti.common.cpus import choose_cpu_threads, usable_cores
    from ppmulti.common.envvars import PPMULTI_CPU_THREADS

    env = _run_env()
    if auto:
        return choose_cpu_threads(usable_cores(), nproc, env.get(PPMULTI_CPU_THREADS), spare), env
    threads = max(1, usable_cores() // nproc)
    env[PPMULTI_CPU_THREADS] = str(threads)
    return threads, env


def run_ppmulti(nproc: int, data: Path, img: int, batch: int, epochs: int, out: Path, auto_threads: bool,
                paddle_conv: bool = False, amp: bool = False) -> dict:
    from ppmulti.common.metrics import read_results
    from ppmulti.common.envvars import PPMULTI_CPU_CONV

    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), "--data", str(data / "data.yaml"), "--cfg", "yolov5s",
           "--weights", "", "--hyp", str(REPO / "configs" / "hyps" / HYP), "--img", str(img), "--epochs",
           str(epochs), "--batch", str(batch), "--device", "cpu", "--workers", "1", "--noval",
           "--output", str(out / "run")]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    if amp:   # bfloat16 convolutions on a CPU with AVX512-BF16/AMX (ppmulti/rank/engine/hooks/amp.py)
        cmd += ["--amp"]
    threads, env = ppmulti_threads(nproc, auto_threads)
    if paddle_conv:   # Paddle's own conv2d kernel instead of ppmulti's oneDNN op (ppmulti/rank/ops)
        env = {**env, PPMULTI_CPU_CONV: "paddle"}
    _run(cmd, out / "log.txt", env=env)
    cols = read_results(out / "run" / "results.csv")
    per_epoch = [{"epoch": int(e), "images": round(ips * secs), "seconds": secs}
                 for e, ips, secs in zip(cols["epoch"], cols["images_per_s"], cols["epoch_seconds"])]
    timed = per_epoch[1:]
    return {"images": sum(e["images"] for e in timed), "seconds": sum(e["seconds"] for e in timed),
            "threads": threads, "epochs": per_epoch}


def check_convert(yolov5_python: Path, yolov5: Path, venv: Path, torch_spec: str, out_json: Path) -> dict:
    """tools/convert_yolov5.py on a random yolov5s: ppmulti's raw head outputs against YOLOv5's on one input.

    The reference is made in the YOLOv5 venv; the conversion and ppmulti's forward run in a second venv that
    sees ppmulti's packages (--system-site-packages) plus torch, since the converter reads .pt with torch.
    """
    from ppmulti.common.atomic import atomic_write_text

    python = _venv(venv, torch_spec, [[torch_spec]], system_site_packages=True)
    tmp = Path(tempfile.mkdtemp(prefix="ppmulti_convert_check_"))
    me = str(Path(__file__).resolve())
    _run([str(yolov5_python), me, "convert-reference", "--yolov5", str(yolov5), "--out", str(tmp)],
         tmp / "reference.log", cwd=yolov5)
    _run([str(python), me, "convert-compare", "--out", str(tmp)], tmp / "compare.log")
    report = json.loads((tmp / "compare.json").read_text())
    report["what"] = ("random yolov5s (nc 3, random BN statistics), input 2x3x160x160: max |ppmulti - YOLOv5| of the "
                      "raw head outputs; sd = plain state_dict .pt (fp32), ckpt = train.py-style checkpoint (fp16 "
                      "model/ema, compared with YOLOv5's own fp16-rounded model)")
    result = json.loads(out_json.read_text()) if out_json.exists() else {}
    result["convert_check"] = report
    atomic_write_text(out_json, json.dumps(result, indent=1) + "\n")
    return report


def _yolov5_commit(yolov5: Path) -> str | None:
    proc = subprocess.run(["git", "-C", str(yolov5), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--yolov5", required=True,
                    help="an ultralytics/yolov5 checkout (git clone https://github.com/ultralytics/yolov5 DIR)")
    ap.add_argument("--venv", default=str(DEFAULT_VENV), help="the bench's own venv for YOLOv5 (made if missing)")
    ap.add_argument("--torch", dest="torch_spec", default="torch==2.13.0", help="pip spec of torch for the venv")
    ap.add_argument("--torchvision", dest="torchvision_spec", default="torchvision==0.28.0",
                    help="pip spec of the torchvision matching --torch (installed with --no-deps)")
    ap.add_argument("--data", help="YOLO-format demo data dir (generated if missing)")
    ap.add_argument("--train", type=int, default=128, help="training images when generating")
    ap.add_argument("--img", type=int, nargs="+", default=[160], help="image size(s), e.g. 160 320")
    ap.add_argument("--batch", type=int, default=16, help="global batch, both sides")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is warm-up, not timed")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of yolov5 / ppmulti x1 / ppmulti xN")
    ap.add_argument("--nproc", type=int, default=2, help="ranks of the multi-process ppmulti case (0: skip)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "vs_yolov5.json"))
    ap.add_argument("--paddle-conv", action="store_true",
                    help="add a 1-process ppmulti case on Paddle's own conv2d kernel (PPMULTI_CPU_CONV=paddle), "
                         "to measure the oneDNN op's gain in the same run")
    ap.add_argument("--amp", action="store_true",
                    help="add ppmulti cases with --amp (bfloat16 convolutions on CPUs with AVX512-BF16/AMX), "
                         "1 process and --nproc ranks")
    ap.add_argument("--threads-auto", action="store_true",
                    help="let ppmulti pick its threads (default: pinned to cores // ranks, as torch takes all cores)")
    ap.add_argument("--check-convert", action="store_true",
                    help="instead of timing: check tools/convert_yolov5.py against YOLOv5 (adds convert_check)")
    ap.add_argument("--convert-venv", default=str(REPO / "bench" / ".venv-convert"),
                    help="venv for --check-convert: ppmulti's site-packages plus torch")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    modes = {"yolov5-worker": _worker, "convert-reference": _convert_reference, "convert-compare": _convert_compare}
    if argv[:1] and argv[0] in modes:
        return modes[argv[0]](argv[1:])
    args = parse_args(argv)
    from ppmulti.common.errors import UserError

    yolov5 = Path(args.yolov5).resolve()
    if not (yolov5 / "train.py").is_file() or not (yolov5 / "models" / "yolov5s.yaml").is_file():
        raise UserError(f"--yolov5 {args.yolov5}: not a YOLOv5 checkout (no train.py / models/yolov5s.yaml); "
                        f"get one with: git clone https://github.com/ultralytics/yolov5 {args.yolov5}")
    if args.epochs < 2:
        raise UserError(f"--epochs {args.epochs}: need at least 2 (the first epoch is warm-up and not timed)")
    from ppmulti.common.synthdata import exists, generate
    from ppmulti.common.atomic import atomic_write_text

    python = ensure_venv(Path(args.venv), yolov5, args.torch_spec, args.torchvision_spec)
    if args.check_convert:
        report = check_convert(python, yolov5, Path(args.convert_venv), args.torch_spec, Path(args.out))
        print("| weights | parameters | max abs diff P3 / P4 / P5 | max abs output |\n| --- | --- | --- | --- |")
        for name, r in ((k, v) for k, v in report.items() if isinstance(v, dict)):
            print(f"| {name}.pt | {r['parameters']} | {' / '.join(f'{d:.2e}' for d in r['max_abs_diff_per_level'])} "
                  f"| {max(r['max_abs_output_per_level']):.2f} |")
        return None
    tmp = Path(tempfile.mkdtemp(prefix="ppmulti_vs_yolov5_"))
    data = Path(args.data) if args.data else tmp / "data"
    if not exists(data, "yolo"):
        generate(data, fmt="yolo", n_train=args.train, n_val=16, size=256)
    cases = [("yolov5", 1), ("ppmulti", 1)] + ([("ppmulti", args.nproc)] if args.nproc > 1 else [])
    if args.paddle_conv:
        cases.append(("ppmulti-paddleconv", 1))
    if args.amp:
        cases += [("ppmulti-amp", 1)] + ([("ppmulti-amp", args.nproc)] if args.nproc > 1 else [])
    runs: dict[str, list[dict]] = {}
    for img in args.img:
        for r in range(args.rounds):
            for side, n in cases:   # alternate so background load lands on every case
                key, out = f"{side}/{n}@{img}", tmp / f"{side}{n}_{img}_{r}"
                t = time.time()
                res = (run_yolov5(python, yolov5, data, img, args.batch, args.epochs, out) if side == "yolov5"
                       else run_ppmulti(n, data, img, args.batch, args.epochs, out, args.threads_auto,
                                        paddle_conv=side == "ppmulti-paddleconv", amp=side == "ppmulti-amp"))
                res["round"] = r
                runs.setdefault(key, []).append(res)
                print(f"round {r + 1}/{args.rounds} img {img} {side} x{n}: {res['images'] / res['seconds']:.2f} "
                      f"img/s ({time.time() - t:.0f}s wall)", flush=True)
    shim = next((x["torchvision_shim"] for k, v in runs.items() if k.startswith("yolov5") for x in v), None)
    rows = []
    for img in args.img:
        y = runs[f"yolov5/1@{img}"]
        y_ips = sum(x["images"] for x in y) / sum(x["seconds"] for x in y)
        for side, n in cases:
            v = runs[f"{side}/{n}@{img}"]
            ips = sum(x["images"] for x in v) / sum(x["seconds"] for x in v)
            rows.append({"side": side, "processes": n, "img": img, "threads_per_process": v[0]["threads"],
                         "images_per_s": round(ips, 3), "ratio_vs_yolov5": round(ips / y_ips, 3),
                         "per_round_images_per_s": [round(x["images"] / x["seconds"], 3) for x in v],
                         "per_round_ratio": [round((x["images"] / x["seconds"]) / (yy["images"] / yy["seconds"]), 3)
                                             for x, yy in zip(v, y)],
                         "median_per_round_ratio": round(statistics.median(
                             (x["images"] / x["seconds"]) / (yy["images"] / yy["seconds"]) for x, yy in zip(v, y)), 3),
                         "timed_images": sum(x["images"] for x in v),
                         "timed_seconds": round(sum(x["seconds"] for x in v), 2),
                         "epochs": [x["epochs"] for x in v]})
    first_y = next(iter(v for k, v in runs.items() if k.startswith("yolov5")))[0]
    result = {
        "what": "training images/s, first epoch of every run excluded, evaluation excluded",
        "conditions": {"data": "ppmulti demo, YOLO format", "train_images": args.train, "img": args.img,
                       "global_batch": args.batch, "epochs_per_run": args.epochs, "rounds": args.rounds,
                       "hyp": HYP, "device": "cpu", "cores": len(os.sched_getaffinity(0)),
                       "dataloader_workers": 1, "yolov5_commit": _yolov5_commit(yolov5),
                       "ppmulti_threads": "ppmulti's own rule" if args.threads_auto else "pinned: cores // ranks",
                       "torch": first_y["torch"], "torchvision": first_y["torchvision"],
                       "torchvision_shim": shim, "yolov5_timing": "train.main with on_train_epoch_start/end hooks",
                       "yolov5_env": OFFLINE_ENV,
                       "note": "both accumulate gradients to nbs=64 (1 optimizer step per 64/batch batches after "
                               "the warm-up)"},
        "rows": rows,
        "rerun": "python bench/vs_yolov5.py " + " ".join(portable(argv)),
    }
    previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if "convert_check" in previous:   # written by --check-convert; a timing run keeps it
        result["convert_check"] = previous["convert_check"]
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print("\n| framework | processes | threads/process | img | images/s | ratio vs yolov5 | median per-round ratio "
          "| per round |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        name = {"yolov5": "ultralytics/yolov5", "ppmulti-paddleconv": "ppmulti, Paddle's conv2d",
                "ppmulti-amp": "ppmulti --amp (bf16 convs)"}.get(r["side"], "ppmulti")
        print(f"| {name} | {r['processes']} | {r['threads_per_process']} | {r['img']} | {r['images_per_s']:.2f} | "
              f"{r['ratio_vs_yolov5']:.2f} | {r['median_per_round_ratio']:.2f} | "
              f"{', '.join(f'{v:.2f}' for v in r['per_round_images_per_s'])} |")
    if shim:
        print(f"\nnote: {shim}")
    print(f"YOLOv5 offline env: {' '.join(f'{k}={v}' for k, v in OFFLINE_ENV.items())}; written {args.out}")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:   # UserError: one line, exit 2 (the bench is a user-facing script too)
        if type(exc).__name__ == "UserError":
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
