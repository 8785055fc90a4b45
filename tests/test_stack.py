"""The start-up stack check: golden cases on fake metadata, and one refusal seen by a user in a real process."""

from __future__ import annotations

import pytest

from conftest import one_line_error, run_tool
from ppmulti.common.errors import UserError
from ppmulti.common.stack import Stack, check_stack, current_stack, problem

GOOD_1 = {"paddlepaddle": (2, 6, 2), "paddledet": (2, 6, 0), "setuptools": (80, 10, 2), "protobuf": (6, 33, 6)}
GOOD_2 = {"paddlepaddle": (3, 3, 1), "paddledet": (2, 6, 0), "setuptools": (80, 10, 2), "protobuf": (7, 36, 2)}
GPU_3 = {"paddlepaddle-gpu": (3, 3, 1), "paddledet": (2, 6, 0), "setuptools": (80, 10, 2)}

# (python, dists, has_pkg_resources, need_paddle) -> None (fine) or the words the one line must hold
GOLDEN = [
    ((3, 11, 7), GOOD_1, True, True, None),                                   # the opt-in
    ((3, 10, 13), GOOD_1, True, True, None),
    ((3, 10, 13), GOOD_2, True, True, None),                                  # the default, on every Python
    ((3, 11, 7), GOOD_2, True, True, None),
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
     ["paddlepaddle 2.5.2 is older than ppmulti supports", "2.6 to 3.3", "paddlepaddle==3.3.1",
      "2.6.2 on Python 3.10/3.11"]),
    ((3, 12, 1), {**GPU_3, "paddlepaddle-gpu": (3, 4, 0)}, True, True,
     ["paddlepaddle-gpu 3.4.0 is newer than ppmulti supports", "paddlepaddle-gpu==3.3.1"]),
    # Paddle 2.6 where setup.py's opt-in would not put it: Python 3.12+, protobuf 7
    ((3, 12, 1), GOOD_1, True, True,
     ["paddlepaddle 2.6.2 is tested on Python 3.10 and 3.11 only", "Python 3.12.1", "paddlepaddle==3.3.1"]),
    ((3, 13, 0), {"paddlepaddle-gpu": (2, 6, 2)}, True, False, ["paddlepaddle-gpu 2.6.2 is tested on Python 3.10"]),
    ((3, 11, 7), {**GOOD_1, "protobuf": (7, 36, 2)}, True, True,
     ["protobuf 7.36.2 breaks paddlepaddle 2.6.2's fleet.init", 'pip install "protobuf<7"']),
    ((3, 11, 7), {k: v for k, v in GOOD_1.items() if k != "protobuf"}, True, True, None),   # not installed: no claim
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
    meta = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires))
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", meta)
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def test_installing_torch_afterwards_keeps_setuptools(tmp_path):
    """torch 2.13/2.14 require setuptools>=77.0.3; pip would upgrade an older one to the newest, without pkg_resources.

    Measured: `pip install torch==2.13.0+cpu` after ppmulti on Paddle 2.6.2 and `pip install --dry-run --report` of
    torch 2.14.1 on Paddle 3.3.1 keep the setuptools ppmulti's `setuptools>=77.0.3,<81` put there, and ppdet still
    imports.
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


def _requires(repo, env: dict[str, str]):
    """setup.py's Requires-Dist under ``env``, built offline by pip (no build isolation: the env's setuptools);
    the finished process when pip refused."""
    import json
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PPMULTI_PADDLE")}, **env}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                           "--quiet", "--report", "-", "-e", f"{repo}[dev]"], capture_output=True, text=True,
                          timeout=300, env=env, cwd=repo.parent)
    if "invalid command 'bdist_wheel'" in proc.stdout + proc.stderr:
        pytest.skip("this environment's setuptools predates ppmulti's setuptools>=77.0.3 (no bdist_wheel)")
    if proc.returncode != 0:
        return proc
    return json.loads(proc.stdout)["install"][0]["metadata"]


# Paddle 2.6.2's own pins (setup.py, docs/stacks.md): present with the opt-in, absent by default
PINS_26 = {"protobuf<7", "numpy<2", "scikit-learn<1.8", "scipy<1.17", "pyclipper<1.4", "pycocotools<2.0.11",
           "lap<0.5.13"}


@pytest.mark.parametrize("choice,version,wanted", [
    ("", "", ["paddlepaddle==3.3.1"]),                        # the default on every Python
    ("", "3.3.1", ["paddlepaddle==3.3.1"]),
    ("paddlepaddle-gpu", "", ["paddlepaddle-gpu==3.3.1"]),
    ("none", "", []),   # a user's own Paddle (e.g. paddlepaddle-gpu 3.x from Paddle's index): no second one
    ("", "2.6.2", ["paddlepaddle==2.6.2"]),
    ("paddlepaddle-gpu", "2.6.2", ["paddlepaddle-gpu==2.6.2"]),
])
def test_install_switches_choose_the_paddle_requirement(choice, version, wanted, repo):
    """PPMULTI_PADDLE picks the distribution, PPMULTI_PADDLE_VERSION the version; the opt-in brings its pins,
    and is refused in one line where it is not tested (Python 3.12+)."""
    import sys

    found = _requires(repo, {"PPMULTI_PADDLE": choice, "PPMULTI_PADDLE_VERSION": version})
    if version == "2.6.2" and sys.version_info >= (3, 12):
        assert not isinstance(found, dict), "PPMULTI_PADDLE_VERSION=2.6.2 was accepted on Python 3.12+"
        # pip wraps a failing setup.py in its own "error:" lines; setup.py's own is one of them, and only one
        ours = [ln.strip() for ln in (found.stdout + found.stderr).splitlines() if "PPMULTI_PADDLE_VERSION" in ln]
        assert len(ours) == 1 and ours[0].startswith("error: PPMULTI_PADDLE_VERSION=2.6.2 is tested on Python "
                                                     "3.10 and 3.11 only, this is Python 3."), ours
        return
    assert isinstance(found, dict), found.stderr[-2000:]
    requires = found["requires_dist"]
    assert [r for r in requires if r.startswith("paddlepaddle")] == wanted
    pins = {r for r in requires if r in PINS_26}
    assert pins == (PINS_26 if version == "2.6.2" else set()), pins
    assert found.get("license") == "Apache-2.0" or found.get("license_expression") == "Apache-2.0", found
    extras = set(found.get("provides_extra", []))
    assert {"test", "export", "docs", "lint", "dev"} <= extras, extras
    p2o = {r.split(";")[0].strip() for r in requires if r.startswith("paddle2onnx")}
    assert p2o == {"paddle2onnx==1.3.1" if version == "2.6.2" else "paddle2onnx==2.1.0"}, p2o   # reads that Paddle's
    default = [r.split(";")[0].strip() for r in requires if "extra ==" not in r]   # README's install: ONNX export
    assert {"onnxruntime", "onnx<=1.17.0", "onnxslim"} <= set(default) and any(r.startswith("paddle2onnx==")
                                                                               for r in default), default
    assert any(r.startswith("paddle2onnx") and "python_version < \"3.13\"" in r and "extra ==" not in r
               for r in requires), requires   # no paddle2onnx release for 3.13 (setup.py)
    dev = [r for r in requires if 'extra == "dev"' in r]
    for name in ("pytest", "onnxruntime", "mkdocs", "mkdocs-material", "ruff==0.17.6"):
        assert any(r.startswith(name) for r in dev), (name, dev)


def test_a_wrong_paddle_version_is_one_line(repo):
    found = _requires(repo, {"PPMULTI_PADDLE_VERSION": "3.0"})
    assert not isinstance(found, dict)
    assert "error: PPMULTI_PADDLE_VERSION='3.0': use 3.3.1 (the default) or 2.6.2" in found.stdout + found.stderr


# What a user's script imports after `import paddle`, by import name: every compiled dependency setup.py installs,
# then ppdet. Optional ones (the export extra) are imported where installed.
COMPILED = ["sklearn", "sklearn.metrics", "scipy", "scipy.optimize", "scipy.spatial", "pyclipper", "cv2",
            "pycocotools.coco", "pycocotools._mask", "shapely.geometry", "lap", "matplotlib.pyplot", "pandas",
            "visualdl", "motmetrics"]
OPTIONAL = ["onnxruntime", "onnx", "paddle2onnx"]
PPDET = ["ppdet", "ppdet.modeling", "ppdet.metrics", "ppdet.data", "ppdet.engine"]

# The child: paddle first, as a notebook or PaddleDetection's tools/train.py does, then each module, naming each
# before importing it, so the last name printed is the one that crashed the interpreter.
_IMPORTS = """
import importlib, sys
print("import paddle", flush=True)
import paddle
for name in sys.argv[1:]:
    print("import " + name, flush=True)
    importlib.import_module(name)
print("all imported", flush=True)
"""


def _clean_env() -> dict[str, str]:
    """A user's shell: PATH and HOME, nothing of the suite's (no PYTHONPATH, no FLAGS_*, no PADDLE_*)."""
    import os

    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env["MPLBACKEND"] = "Agg"   # a headless machine; the backend choice is not what is tested
    return env


def _child(code: str, *args: str, timeout: float = 300):
    import subprocess
    import sys

    # -I: a fresh interpreter of this environment, no PYTHONPATH, no user site, no script directory on sys.path
    return subprocess.run([sys.executable, "-I", "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=_clean_env(), cwd="/")


def _culprit(proc) -> str:
    """The step a child died in (the last one it named) and how it died."""
    import signal

    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("import ")]
    step = lines[-1] if lines else "(before `import paddle`)"
    how = (f"died of {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else f"exited {proc.returncode}")
    return f"`{step}` {how}"


def test_users_imports_after_paddle():
    """`import paddle`, then every compiled dependency and ppdet, in a fresh interpreter: exit 0 (issue 23: on
    Python 3.11 + Paddle 2.6.2, `import paddle; import sklearn` died in inflateReset2). Every required module must
    be installed; a crash names the module that caused it."""
    import importlib.util

    def present(name: str) -> bool:
        return importlib.util.find_spec(name.split(".")[0]) is not None

    missing = [m for m in COMPILED + PPDET if not present(m)]
    assert not missing, f"installed by setup.py but missing here: {missing}"
    modules = COMPILED + [m for m in OPTIONAL if present(m)] + PPDET
    proc = _child(_IMPORTS, *modules)
    assert proc.returncode == 0 and "all imported" in proc.stdout, (
        f"after `import paddle`, {_culprit(proc)}: {proc.stderr[-1500:]}")


_ZLIB_USERS = """
import io
print("import paddle", flush=True)
import paddle
import numpy as np
print("import zlib: a round trip", flush=True)
import zlib
assert zlib.decompress(zlib.compress(b"ppmulti" * 100)) == b"ppmulti" * 100
print("import cv2: a PNG round trip", flush=True)
import cv2
image = (np.arange(8 * 8 * 3) % 251).astype(np.uint8).reshape(8, 8, 3)
ok, png = cv2.imencode(".png", image)
assert ok and (cv2.imdecode(png, cv2.IMREAD_COLOR) == image).all()
print("import PIL: a PNG round trip", flush=True)
from PIL import Image
buf = io.BytesIO()
Image.fromarray(image).save(buf, format="PNG")
assert (np.asarray(Image.open(io.BytesIO(buf.getvalue()))) == image).all()
print("all used", flush=True)
"""


def _paddle_26_with_shared_zlib() -> bool:
    import sys

    from ppmulti.common.compat import installed_version

    version = installed_version()
    return bool(version) and tuple(version[:2]) < (3,) and "zlib" not in sys.builtin_module_names


@pytest.mark.xfail(_paddle_26_with_shared_zlib(), strict=True,
                   reason="Paddle 2.6.2's libpaddle.so exports its own zlib 1.2.8; with an interpreter whose zlib "
                          "is a separate module, zlib users after `import paddle` break (docs/stacks.md)")
def test_zlib_users_after_paddle():
    """After `import paddle`: Python's zlib, OpenCV's and Pillow's PNG codecs (all on the system libz) work. The
    default Paddle (3.3.1) must pass; Paddle 2.6.2 fails on interpreters like pyenv's, which is why it is not
    the default (docs/stacks.md)."""
    proc = _child(_ZLIB_USERS)
    assert proc.returncode == 0 and "all used" in proc.stdout, (
        f"after `import paddle`, {_culprit(proc)}: {proc.stderr[-1500:]}")
