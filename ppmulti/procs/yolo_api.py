"""``from ppmulti import YOLO``: ultralytics' Python API (``YOLO(model).train/val/predict/export``, ``add_callback``)
over ppmulti's own tools, each run as a child process (so a notebook trains on several GPUs through
``ppmulti launch`` as a shell does, and its output reaches the notebook)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ppmulti.common.callbacks import CallbackSpec, spec_of
from ppmulti.common.errors import UserError
from ppmulti.common.paths import ROOT, TRAIN_SCRIPT
from ppmulti.common.ultra_keys import YoloCommand, dialect_environ, resolve_line, ultra_dialect
from ppmulti.procs import supervisor
from ppmulti.procs.yolo_command import TOOL_SCRIPTS, args_environ


@dataclass
class Boxes:
    """One image's detections as ultralytics' ``Results.boxes``: xyxy in pixels, conf, cls."""
    xyxy: np.ndarray
    conf: np.ndarray
    cls: np.ndarray

    def __len__(self) -> int:
        return len(self.conf)


@dataclass
class Results:
    """One image's prediction: its path, its size (h, w), its boxes and the class names."""
    path: str
    orig_shape: tuple[int, int]
    boxes: Boxes
    names: dict[int, str] = field(default_factory=dict)


def _word(key: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = "[" + ",".join(str(v) for v in value) + "]"
    return f"{key}={value}"


def _last_json(lines: list[str]) -> dict:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {}


class YOLO:
    """A detection model by its yaml (``yolo11n.yaml``), its weights (a .pt or a run's ``best.pdparams``) or a name;
    ``train`` leaves it holding the run's best weights, as ultralytics' does."""

    def __init__(self, model: str | os.PathLike = "yolo11n.yaml", task: str = "detect"):
        if task != "detect":
            raise UserError(f"task={task}: ppmulti trains detection models only (task=detect)")
        self.model = str(model)
        self.task = task
        self.callbacks: dict[str, list[Callable[..., Any]]] = {}
        self.metrics: dict = {}
        self.trainer_run: Path | None = None

    def add_callback(self, event: str, func: Callable[..., Any]) -> None:
        """Run ``func(run)`` at ``event`` in every rank of ``train``; a function the ranks cannot import (a lambda, a
        notebook cell's function) is refused here, in one line, not lost in the ranks."""
        spec_of(event, func)
        self.callbacks.setdefault(event, []).append(func)

    def _specs(self) -> list[CallbackSpec]:
        return [spec_of(event, f) for event, funcs in self.callbacks.items() for f in funcs]

    def _command(self, mode: str, kwargs: dict) -> YoloCommand:
        words = [mode, _word("model", kwargs.pop("model", self.model))]
        words += [_word(k, v) for k, v in kwargs.items() if k != "cfg"]
        cfg = {}
        if kwargs.get("cfg"):
            from ppmulti.procs.yolo_command import cfg_file_keys

            cfg = cfg_file_keys([_word("cfg", kwargs["cfg"])])
        return resolve_line(words, cfg)

    def _run(self, argv: list[str], env: dict | None = None) -> list[str]:
        """Run ``python argv``, its output (both streams) echoed line by line to this process's stdout (what a
        notebook shows); a Ctrl-C or SIGTERM here reaches it; raises on a non-zero exit."""
        child = supervisor.start([sys.executable, "-u", *argv], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
        lines: list[str] = []
        try:
            with supervisor.forward_signals([child]):
                for raw in child.stdout:
                    text = raw.decode(errors="replace")
                    lines.append(text)
                    sys.stdout.write(text)
                    sys.stdout.flush()
                code = child.wait()
        finally:
            if child.poll() is None:
                child.stop()
        if code != 0:
            errors = [ln.strip() for ln in lines if ln.startswith("error: ")]
            raise UserError(errors[-1][len("error: "):] if errors else f"{argv[0]} exited with {child.cause()}")
        return lines

    def train(self, **kwargs: Any) -> dict:
        """ultralytics' ``train(data=..., epochs=..., imgsz=..., batch=..., device=...)``; several devices train as one
        rank each. Returns the final metrics (mAP50, mAP50_95)."""
        command = self._command("train", kwargs)
        argv = list(command.argv)
        for spec in self._specs():
            argv += ["--callback", str(spec)]
        env = dict(os.environ)
        paths = [os.getcwd()] + [_import_root(f) for funcs in self.callbacks.values() for f in funcs]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *filter(None, [env.get("PYTHONPATH")])]))
        with tempfile.TemporaryDirectory(prefix="ppmulti-yolo-") as tmp:
            if command.hyp:
                import yaml

                hyp = Path(tmp) / "hyp.yaml"
                hyp.write_text(yaml.safe_dump(command.hyp, sort_keys=False))
                argv += ["--hyp", str(hyp)]
            try:
                env.update(args_environ(command))   # the run's args.yaml, as the command line writes it
                result = _last_json(self._run([str(TRAIN_SCRIPT), *argv], env))
            except UserError as exc:   # the train tool's `--epochs -1` said as the keyword the caller gave
                raise UserError(ultra_dialect(str(exc), "train", command.keys)) from None
        if result.get("run_dir"):
            self.trainer_run = Path(result["run_dir"])
            best = self.trainer_run / "weights" / "best.pdparams"
            self.model = str(best if best.is_file() else self.trainer_run / "weights" / "last.pdparams")
        self.metrics = {k: v for k, v in result.items() if k != "run_dir"}
        return self.metrics

    def val(self, **kwargs: Any) -> dict:
        """ultralytics' ``val(data=..., imgsz=..., conf=..., iou=...)``: the metrics (mAP50, mAP50_95, ...)."""
        command = self._command("val", kwargs)
        self.metrics = _last_json(self._run([str(ROOT / "tools" / TOOL_SCRIPTS["eval"]), *command.argv],
                                            _dialect(command)))
        return self.metrics

    def predict(self, source: str | os.PathLike, **kwargs: Any) -> list[Results]:
        """ultralytics' ``predict(source, conf=..., iou=...)``: one Results per image (boxes xyxy in pixels, conf,
        cls). Pictures and labels are kept in runs/detect/predict only with ``save=True``."""
        if not Path(source).exists():
            raise UserError(f"predict({str(source)!r}): no such image or folder (videos, streams and globs: "
                            f"ppmulti yolo predict source=...)")
        save = bool(kwargs.pop("save", False))
        with tempfile.TemporaryDirectory(prefix="ppmulti-predict-") as tmp:
            if not save:
                kwargs.update(project=tmp, name="predict", exist_ok=True)
            kwargs.update(source=str(source), save_txt=True, save_conf=True, save=save)
            command = self._command("predict", kwargs)
            lines = self._run([str(ROOT / "tools" / TOOL_SCRIPTS["detect"]), *command.argv], _dialect(command))
            saved = [ln.split("Results saved to ", 1)[1].strip() for ln in lines if ln.startswith("Results saved to ")]
            return _read_predictions(Path(saved[-1]) / "labels", source)

    def export(self, format: str = "onnx", **kwargs: Any) -> str:
        """ultralytics' ``export(format="onnx", half=..., simplify=..., dynamic=...)``: the exported file's path."""
        command = self._command("export", {**kwargs, "format": format})
        self._run([str(ROOT / "tools" / TOOL_SCRIPTS["export"]), *command.argv], _dialect(command))
        weights = Path(kwargs.get("model", self.model))
        out = weights.with_suffix(".onnx") if format == "onnx" else weights.parent / (weights.stem + "_paddle_model")
        if not out.exists():
            raise UserError(f"export finished but {out} is not there")
        return str(out)


def _dialect(command: YoloCommand) -> dict:
    """The tool's environment: this one, with the dialect its errors are said in (``conf=2``, as the keyword given)."""
    return {**os.environ, **dialect_environ(command)}


def _import_root(func: Callable[..., Any]) -> str:
    """The folder from which ``func``'s top-level package or module imports."""
    module = sys.modules.get(func.__module__)
    path = Path(getattr(module, "__file__", "") or os.getcwd()).resolve()
    for _ in func.__module__.split("."):
        path = path.parent
    return str(path)


def _images(source: str | os.PathLike) -> list[Path]:
    from ppmulti.common.paths import IMAGE_SUFFIXES

    src = Path(source)
    if src.is_dir():
        return sorted(p for p in src.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    return [src]


def _read_predictions(labels: Path, source: str | os.PathLike) -> list[Results]:
    """The saved YOLO-format labels (class xc yc w h conf, normalised) of every image of ``source``, as pixels."""
    from PIL import Image

    out = []
    for image in _images(source):
        with Image.open(image) as im:
            w, h = im.size
        rows = np.zeros((0, 6), dtype=np.float64)
        txt = labels / f"{image.stem}.txt"
        if txt.is_file() and txt.read_text().strip():
            rows = np.loadtxt(txt, ndmin=2)
        xc, yc, bw, bh = rows[:, 1] * w, rows[:, 2] * h, rows[:, 3] * w, rows[:, 4] * h
        xyxy = np.stack([xc - bw / 2, yc - bh / 2, xc + bw / 2, yc + bh / 2], axis=1).astype(np.float32)
        out.append(Results(str(image), (h, w), Boxes(xyxy, rows[:, 5].astype(np.float32), rows[:, 0].astype(np.int64))))
    return out
