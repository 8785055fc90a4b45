"""paddle2onnx's conversion run as a child process, so that a crash in its native code (SIGABRT, SIGSEGV) becomes
one line and a non-zero exit rather than the death of the export command, with nothing left in /tmp."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from ppmulti.common.errors import UserError
from ppmulti.procs import supervisor

CHILD = "ppmulti.rank.engine.onnx_child"   # started by name: the process side imports no rank module
TIMEOUT = 900.0   # the zoo's largest program converts in under a minute on 2 cores; a hang must still end


class ConversionFailed(UserError):
    """paddle2onnx could not do the job (not the user's input): exit code 1."""

    exit_code = 1


def instead(model_dir: Path | str | None) -> str:
    """What to use when there is no ONNX file: the Paddle inference model written beside it, or how to write one."""
    if model_dir is None:
        return "export the Paddle inference model instead (--include paddle), which Paddle Inference runs"
    return (f"use the Paddle inference model written to {model_dir} (Paddle Inference, PaddleDetection's "
            f"deploy/python/infer.py)")


def crash_line(architecture: str, name: str, how: str, version: str, model_dir: Path | str | None) -> str:
    """The one line for a conversion that died (``how``: supervisor.cause's words, e.g. "killed by signal SIGSEGV")
    or failed: which model, that paddle2onnx cannot convert it on this stack, and what to use instead."""
    return (f"ONNX export of {architecture} ({name}): paddle2onnx {version} {how} converting its program, so no "
            f"ONNX file was written; paddle2onnx cannot convert this architecture on this stack: {instead(model_dir)}")


def _last_error(stderr: str) -> str:
    """The child's own error line ("error: ..."), else paddle2onnx's last [ERROR] line, else nothing."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for prefix in ("error: ", "[ERROR]"):
        found = [line for line in lines if prefix in line]
        if found:
            return found[-1].split(prefix, 1)[-1].strip()[:200]
    return ""


def child_argv(model_dir: Path, opset: int, out: Path) -> list[str]:
    """The child's command line: this Python, the conversion module, its model, opset and output file."""
    return [sys.executable, "-m", CHILD, str(model_dir), str(opset), str(out)]


def convert(model_dir: Path | str, opset: int, architecture: str, version: str,
            keep: Path | str | None = None) -> bytes:
    """The ONNX bytes of the Paddle inference model in ``model_dir``, converted in a child process; ``keep``: where
    the user finds that Paddle model afterwards (None: it is not kept). A child killed by a signal, failing or
    hanging raises ConversionFailed with one line. The child's temporary files (paddle2onnx's, compat's
    ppmulti-onnx-*) live under one directory removed here whatever happens."""
    model_dir = Path(model_dir)
    name = model_dir.name
    with tempfile.TemporaryDirectory(prefix="ppmulti-onnx-") as tmp:
        out = Path(tmp) / "model.onnx"
        env = {**os.environ, "TMPDIR": tmp}   # the child's tempfile dirs land here, removed even after a crash
        ran = supervisor.run(child_argv(model_dir, opset, out), TIMEOUT, env=env)
        if ran.stderr:
            sys.stderr.write(ran.stderr if ran.code == 0 else "")   # its warnings on success; one line on failure
        if ran.code is None:
            raise ConversionFailed(crash_line(architecture, name, f"did not finish within {TIMEOUT:.0f} s",
                                              version, keep))
        if ran.code < 0:
            raise ConversionFailed(crash_line(architecture, name, f"crashed ({supervisor.cause(ran.code)})",
                                              version, keep))
        if ran.code:
            why = _last_error(ran.stderr)
            raise ConversionFailed(crash_line(architecture, name, "failed" + (f" ({why})" if why else ""),
                                              version, keep))
        data = out.read_bytes() if out.is_file() else b""
    if not data:
        raise ConversionFailed(crash_line(architecture, name, "wrote nothing", version, keep))
    return data
