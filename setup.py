"""Install ppmulti: `pip install --no-deps paddledet==2.6.0 && pip install -e .` (README, "Set-up on a fresh machine")."""

import os
import re

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', open("ppmulti/__init__.py").read()).group(1)

# Which Paddle wheel to require: "paddlepaddle" (CPU, the default), "paddlepaddle-gpu" (CUDA, Python < 3.12:
# PyPI has paddlepaddle-gpu 2.6.2 only), or "none" for a user who installed Paddle already (e.g.
# paddlepaddle-gpu 3.x from Paddle's own index): pip would otherwise put a second distribution of the `paddle`
# module beside it, because it cannot know that paddlepaddle and paddlepaddle-gpu provide the same module.
PADDLE = (os.environ.get("PPMULTI_PADDLE") or "paddlepaddle").strip().lower()
if PADDLE not in ("paddlepaddle", "paddlepaddle-gpu", "none"):
    raise SystemExit(f"error: PPMULTI_PADDLE={PADDLE!r}: use paddlepaddle (CPU), paddlepaddle-gpu or none")

PY_OLD = "python_version < '3.12'"    # stack 1: Paddle 2.6.2 (its wheels stop at 3.12; 3.12 goes to stack 2)
PY_NEW = "python_version >= '3.12'"   # stack 2: Paddle 3.3.1 (the only Paddle with 3.13 wheels)
NO_P2O = "python_version >= '3.13'"   # no paddle2onnx wheel for it (checked on PyPI, 2026-11-23)

PADDLE_REQUIRES = [] if PADDLE == "none" else [
    f"{PADDLE}==2.6.2; {PY_OLD}",
    f"{PADDLE}==3.3.1; {PY_NEW}",
]

# paddledet 2.6.0 is NOT listed: its metadata pins numpy<1.24 (no wheel for 3.12+), opencv-python<=4.6.0 and the
# empty `sklearn` stub, and pip cannot ignore one dependency's requirements. README installs it with --no-deps
# first; what `import ppdet`, `ppdet.modeling`, `ppdet.metrics` and ppmulti really need is declared here.
REQUIRES = PADDLE_REQUIRES + [
    # --- stack 1 (Paddle 2.6.2), each re-checked on Python 3.11 + Paddle 2.6.2 ---
    f"protobuf<7; {PY_OLD}",              # 7.x breaks Paddle 2.6's fleet.init (FieldDescriptor.label); 4.25, 6.33 work
    f"pycocotools<2.0.11; {PY_OLD}",      # 2.0.11+ segfaults in inflateReset2 when imported after Paddle 2.6
    f"lap<0.5.13; {PY_OLD}",              # the same segfault
    f"scipy<1.17; {PY_OLD}",              # 1.17.1 fails after a bare `import paddle` 2.6 ("zlib.error: Error -2 ...
                                          # inconsistent stream state"); ppmulti's own order avoids all three
                                          # (compat.before_paddle_import), the pins keep users' scripts working
    f"numpy<2; {PY_OLD}",                 # 1.26 trains as 1.23 did; numpy 2 is stack 2's (2.5 refuses float() of
                                          # ppmulti's [1]-shaped YOLOv5 loss parts until that fix lands)
    # --- both stacks ---
    # ppdet imports pkg_resources (model_zoo.py), which setuptools 81+ dropped. The floor is torch's own
    # (2.13/2.14 require setuptools>=77.0.3): with it already met, a later `pip install torch` (the converter)
    # keeps this setuptools instead of upgrading it to one without pkg_resources
    "setuptools>=77.0.3,<81",
    "pycocotools",                        # COCO metric (ppdet.metrics); stack 2 takes the newest
    "lap",                                # ppdet.modeling.mot imports it (a warning line without it)
    "scikit-learn",                       # the real `sklearn` that ppdet imports (its metadata names the stub)
    "opencv-python",                      # ppdet's transforms, demo data, drawing
    "tqdm", "typeguard", "PyYAML", "shapely", "scipy", "terminaltables", "pyclipper",   # ppdet's own list
    "requests", "six", "pandas",          # imported by ppdet, missing from its metadata
    "motmetrics",                         # without it ppdet.metrics prints two warnings in every rank's log
    "matplotlib",                         # results.png, PR_curve.png, evolve plots
    "visualdl",                           # training dashboards
    "filelock>=3.11",                     # shared evolve.csv across workers (thread-local locks: workers are threads)
    # oneDNN 3.2's C++ headers (188 KB, no library): ppmulti/rank/ops builds its CPU convolution against the
    # libdnnl inside Paddle's wheel, which ships without them
    "onednn-devel-cpu-gomp==2023.2.0; platform_machine == 'x86_64' and sys_platform == 'linux'",
]

setup(
    name="ppmulti",
    version=VERSION,
    description="Multi-GPU and multi-machine YOLO training on PaddlePaddle, built on ppdet",
    packages=find_packages(include=["ppmulti", "ppmulti.*"]),
    package_data={"ppmulti.rank.ops": ["*.cc"]},
    # tested on 3.10-3.13; Paddle has no wheels for 3.14 yet
    python_requires=">=3.10,<3.14",
    install_requires=REQUIRES,
    extras_require={
        "test": ["pytest>=7", "pytest-timeout", "pytest-rerunfailures>=12"],
        # tools/export.py --format onnx (not needed for training). paddle2onnx by Paddle, as the stack markers
        # pick Paddle: 1.3.1 reads Paddle 2.6's model.pdmodel (2.x imports paddle.decomposition, absent in 2.6);
        # 2.1.0 reads Paddle 3's PIR model.json (1.x knows no PIR; compat.pir_interp_scale_as_float bridges
        # Paddle 3.3.1's double interp scales). onnx edits the batch dimension; onnxruntime runs the result.
        # Python 3.13: paddle2onnx publishes no wheel (2.1.0 stops at 3.12) and onnx 1.17 none either, so the extra
        # brings onnxruntime alone there and --format onnx says to export from a 3.10-3.12 environment.
        "export": [f"paddle2onnx==1.3.1; {PY_OLD}", f"paddle2onnx==2.1.0; {PY_NEW} and {NO_P2O.replace('>=', '<')}",
                   f"onnx<=1.17.0; {NO_P2O.replace('>=', '<')}", "onnxruntime"],
    },
    entry_points={"console_scripts": ["ppmulti = ppmulti.cli:main"]},
)
