"""Install ppmulti: `pip install -e .` (CPU Paddle) or `PPMULTI_PADDLE=paddlepaddle-gpu pip install -e .`."""

import os
import re

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', open("ppmulti/__init__.py").read()).group(1)

# The Paddle wheel: CPU by default; set PPMULTI_PADDLE=paddlepaddle-gpu for CUDA machines.
PADDLE = os.environ.get("PPMULTI_PADDLE", "paddlepaddle")

REQUIRES = [
    f"{PADDLE}==2.6.2",          # ppdet 2.6.0 fails on Paddle 3.x (int32/int64 type promotion in its assigners)
    "paddledet==2.6.0",          # models, data pipeline, losses, metrics
    "numpy<1.24",                # paddledet 2.6.0's own requirement
    "protobuf==3.20.3",          # newer protobuf breaks fleet's DistributedStrategy (FieldDescriptor.label)
    "pycocotools<2.0.11",        # 2.0.11+ segfaults in inflateReset2 when imported after paddle
    "lap<0.5.13",                # same segfault as pycocotools in newer builds
    "scikit-learn<1.6",          # paddledet needs the real sklearn; it only pulls the empty stub
    "visualdl",                  # training dashboards
    "filelock>=3.11",            # shared evolve.csv across workers (thread-local locks: workers are threads)
    "tqdm",                      # progress bars
    "matplotlib",                # results.png, PR_curve.png, evolve plots (visualdl pulls it too; we import it)
    "PyYAML",                    # configs and dataset yamls
    "opencv-python",             # demo data and drawing (paddledet pulls a compatible build)
    # oneDNN 3.2's C++ headers (188 KB, no library): ppmulti/rank/ops builds its CPU convolution against the
    # libdnnl 3.2.1 inside Paddle's wheel, which ships without them
    "onednn-devel-cpu-gomp==2023.2.0; platform_machine == 'x86_64' and sys_platform == 'linux'",
]

setup(
    name="ppmulti",
    version=VERSION,
    description="Multi-GPU and multi-machine YOLO training on PaddlePaddle, built on ppdet",
    packages=find_packages(include=["ppmulti", "ppmulti.*"]),
    package_data={"ppmulti.rank.ops": ["*.cc"]},
    python_requires=">=3.8",
    install_requires=REQUIRES,
    extras_require={"test": ["pytest>=7", "pytest-timeout", "pytest-rerunfailures>=12"]},
    entry_points={"console_scripts": ["ppmulti = ppmulti.cli:main"]},
)
