"""Worker side of collective training: fleet init, rank helpers, rank-0-first, object gathering."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, TypeVar

from ppmulti.common.errors import UserError
from ppmulti.rank import compat
from ppmulti.common.cpus import choose_cpu_threads, usable_cores
from ppmulti.rank import heartbeat

_INITIALISED = False
T = TypeVar("T")


def world_size() -> int:
    import paddle.distributed as dist

    return dist.get_world_size() if _INITIALISED else _env_world()


def rank() -> int:
    import paddle.distributed as dist

    return dist.get_rank() if _INITIALISED else _env_rank()


def is_main() -> bool:
    return rank() == 0


def _env_rank() -> int:
    from ppmulti.common.envvars import worker_info

    return worker_info().rank


def _env_world() -> int:
    from ppmulti.common.envvars import worker_info

    return worker_info().world_size


def init() -> int:
    """Join the collective group when started by Paddle's launcher; return the world size.

    Uses ``fleet.init(is_collective=True)`` (never single-process DataParallel). On CPU
    Paddle picks the gloo backend by itself.
    """
    global _INITIALISED
    if _INITIALISED:
        return world_size()
    if _env_world() <= 1:
        return 1
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    # Fuse small gradients into ~32 MB buckets before all-reduce.
    strategy.fuse_all_reduce_ops = True
    strategy.fuse_grad_size_in_MB = 32
    fleet.init(is_collective=True, strategy=strategy)
    heartbeat.watch_paddle()   # a rank blocked in a collective inside forward is waiting; fatal signals leave a stack
    _INITIALISED = True
    return world_size()


def barrier() -> None:
    if world_size() > 1:
        import paddle.distributed as dist

        dist.barrier()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 does the body first (e.g. a download or a cache), the others wait, then follow."""
    if not is_main():
        barrier()
    yield
    if is_main():
        barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` as a list indexed by rank (a one-element list when alone)."""
    if world_size() <= 1:
        return [obj]
    import paddle.distributed as dist

    out: list[Any] = []
    dist.all_gather_object(out, obj)
    return out


def made_on_main(make: Callable[[], T], follow: Callable[[T], Any] | None = None, mine: Any = None,
                 check: Callable[[list[Any]], None] | None = None, *,
                 gather: Callable[[Any], list[Any]] | None = None, main: bool | None = None) -> T:
    """Rank 0's ``make()``, handed to every rank in one gather: what needs the world is made once, where every
    rank would otherwise make its own. Every rank sends ``mine`` too, and ``check(every rank's mine)`` runs on
    each before rank 0's value is used (the ranks' config digests: the same refusal on every rank). The other
    ranks then call ``follow(value)`` (rank 0 did that work inside ``make``).

    A UserError in ``make`` is the same one line on every rank, raised after the gather: no rank is left waiting
    for one that stopped. ``gather`` / ``main``: all_gather_object and is_main() unless given (tests)."""
    main = is_main() if main is None else main
    made, said, failure = None, None, None   # said: (a user's error?, its line), what the other ranks raise
    if main:
        try:
            made = make()
        except UserError as exc:
            failure, said = exc, (True, str(exc))
        except Exception as exc:   # our own failure: said to the others so that they stop too
            failure, said = exc, (False, f"rank 0 stopped while making the plan ({type(exc).__name__}: {exc}); "
                                         f"see its log")
    gathered = (gather or all_gather_object)((mine, made, said))
    if check is not None:
        check([g[0] for g in gathered])
    if failure is not None:
        raise failure
    _, made, said = gathered[0]
    if said is not None:
        raise UserError(said[1]) if said[0] else RuntimeError(said[1])
    if not main and follow is not None:
        follow(made)
    return made


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum small float lists across ranks (for throughput and loss logging)."""
    if world_size() <= 1:
        return list(values)
    import paddle
    import paddle.distributed as dist

    t = paddle.to_tensor(values, dtype="float64")
    dist.all_reduce(t)
    return [float(v) for v in t.numpy()]


def set_cpu_threads(local_size: int | None = None, spare: int = 0) -> int:
    """Give each rank its share of this machine's cores, less ``spare`` (cpus.choose_cpu_threads); returns the
    thread count set.

    Why this is needed: ``import paddle`` sets OMP_NUM_THREADS=1 when it is unset (paddle/base/__init__.py),
    so a Paddle process computes on one thread -- MKL's GEMM inside conv2d/matmul included -- whatever the
    machine has. ``compat.set_num_threads`` sets the OpenMP and MKL thread counts in this process.
    With more than one thread, Intel OpenMP's idle threads spin for KMP_BLOCKTIME (200 ms) after every
    parallel region; on a machine whose cores are all taken (ranks, loader workers, other jobs) that
    spinning steals the core another process needs, so unless the user chose a blocktime the threads
    sleep at once (0). The variable is read when OpenMP initialises, which is the first call below.
    """
    from ppmulti.common.envvars import KMP_BLOCKTIME, PPMULTI_CPU_THREADS, worker_info

    n_local = local_size or worker_info().local_size or 1
    threads = choose_cpu_threads(usable_cores(), n_local, os.environ.get(PPMULTI_CPU_THREADS), spare)
    if threads > 1:
        os.environ.setdefault(KMP_BLOCKTIME, "0")
    compat.set_num_threads(threads)
    return threads
