"""CPU threads per rank: the pure choice, and in a real process what Paddle sets and what ppmulti changes
(read back from Intel OpenMP / MKL themselves)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ppmulti.common.cpus import choose_cpu_threads
from ppmulti.common.errors import UserError


@pytest.mark.parametrize("cores,ranks,override,expected", [
    (2, 1, None, 2), (2, 2, None, 1), (2, 4, None, 1), (8, 2, None, 4), (8, 3, None, 2), (1, 1, None, 1),
    (0, 1, None, 1), (16, 0, None, 16), (2, 2, "3", 3), (2, 1, " ", 2), (2, 1, "", 2), (64, 8, " 2 ", 2),
])
def test_choose_cpu_threads(cores, ranks, override, expected):
    assert choose_cpu_threads(cores, ranks, override) == expected


@pytest.mark.parametrize("cores,ranks,spare,expected", [
    (2, 1, 1, 1), (2, 2, 1, 1), (4, 1, 1, 3), (8, 2, 1, 3), (16, 1, 1, 15), (1, 1, 1, 1), (0, 1, 1, 1), (8, 2, 0, 4),
])
def test_choose_cpu_threads_leaves_spare_cores(cores, ranks, spare, expected):
    assert choose_cpu_threads(cores, ranks, None, spare) == expected
    assert choose_cpu_threads(cores, ranks, "5", spare) == 5   # PPMULTI_CPU_THREADS still wins


@pytest.mark.parametrize("bad", ["x", "0", "-1", "1.5", "two"])
def test_choose_cpu_threads_rejects(bad):
    with pytest.raises(UserError, match="PPMULTI_CPU_THREADS"):
        choose_cpu_threads(2, 1, bad)


_PROBE = textwrap.dedent("""
    import ctypes, json, os, sys
    import paddle
    libs = os.path.join(os.path.dirname(paddle.__file__), "libs")
    omp = ctypes.CDLL(os.path.join(libs, "libiomp5.so"))
    mkl = ctypes.CDLL(os.path.join(libs, "libmklml_intel.so"))
    pinned = os.environ.get("OMP_NUM_THREADS")
    from ppmulti.rank.dist import set_cpu_threads
    chosen = set_cpu_threads(int(sys.argv[1]))
    print(json.dumps({"pinned": pinned, "chosen": chosen, "omp": omp.omp_get_max_threads(),
                      "mkl": mkl.MKL_Get_Max_Threads(), "blocktime": omp.kmp_get_blocktime()}))
""")


def _threads(local_ranks: int, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "KMP_BLOCKTIME", "MKL_NUM_THREADS",
                                                           "PPMULTI_CPU_THREADS")}
    r = subprocess.run([sys.executable, "-c", _PROBE, str(local_ranks)], capture_output=True, text=True,
                       env={**base, **env}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_paddle_pins_one_thread_and_ppmulti_sets_the_share():
    cores = len(os.sched_getaffinity(0))
    one = _threads(1)
    assert one["pinned"] == "1"     # paddle's import: OMP_NUM_THREADS=1 when unset
    assert one["chosen"] == one["omp"] == one["mkl"] == cores     # all cores for one rank, whatever the load
    two = _threads(2)
    assert two["chosen"] == two["omp"] == two["mkl"] == max(1, cores // 2)


def test_override_and_blocktime():
    got = _threads(2, PPMULTI_CPU_THREADS="2")
    assert got["omp"] == got["mkl"] == 2
    assert got["blocktime"] == 0    # idle OpenMP threads sleep instead of spinning 200 ms
    kept = _threads(2, PPMULTI_CPU_THREADS="2", KMP_BLOCKTIME="50")
    assert kept["blocktime"] == 50  # the user's own setting wins
    one = _threads(2, PPMULTI_CPU_THREADS="1")
    assert one["omp"] == 1 and one["blocktime"] == 200   # one thread: nothing spins, nothing changed
