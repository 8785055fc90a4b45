"""Install ppmulti: `pip install --no-deps paddledet==2.6.0 && pip install -e .` (docs/stacks.md says what and why)."""

import os
import re
import sys

from setuptools import find_packages, setup

with open("ppmulti/common/version.py") as init:
    VERSION = re.search(r'__version__ = "([^"]+)"', init.read()).group(1)

# Both switches are read here, at install time, so the requirements below are plain lists (docs/stacks.md).
# PPMULTI_PADDLE: which Paddle wheel to require: "paddlepaddle" (CPU, the default), "paddlepaddle-gpu" (CUDA; PyPI
# has paddlepaddle-gpu 2.6.2 only), or "none" for a user who installed Paddle already (e.g. paddlepaddle-gpu 3.x
# from Paddle's own index): pip would otherwise put a second distribution of the `paddle` module beside it, because
# it cannot know that paddlepaddle and paddlepaddle-gpu provide the same module.
PADDLE = (os.environ.get("PPMULTI_PADDLE") or "paddlepaddle").strip().lower()
if PADDLE not in ("paddlepaddle", "paddlepaddle-gpu", "none"):
    raise SystemExit(f"error: PPMULTI_PADDLE={PADDLE!r}: use paddlepaddle (CPU), paddlepaddle-gpu or none")

# PPMULTI_PADDLE_VERSION: 3.3.1 (the default on every Python) or 2.6.2 (the opt-in, Python 3.10/3.11 only).
PADDLE_VERSIONS = ("3.3.1", "2.6.2")
PADDLE_VERSION = (os.environ.get("PPMULTI_PADDLE_VERSION") or PADDLE_VERSIONS[0]).strip()
if PADDLE_VERSION not in PADDLE_VERSIONS:
    raise SystemExit(f"error: PPMULTI_PADDLE_VERSION={PADDLE_VERSION!r}: use 3.3.1 (the default) or 2.6.2")
PADDLE_26 = PADDLE_VERSION == "2.6.2"
if PADDLE_26 and sys.version_info[:2] > (3, 11):
    raise SystemExit(f"error: PPMULTI_PADDLE_VERSION=2.6.2 is tested on Python 3.10 and 3.11 only, this is Python "
                     f"{sys.version_info[0]}.{sys.version_info[1]}: unset it (Paddle 3.3.1) or use a 3.10/3.11 venv")

PADDLE_REQUIRES = [] if PADDLE == "none" else [f"{PADDLE}=={PADDLE_VERSION}"]

# Paddle 2.6.2 only, each checked on Python 3.10/3.11 + Paddle 2.6.2 (docs/stacks.md, "Pins"). Its libpaddle.so
# carries zlib 1.2.8 with exported symbols and also links the system's libz.so.1: when `import paddle` comes first,
# the system libz's own calls bind to Paddle's copy, and later zlib users die in inflateReset2. Modules built by a
# Cython with string compression (CYTHON_COMPRESS_STRINGS) unpack their constants with zlib at import; the caps
# below are the newest releases built without it.
PADDLE_26_REQUIRES = [
    "protobuf<7",                         # 7.x breaks Paddle 2.6's fleet.init (FieldDescriptor has no `label`)
    "numpy<2",                            # the numpy line Paddle 2.6.2 was released and tested with (1.26 here)
    "scikit-learn<1.8",                   # 1.8.0+: SIGSEGV in inflateReset2 on `import paddle; import sklearn`
    "scipy<1.17",                         # 1.17.x: `zlib.error: Error -2 ... inconsistent stream state` the same way
    "pyclipper<1.4",                      # 1.4.0: SIGSEGV the same way
    "pycocotools<2.0.11",                 # 2.0.11+: SIGSEGV in inflateReset2 after `import paddle`
    "lap<0.5.13",                         # the same
    "pyarrow<23",                         # 23.0+: `import pandas` (which imports pyarrow) dies the same way (MLflow
                                          # brings pyarrow; ppdet imports pandas)
]

# paddledet 2.6.0 is NOT listed: its metadata pins numpy<1.24 (no wheel for 3.12+), opencv-python<=4.6.0 and the
# empty `sklearn` stub, and pip cannot ignore one dependency's requirements. README installs it with --no-deps
# first; what `import ppdet`, `ppdet.modeling`, `ppdet.metrics` and ppmulti really need is declared here.
REQUIRES = PADDLE_REQUIRES + (PADDLE_26_REQUIRES if PADDLE_26 else []) + [
    # ppdet imports pkg_resources (model_zoo.py), which setuptools 81+ dropped. The floor is torch's own
    # (2.13/2.14 require setuptools>=77.0.3): with it already met, a later `pip install torch` (the converter)
    # keeps this setuptools instead of upgrading it to one without pkg_resources
    "setuptools>=77.0.3,<81",
    "pycocotools",                        # COCO metric (ppdet.metrics)
    "lap",                                # ppdet.modeling.mot imports it (a warning line without it)
    "scikit-learn",                       # the real `sklearn` that ppdet imports (its metadata names the stub)
    # ppdet's transforms, demo data, drawing. Below 5.1: 5.1's 8-bit HSV conversions differ from 5.0's (YOLOv5's
    # HSV augment: up to 2 levels in about 9% of values), and the HSV augment on the device is measured against
    # 5.0's (tests/test_pipeline.py: within 1 level, at most 3% off)
    "opencv-python<5.1",
    "tqdm", "typeguard", "PyYAML", "shapely", "scipy", "terminaltables", "pyclipper",   # ppdet's own list
    "requests", "six", "pandas",          # imported by ppdet, missing from its metadata
    "motmetrics",                         # without it ppdet.metrics prints two warnings in every rank's log
    "matplotlib",                         # results.png, PR_curve.png, evolve plots
    "visualdl",                           # training dashboards
    "filelock>=3.11",                     # one builder of the compiled ops, one writer of a data cache
    "optuna>=4",                          # evolution's population: a study in SQLite (default) or PostgreSQL/MySQL
    "cmaes",                              # Optuna's CMA-ES sampler (--sampler cmaes)
    # oneDNN 3.2's C++ headers (188 KB, no library): ppmulti/rank/ops builds its CPU convolution against the
    # libdnnl inside Paddle's wheel, which ships without them
    "onednn-devel-cpu-gomp==2023.2.0; platform_machine == 'x86_64' and sys_platform == 'linux'",
]

# tools/export.py --format onnx / --include onnx, in the default install so that README's export line runs as typed
# after README's install (the `export` extra remains, for installs that name it). paddle2onnx by Paddle: 1.3.1
# reads Paddle 2.6's model.pdmodel (2.x imports paddle.decomposition, absent in 2.6); 2.1.0 reads Paddle 3's PIR
# model.json (1.x knows no PIR; compat.pir_interp_scale_as_float bridges Paddle 3.3.1's double interp scales).
# onnx edits the batch dimension; onnxruntime runs the result (and turns float32 graphs into float16 for --half);
# onnxslim is --simplify.
# Python 3.13: paddle2onnx publishes no wheel (2.1.0 stops at 3.12) and onnx 1.17 none either, so the extra brings
# onnxruntime alone there and --format onnx says to export from a 3.10-3.12 environment (registry, 2026-12-01:
# `pip download paddle2onnx==2.1.0 --python-version 3.X --only-binary=:all:` finds wheels for 3.10-3.12, none for 3.13).
BELOW_313 = "python_version < '3.13'"
EXPORT = ([f"paddle2onnx==1.3.1; {BELOW_313}"] if PADDLE_26 else [f"paddle2onnx==2.1.0; {BELOW_313}"]) + [
    f"onnx<=1.17.0; {BELOW_313}", f"onnxslim; {BELOW_313}", "onnxruntime"]
REQUIRES += EXPORT
TEST = ["pytest>=7.3", "pytest-timeout", "pytest-rerunfailures>=12"]
DOCS = ["mkdocs>=1.6", "mkdocs-material>=9.5"]
LINT = ["ruff==0.17.6"]
# evolution across machines on PostgreSQL (the driver), the study's dashboard in a browser, and the trackers beside
# VisualDL (`--logger tensorboard,mlflow`)
POSTGRESQL = ["psycopg2-binary"]
DASHBOARD = ["optuna-dashboard"]
TENSORBOARD = ["tensorboard"]
MLFLOW = ["mlflow"]

setup(
    name="ppmulti",
    version=VERSION,
    description="Multi-GPU and multi-machine YOLO training on PaddlePaddle, built on ppdet",
    license="Apache-2.0",
    packages=find_packages(include=["ppmulti", "ppmulti.*"]),
    package_data={"ppmulti.rank.ops": ["*.cc"]},
    # tested on 3.10-3.13; Paddle has no wheels for 3.14 yet
    python_requires=">=3.10,<3.14",
    install_requires=REQUIRES,
    extras_require={"test": TEST, "export": EXPORT, "docs": DOCS, "lint": LINT, "postgresql": POSTGRESQL,
                    "dashboard": DASHBOARD, "tensorboard": TENSORBOARD, "mlflow": MLFLOW,
                    "dev": TEST + EXPORT + DOCS + LINT + POSTGRESQL + DASHBOARD + TENSORBOARD + MLFLOW},
    entry_points={"console_scripts": ["ppmulti = ppmulti.cli:main"]},
)
