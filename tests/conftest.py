"""Shared fixtures: the repo paths, a small demo dataset, the trained runs several modules read, launches killed at
teardown, a runner for the CLI tools, the `slow` lane's rules (multiproc implies slow; the op built first), the
rule for tests whose system daemon is missing (skip outside CI, fail under CI), and a watch on Paddle's loader
shared memory that dead processes leave in /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
DEMO_CONFIG = CONFIGS / "demo" / "ppyoloe_demo.yml"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every ``multiproc`` or ``seam`` test is ``slow`` too, marked so in its module: ``-m "not slow"`` must never
    start one. Checked before ``-m`` deselects anything, so the rule holds whichever lane runs."""
    for mark in ("multiproc", "seam"):
        unmarked = [item.nodeid for item in items
                    if item.get_closest_marker(mark) and not item.get_closest_marker("slow")]
        if unmarked:
            raise pytest.UsageError(f"{mark} tests must also be marked slow: " + ", ".join(unmarked[:10])
                                    + (f" and {len(unmarked) - 10} more" if len(unmarked) > 10 else ""))


def pytest_collection_finish(session):
    """Build the oneDNN conv op before the first test when a ``slow`` test is selected (they train, and their
    ranks would otherwise compile it inside a test's timeout); the fast lane never pays for the compiler, and
    its few tests of the op build it themselves.

    A machine that cannot build it still runs the suite: training falls back to Paddle's kernel with one
    warning, and tests/test_onednn_conv.py fails with the reason.
    """
    if not any(item.get_closest_marker("slow") for item in session.items):
        return
    from ppmulti.rank.ops.conv import OpUnavailable, build_op

    try:
        build_op()   # when it is built already: a file check, no paddle import
    except OpUnavailable as exc:
        print(f"warning: the oneDNN conv op is unavailable: {exc}", file=sys.stderr)


SHM = Path("/dev/shm")
_shm_before: set[str] = set()
_shm_first_seen: dict[str, str] = {}   # a Paddle shared-memory file -> the test after which it was first seen


def _paddle_shm() -> set[str]:
    """Paddle's data-loader shared memory: ``paddle_<pid of the writing worker>_...`` files."""
    try:
        return {n for n in os.listdir(SHM) if n.startswith("paddle_") and n.split("_")[1].isdigit()}
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)   # PermissionError: alive, someone else's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def pytest_sessionstart(session):
    _shm_before.update(_paddle_shm())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    for name in _paddle_shm() - _shm_before - _shm_first_seen.keys():
        _shm_first_seen[name] = item.nodeid


def pytest_terminal_summary(terminalreporter):
    """Files a dead loader worker wrote after its reader was gone (nobody left to unlink them) are removed and
    named with the test after which they appeared: a leak to find, not to leave in RAM."""
    left = {n: t for n, t in _shm_first_seen.items()
            if (SHM / n).exists() and not _alive(int(n.split("_")[1]))}
    for name in left:
        (SHM / name).unlink(missing_ok=True)
    if left:
        by_test: dict[str, list[str]] = {}
        for name, test in left.items():
            by_test.setdefault(test, []).append(name)
        terminalreporter.write_sep("=", "Paddle shared memory left by dead processes (removed)")
        for test, names in by_test.items():
            terminalreporter.write_line(f"{len(names)} file(s), first seen after {test}: {', '.join(sorted(names))}")


# ----------------------------------------------------------------------------- system daemons and tools
def under_ci() -> bool:
    """True when CI runs the suite (``CI=true``, as .ci/run and the common CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_programs(*names: str) -> list[str]:
    """Those of ``names`` found neither on PATH nor in /usr/sbin (Debian's daemons live there, off a user's PATH)."""
    import shutil

    return [n for n in names if not (shutil.which(n) or os.path.exists(f"/usr/sbin/{n}"))]


def require_system(why: str | None, install: str) -> None:
    """A test that needs a system daemon or tool (sshd, SLURM, etcd, iproute2) and cannot have it (``why``; None:
    it can): outside CI it skips, naming the line that installs it; under ``CI=true`` it fails, so that CI, which
    installs them all, cannot pass by skipping."""
    if why is None:
        return
    reason = f"{why} ({install}; .ci/run does)"
    if under_ci():
        pytest.fail(f"CI must run this for real, but {reason}", pytrace=False)
    pytest.skip(reason)


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



# ----------------------------------------------------------------------------- trained runs, once per session
# Several modules read the same kind of finished training. Each is trained once per test session, the first time a
# test asks for it, and then only read: a test that changes a run works on its own copy (shutil.copytree into its
# tmp_path). Each assertion still checks the artefacts of a real training made by the real command.

SECRET_VAR, SECRET = "PPMULTI_TEST_TOKEN", "zz-marker-7f3a9c21"   # a value no output or file of a run may hold


@dataclass(frozen=True)
class TrainedRun:
    """A finished training: its run directory, the directory it ran in, and what its command printed."""

    path: Path
    cwd: Path
    stdout: str
    stderr: str


def clean_env() -> dict[str, str]:
    """This environment without launcher, cluster, Paddle-flag or ppmulti variables, ppmulti importable, and
    ``SECRET_VAR=SECRET`` set: what the session's runs start in, so tests can look for the value in their output."""
    from launching import launch_env

    env = {k: v for k, v in launch_env().items() if not k.startswith(("FLAGS_", "PPMULTI_"))}
    env[SECRET_VAR] = SECRET
    return env


def _train_once(args: list[str], cwd: Path, out: Path) -> TrainedRun:
    """``python ARGS`` in ``cwd`` and ``clean_env()``, which must succeed."""
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=900,
                          env=clean_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return TrainedRun(out, cwd, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def ppyoloe_run(small_demo, tmp_path_factory) -> TrainedRun:
    """PP-YOLOE (the demo config) trained 4 epochs in one process on ``small_demo``, evaluated and checkpointed
    every epoch (static assigner for epoch 1 only), output piped. Read by test_train and test_onnx_export."""
    root = tmp_path_factory.mktemp("ppyoloe_run")
    out = root / "demo"
    return _train_once([str(REPO / "tools" / "train.py"), "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo),
                        "PPYOLOEHead.static_assigner_epoch=1", "snapshot_epoch=1", "--epochs", "4", "--eval",
                        "--output", str(out)], cwd=root, out=out)


@pytest.fixture(scope="session")
def yolov5_run(small_demo, tmp_path_factory) -> TrainedRun:
    """YOLOv5n trained 4 epochs in one process with YOLOv5's own flags (README's YOLOv5 line, tiny): YOLO-format
    ``small_demo``, --cfg by name, --hyp, --img 128, AdamW, cosine LR, validated every epoch (YOLOv5's default),
    a checkpoint every epoch, no plots, in PROJECT/exp. Read by test_yolo_flags, test_eval_tool, test_onnx_export."""
    runs = tmp_path_factory.mktemp("yolov5_run")
    return _train_once([str(REPO / "tools/train.py"), "--data", str(small_demo / "data.yaml"), "--cfg", "yolov5n",
                        "--weights", "", "--img", "128", "--epochs", "4", "--batch", "8",
                        "--hyp", str(REPO / "configs/hyps/hyp.demo.yaml"), "--optimizer", "AdamW", "--cos-lr",
                        "--device", "cpu", "--workers", "0", "--project", str(runs), "--name", "exp",
                        "--save-period", "1", "--noplots"], cwd=runs, out=runs / "exp")


@pytest.fixture(scope="session")
def two_rank_run(small_demo, tmp_path_factory) -> TrainedRun:
    """PP-YOLOE (the demo config) trained 2 epochs by ``ppmulti launch --nproc_per_node 2`` (2 gloo ranks, global
    batch 8), evaluated and checkpointed every epoch; output piped, not a terminal; started in a clean environment
    (``clean_env()``), Paddle's logs under ``cwd``/log. Read by test_distributed, test_plots and test_quiet_console."""
    root = tmp_path_factory.mktemp("two_rank_run")
    out = root / "run"
    return _train_once(["-m", "ppmulti.cli", "launch", "--nproc_per_node", "2", str(REPO / "tools" / "train.py"),
                        "-c", str(DEMO_CONFIG), "-o", *demo_overrides(small_demo), "snapshot_epoch=1",
                        "--batch", "8", "--epochs", "2", "--eval", "--output", str(out)], cwd=root, out=out)


@pytest.fixture(scope="session")
def quick_bench(tmp_path_factory) -> Path:
    """``ppmulti bench --quick --heartbeat``, run once: every probe as real processes (2 gloo ranks included), plus
    the first model on 2 ranks again without the watchdog's progress reports. Run as a user would, without
    ``--out``, from a fresh directory: its output directory (runs/bench/exp: bench.md, bench.json, bench.png),
    beside ``console.txt`` (what it printed) and ``source_tree.txt`` (the repo's top level before and after, which
    a bench must not change). Read by test_perf_bench and test_heartbeat_bench."""
    cwd = tmp_path_factory.mktemp("bench")
    tree = sorted(p.name for p in REPO.iterdir() if not p.name.startswith("."))
    proc = subprocess.run([sys.executable, "-m", "ppmulti.cli", "bench", "--quick", "--heartbeat"],
                          capture_output=True, text=True, timeout=900, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (cwd / "console.txt").write_text(proc.stdout)
    after = sorted(p.name for p in REPO.iterdir() if not p.name.startswith("."))
    (cwd / "source_tree.txt").write_text("\n".join(tree) + "\n--\n" + "\n".join(after))
    return cwd / "runs" / "bench" / "exp"


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


def tool_module(name: str):
    """tools/NAME.py imported as a module (its parse(), build_parser(), main()), without running it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_tool_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
