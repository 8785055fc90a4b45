"""The start-up stack check: golden cases on fake metadata, and one refusal seen by a user in a real process."""

from __future__ import annotations

import pytest

from conftest import one_line_error, run_tool
from ppmulti.common.errors import UserError
from ppmulti.common.stack import Stack, check_stack, current_stack, problem

GOOD_1 = {"paddlepaddle": (2, 6, 2), "paddledet": (2, 6, 0), "setuptools": (65, 5, 0)}
GOOD_2 = {"paddlepaddle": (3, 3, 1), "paddledet": (2, 6, 0), "setuptools": (80, 10, 2)}
GPU_3 = {"paddlepaddle-gpu": (3, 3, 1), "paddledet": (2, 6, 0), "setuptools": (80, 10, 2)}

# (python, dists, has_pkg_resources, need_paddle) -> None (fine) or the words the one line must hold
GOLDEN = [
    ((3, 11, 7), GOOD_1, True, True, None),
    ((3, 10, 13), GOOD_1, True, True, None),
    ((3, 12, 1), GOOD_2, True, True, None),
    ((3, 13, 0), GOOD_2, True, True, None),
    ((3, 12, 1), GPU_3, True, True, None),
    ((3, 12, 1), {**GOOD_2, "paddlepaddle": (3, 0, 0)}, True, True, None),   # inside the range
    ((3, 9, 18), GOOD_1, True, True, ["Python 3.9.18 is not supported", "3.10 to 3.13"]),
    ((3, 14, 0), GOOD_2, True, False, ["Python 3.14.0 is not supported"]),
    ((3, 12, 1), {**GPU_3, "paddlepaddle": (3, 3, 1)}, True, True,
     ["two Paddle distributions", "paddlepaddle-gpu 3.3.1", "pip uninstall -y paddlepaddle paddlepaddle-gpu",
      "PPMULTI_PADDLE=none"]),
    ((3, 12, 1), {"paddlepaddle": (3, 3, 1), "paddlepaddle-gpu": (2, 6, 2)}, True, False,
     ["two Paddle distributions"]),                                           # broken even for `ppmulti data`
    ((3, 11, 7), {**GOOD_1, "paddlepaddle": (2, 5, 2)}, True, True,
     ["paddlepaddle 2.5.2 is older than ppmulti supports", "2.6 to 3.3", "paddlepaddle==2.6.2"]),
    ((3, 12, 1), {**GPU_3, "paddlepaddle-gpu": (3, 4, 0)}, True, True,
     ["paddlepaddle-gpu 3.4.0 is newer than ppmulti supports", "paddlepaddle-gpu==3.3.1"]),
    ((3, 12, 1), {**GOOD_2, "setuptools": (84, 2, 1)}, False, True,
     ["ppdet needs pkg_resources", "setuptools 84.2.1", 'pip install "setuptools>=77.0.3,<81"']),
    ((3, 12, 1), {k: v for k, v in GOOD_2.items() if k != "setuptools"}, False, False,
     ["ppdet needs pkg_resources", "no setuptools"]),
    ((3, 12, 1), {"setuptools": (80, 10, 2)}, True, True, ["Paddle is not installed", "paddlepaddle==3.3.1"]),
    ((3, 12, 1), {"paddlepaddle": (3, 3, 1)}, True, True,
     ["ppdet is not installed", "pip install --no-deps paddledet==2.6.0"]),
    ((3, 12, 1), {}, True, False, None),                     # `ppmulti data demo` on a laptop without Paddle
    ((3, 12, 1), {"paddlepaddle": (3, 3, 1)}, False, False, None),   # no ppdet: pkg_resources not needed
]


@pytest.mark.parametrize("python,dists,has_pkg_resources,need_paddle,words", GOLDEN)
def test_golden(python, dists, has_pkg_resources, need_paddle, words):
    found = problem(Stack(python=python, dists=dists, has_pkg_resources=has_pkg_resources), need_paddle=need_paddle)
    if words is None:
        assert found is None, found
    else:
        assert found is not None and "\n" not in found
        for word in words:
            assert word in found, found


def test_a_paddle_without_metadata_passes():
    """A source build of Paddle on the path has no wheel metadata: its version is unknown, not absent."""
    stack = Stack(python=(3, 12, 1), dists={"paddledet": (2, 6, 0)}, has_paddle_module=True)
    assert problem(stack) is None


def test_check_raises_a_user_error():
    with pytest.raises(UserError, match="two Paddle distributions"):
        check_stack(stack=Stack(python=(3, 12, 1), dists={"paddlepaddle": (3, 3, 1), "paddlepaddle-gpu": (3, 3, 1)}))


def test_this_environment_passes():
    assert problem(current_stack()) is None, "the suite's own stack is refused"


def test_a_second_paddle_is_refused_in_a_real_process(tmp_path):
    """A fake paddlepaddle-gpu distribution beside the real Paddle: tools/train.py refuses before ppdet loads."""
    fake = tmp_path / "site"
    info = fake / "paddlepaddle_gpu-3.3.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: paddlepaddle-gpu\nVersion: 3.3.1\n")
    from conftest import REPO

    proc = run_tool(["tools/train.py", "-c", "configs/demo/ppyoloe_demo.yml"], timeout=120,
                    env={"PYTHONPATH": f"{REPO}:{fake}"})
    one_line_error(proc, "two Paddle distributions", "paddlepaddle-gpu 3.3.1", "pip uninstall -y")
    proc = run_tool(["-m", "ppmulti.cli", "data", "demo", str(tmp_path / "d"), "--train", "1", "--val", "1"],
                    timeout=120, env={"PYTHONPATH": f"{REPO}:{fake}"})
    one_line_error(proc, "two Paddle distributions")


def _wheel(folder, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure-python wheel holding only metadata: enough for pip's resolver."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", meta)
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def test_installing_torch_afterwards_keeps_setuptools(tmp_path):
    """torch 2.13/2.14 require setuptools>=77.0.3; pip would upgrade an older one to the newest, without pkg_resources.

    Measured: `pip install torch==2.13.0+cpu` after ppmulti on stack 1 and `pip install --dry-run --report` of torch
    2.14.1 on stack 2 keep the setuptools ppmulti's `setuptools>=77.0.3,<81` put there, and ppdet still imports.
    This replays it offline: a stand-in torch with torch's requirement, and a setuptools 99 on offer.
    """
    import json
    import subprocess
    import sys
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        declared = [Requirement(r) for r in metadata.requires("ppmulti") or []]
    except metadata.PackageNotFoundError:
        pytest.skip("ppmulti is not installed (pip install -e .): its requirements cannot be read")
    wanted = [r.specifier for r in declared if r.name == "setuptools"]
    assert wanted and wanted[0].contains("77.0.3") and not wanted[0].contains("81"), wanted
    have = metadata.version("setuptools")
    if not wanted[0].contains(have):
        pytest.skip(f"setuptools {have} here was not installed by ppmulti's requirements (run pip install -e . first)")
    _wheel(tmp_path, "torch", "0.0.1", ("setuptools>=77.0.3", "filelock"))
    _wheel(tmp_path, "setuptools", "99.0")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                           "--no-index", "--find-links", str(tmp_path), "torch==0.0.1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    installs = {i["metadata"]["name"].lower() for i in json.loads(proc.stdout)["install"]}
    assert installs == {"torch"}, installs


@pytest.mark.parametrize("choice,wanted", [
    ("", ["paddlepaddle==2.6.2; python_version < \"3.12\"", "paddlepaddle==3.3.1; python_version >= \"3.12\""]),
    ("paddlepaddle-gpu", ["paddlepaddle-gpu==2.6.2; python_version < \"3.12\"",
                          "paddlepaddle-gpu==3.3.1; python_version >= \"3.12\""]),
    ("none", []),   # a user's own Paddle (e.g. paddlepaddle-gpu 3.x from Paddle's index): no second one
])
def test_ppmulti_paddle_chooses_the_paddle_requirement(choice, wanted, repo):
    """setup.py's metadata per PPMULTI_PADDLE, built offline by pip (no build isolation: the env's setuptools)."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                           "--quiet", "--report", "-", "-e", str(repo)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PPMULTI_PADDLE": choice}, cwd=repo.parent)
    if "invalid command 'bdist_wheel'" in proc.stdout + proc.stderr:
        pytest.skip("this environment's setuptools predates ppmulti's setuptools>=77.0.3 (no bdist_wheel)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    requires = json.loads(proc.stdout)["install"][0]["metadata"]["requires_dist"]
    assert [r for r in requires if r.startswith("paddlepaddle")] == wanted


@pytest.mark.parametrize("module", ["scipy.optimize", "pycocotools.coco", "lap", "cv2", "shapely.geometry",
                                    "sklearn.metrics", "pyclipper"])
def test_native_dependencies_import_after_paddle(module):
    """Each compiled dependency ppdet imports still loads after paddle in ppmulti's order (``ppmulti.rank`` first,
    as every rank and tool does). On Paddle 2.6, CI's fresh venv met zlib errors or segfaults here from
    scikit-learn 1.9, scipy 1.17 and pyclipper 1.4 without compat.before_paddle_import, and pycocotools 2.0.11
    and lap 0.5.13 need setup.py's pins."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", f"import ppmulti.rank; import paddle; import {module}; print('ok')"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
