"""Shared fixtures: the repo paths, a small demo dataset, launches killed at teardown, and a runner for the CLI tools."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
DEMO_CONFIG = CONFIGS / "demo" / "ppyoloe_demo.yml"


def pytest_sessionstart(session):
    """Build the oneDNN conv op before any test runs, so no single test's timeout pays for the compiler.

    A machine that cannot build it still runs the suite: training falls back to Paddle's kernel with one
    warning, and tests/test_onednn_conv.py fails with the reason.
    """
    from ppmulti.rank.ops.conv import OpUnavailable, build_op

    try:
        build_op()   # when it is built already: a file check, no paddle import
    except OpUnavailable as exc:
        print(f"warning: the oneDNN conv op is unavailable: {exc}", file=sys.stderr)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def launches(tmp_path):
    """``ppmulti launch`` processes started in ``tmp_path``; every one still running is killed at teardown."""
    from launching import Launches

    runs = Launches(tmp_path)
    try:
        yield runs
    finally:
        runs.close()


@pytest.fixture(scope="session")
def small_demo(tmp_path_factory) -> Path:
    """48 train / 16 val images of 128 px in both formats, made once per test session."""
    from ppmulti.common.synthdata import generate

    root = tmp_path_factory.mktemp("demo") / "data"
    generate(root, fmt="both", n_train=48, n_val=16, size=128, seed=3)
    return root


def demo_overrides(root: Path, size: int = 128) -> list[str]:
    """-o values that point the demo config at ``root`` and shrink it for tests."""
    return [f"TrainDataset.dataset_dir={root}", f"EvalDataset.dataset_dir={root}",
            f"TestDataset.dataset_dir={root}", f"eval_height={size}", f"eval_width={size}",
            f"TrainReader.batch_transforms=[{{BatchRandomResize: {{target_size: [{size}], random_size: true, "
            f"random_interp: false, keep_ratio: false}}}}, {{NormalizeImage: {{mean: [0.485, 0.456, 0.406], "
            f"std: [0.229, 0.224, 0.225], is_scale: true}}}}, {{Permute: {{}}}}, {{PadGT: {{}}}}]",
            "worker_num=0", "log_iter=2"]


def run_tool(args: list[str], cwd: Path | None = None, timeout: float = 600, env: dict | None = None):
    """Run a command as a user would (``python tools/x.py ...`` or ``python -m ppmulti.cli ...``)."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONPATH", str(REPO))
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, *args], cwd=cwd or REPO, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def one_line_error(proc, *needles) -> None:
    """A CLI refusal as a user sees it: exit 2, no traceback, one ``error:`` line holding every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


class LossStub:
    """A stand-in for a loss tensor as the training hooks see it: only ``.numpy()``."""

    def __init__(self, value: float):
        self.value = value

    def numpy(self):
        import numpy as np

        return np.array([self.value], dtype=np.float32)
