"""Caches of a dataset: the validated scan cache, the node's shared RAM copy of decoded images, the .npy disk
cache, and the --cache flag's way into the config."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import mmap
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ppmulti.common import shm
from ppmulti.common.errors import UserError

log = logging.getLogger("ppmulti")

CACHE_MODES = ("ram", "disk")
SCAN_SUFFIX = ".ppmulti.cache"        # YOLOv5 writes labels/<split>.cache; this name cannot collide with it
SCAN_VERSION = "2"
RAM_SAFETY = 0.1                      # YOLOv5's check_cache_ram margin: need bytes * 1.1 < MemAvailable
LOCK_TIMEOUT = 3600.0                 # s a rank waits for another to build a cache (12,800 COCO images: ~1 min)


# ----------------------------------------------------------------------------- small helpers
def file_stamp(path: str | os.PathLike) -> tuple[int, int]:
    """(size, mtime_ns) of a file, (-1, -1) when it does not exist: what says a file changed."""
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


def _writable_dir(directory: Path) -> bool:
    return directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)


@contextlib.contextmanager
def build_lock(what: str | os.PathLike) -> Iterator[None]:
    """One process of the node builds ``what`` at a time; the others wait here, then find it built."""
    from filelock import FileLock

    path = shm.lock_path(str(what))
    with FileLock(path, timeout=LOCK_TIMEOUT):
        try:
            yield
        finally:
            # removed while held: a rank already waiting on it re-reads the finished cache; a later one finds
            # the cache and never locks (if the build failed, two may rebuild at once: atomic writes, no harm)
            with contextlib.suppress(OSError):
                os.unlink(path)


def threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


# ----------------------------------------------------------------------------- the scan cache
def scan_cache_path(first_label: Path) -> Path:
    """Beside the labels as YOLOv5 keeps its own (``labels/train`` -> ``labels/train.ppmulti.cache``); a
    read-only or missing labels folder keeps it under the user cache dir, keyed by that path."""
    labels_dir = Path(os.path.abspath(first_label)).parent
    beside = labels_dir.parent / (labels_dir.name + SCAN_SUFFIX)
    if _writable_dir(labels_dir.parent) and labels_dir.is_dir():
        return beside
    digest = hashlib.sha1(str(beside).encode()).hexdigest()[:20]
    return shm.user_cache_dir() / "scan" / f"{labels_dir.name}-{digest}{SCAN_SUFFIX}"


def scan_key(images: Sequence[Path], labels: Sequence[Path], extra: str) -> str:
    """A hash of every image's and label's path, size and mtime, and of how they are read (``extra``)."""
    h = hashlib.sha1(f"{SCAN_VERSION}|{extra}|".encode())
    for im, lb in zip(images, labels):
        s1, m1 = file_stamp(im)
        s2, m2 = file_stamp(lb)
        h.update(f"{im}\0{s1}\0{m1}\0{s2}\0{m2}\n".encode())
    return h.hexdigest()


SCAN_FIELDS = ("files", "status", "wh", "counts", "labels", "notes")


def _check_scan(arrays: dict[str, np.ndarray], n: int) -> bool:
    if any(k not in arrays for k in SCAN_FIELDS):
        return False
    files, status, wh, counts, labels, notes = (arrays[k] for k in SCAN_FIELDS)
    return (len(files) == n and len(status) == n and wh.shape == (n, 2) and counts.shape == (n,)
            and notes.shape == (n, 3) and labels.ndim == 2 and labels.shape[1] == 5
            and int(counts.sum()) == len(labels) and bool((counts >= 0).all()))


def read_arrays(path: Path, key: str, check: Callable[[dict[str, np.ndarray]], bool]) -> dict[str, np.ndarray] | None:
    """The arrays cached at ``path`` if they were made for ``key`` and pass ``check``; a missing, stale, foreign
    or corrupt file is None (never unpickled: arrays only)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["version"]) != SCAN_VERSION or str(z["key"]) != key:
                return None
            arrays = {k: z[k] for k in z.files if k not in ("version", "key")}
        if not check(arrays):
            raise ValueError("inconsistent arrays")
        return arrays
    except Exception as exc:  # a truncated zip, a foreign file, a missing field: rebuild
        log.warning("cache %s is unreadable (%s); rebuilding it", path, type(exc).__name__)
        return None


def write_arrays(path: Path, key: str, arrays: dict[str, np.ndarray]) -> Path | None:
    """Write atomically; on a read-only place fall back to the user cache dir; None if neither works."""
    from ppmulti.common.atomic import atomic_path

    for target in (path, shm.user_cache_dir() / "scan" / path.name):
        try:
            buf = io.BytesIO()
            np.savez(buf, version=np.array(SCAN_VERSION), key=np.array(key), **arrays)
            with atomic_path(target) as tmp:
                with open(tmp, "wb") as f:
                    f.write(buf.getbuffer())
            return target
        except OSError as exc:
            log.info("cannot write the cache %s (%s)", target, exc.strerror or exc)
    return None


def _read_any(path: Path, key: str, check) -> dict[str, np.ndarray] | None:
    arrays = read_arrays(path, key, check)
    fallback = shm.user_cache_dir() / "scan" / path.name   # where it went when the folder was read-only
    if arrays is None and fallback != path and fallback.is_file():
        arrays = read_arrays(fallback, key, check)
    return arrays


def cached_arrays(path: Path, key: str, compute: Callable[[], dict[str, np.ndarray]],
                  check: Callable[[dict[str, np.ndarray]], bool]) -> tuple[dict[str, np.ndarray], str]:
    """``compute()``'s arrays, read from ``path`` when it holds them for ``key``, else computed once per node (the
    first rank builds them under a lock, the others wait and read them). Returns (arrays, what happened)."""
    arrays = _read_any(path, key, check)
    if arrays is None:
        with build_lock(path):
            arrays = _read_any(path, key, check)   # another rank may have built it while this one waited
            if arrays is None:
                arrays = compute()
                where = write_arrays(path, key, arrays)
                return arrays, (f"cache {where} written" if where else "cache not written")
    return arrays, f"cache {path} read"


def cached_scan(images: Sequence[Path], labels: Sequence[Path], extra: str,
                compute: Callable[[], dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], str]:
    """The scan of ``images`` (``yolo.scan_files``), kept in ``scan_cache_path`` and valid while every image and
    label file has the size and mtime it had."""
    n = len(images)
    return cached_arrays(scan_cache_path(labels[0]), scan_key(images, labels, extra), compute,
                         lambda a: _check_scan(a, n))


# ----------------------------------------------------------------------------- RAM: one copy per node
def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_ram(nbytes: int, directory: str) -> None:
    """Refuse (UserError, one line) a RAM cache that would not fit: YOLOv5's rule, bytes x 1.1 < MemAvailable,
    and the shared-memory filesystem must have room for it too."""
    gib = 1 << 30
    need = nbytes * (1 + RAM_SAFETY)
    avail = mem_available()
    if avail is not None and need >= avail:
        raise UserError(f"--cache ram needs {nbytes / gib:.2f} GiB (+{RAM_SAFETY:.0%} margin) for one copy of "
                        f"the decoded images on this node, but only {avail / gib:.2f} GiB of memory is available; "
                        f"use --cache disk or no --cache")
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if nbytes > free:
        raise UserError(f"--cache ram needs {nbytes / gib:.2f} GiB in {directory}, which has {free / gib:.2f} GiB "
                        f"free; enlarge it (e.g. docker --shm-size) or use --cache disk")


_MAPPED: dict[str, np.ndarray] = {}   # key -> this process's mapping (a dataset built twice maps once)


def shared_pixels(key: str, nbytes: int, fill: Callable[[np.ndarray], None], local_size: int) -> np.ndarray:
    """A read-only byte array of ``nbytes``, one per node, shared by every local rank and its loader workers.

    The first local rank to come creates a file in /dev/shm, checks that it fits in memory, fills it (``fill``
    decodes the images into it, with threads) and publishes it by renaming; the others wait on a lock and map
    it. The last of ``local_size`` processes to map it unlinks it: the pages live on in every mapping (forked
    loader workers inherit them) and go when the last process ends, however it ends. A launcher whose rank
    died before that removes the leftovers (``ppmulti.common.shm.launch_leftovers``).
    """
    if key in _MAPPED:
        return _MAPPED[key]
    for stale in shm.dead_lone_leftovers():
        with contextlib.suppress(OSError):
            os.unlink(stale)
    path = shm.segment_path(key)
    count_path, lock_file = path + ".maps", path + ".lock"
    from filelock import FileLock

    with FileLock(lock_file, timeout=LOCK_TIMEOUT), _unlink_on_error(lock_file, count_path):
        if not os.path.exists(path):
            check_ram(nbytes, os.path.dirname(path))
            building = path + ".building"
            fd = os.open(building, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, max(1, nbytes))
                with mmap.mmap(fd, max(1, nbytes)) as mm:
                    fill(np.frombuffer(mm, np.uint8, nbytes))
                os.replace(building, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(building)
                raise
            finally:
                os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            mm = mmap.mmap(fd, max(1, nbytes), prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        pixels = np.frombuffer(mm, np.uint8, nbytes)
        try:
            with open(count_path) as f:
                mapped = int(f.read() or 0) + 1
        except (OSError, ValueError):
            mapped = 1
        if mapped >= local_size:
            for p in (path, count_path, lock_file):
                with contextlib.suppress(OSError):
                    os.unlink(p)
        else:
            with open(count_path, "w") as f:
                f.write(str(mapped))
    _MAPPED[key] = pixels
    return pixels


@contextlib.contextmanager
def _unlink_on_error(*paths: str) -> Iterator[None]:
    """A rank that fails (a refusal, a bad image) leaves no lock or count file behind in /dev/shm."""
    try:
        yield
    except BaseException:
        for p in paths:
            with contextlib.suppress(OSError):
                os.unlink(p)
        raise


def fill_parallel(n: int, one: Callable[[int], None]) -> None:
    """Run ``one(i)`` for every image with threads (OpenCV's decode and resize release the GIL)."""
    with ThreadPoolExecutor(threads()) as pool:
        for _ in pool.map(one, range(n)):
            pass


# ----------------------------------------------------------------------------- disk: <image>.<...>.npy
def npy_path(image: str, size: int, augment: bool) -> Path:
    """Where the decoded, resized ``image`` is kept: beside it as YOLOv5 does (a distinct name: YOLOv5's own
    ``<stem>.npy`` holds the full-size image), or under the user cache dir when its folder is read-only. The
    image's size and mtime are part of the name, so a changed image is decoded again."""
    size_b, mtime = file_stamp(image)
    stamp = hashlib.sha1(f"{size_b}:{mtime}".encode()).hexdigest()[:10]
    p = Path(os.path.abspath(image))
    name = f"{p.name}.{size}{'a' if augment else 'e'}.{stamp}.ppmulti.npy"
    if _writable_dir(p.parent):
        return p.parent / name
    digest = hashlib.sha1(str(p).encode()).hexdigest()[:20]
    return shm.user_cache_dir() / "images" / digest[:2] / f"{digest}.{name}"


def stale_npys(target: Path) -> list[Path]:
    """Older cache files of the same image and size (the image has changed since)."""
    head = target.name.rsplit(".", 3)[0]          # <image name>.<size><a|e>
    return [p for p in target.parent.glob(glob_escape(head) + ".*.ppmulti.npy") if p != target]


def glob_escape(text: str) -> str:
    import glob

    return glob.escape(text)


def save_npy(target: Path, image: np.ndarray) -> None:
    from ppmulti.common.atomic import atomic_path

    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, image)
    for old in stale_npys(target):
        with contextlib.suppress(OSError):
            old.unlink()


# ----------------------------------------------------------------------------- the flag
def parse_cache(value) -> str | None:
    """--cache / TrainDataset.cache: None or False (off), True or "" or "ram", "disk"."""
    if value in (None, False, "false", "False", "none", "None", "off"):
        return None
    if value is True or value in ("", "true", "True"):
        return "ram"
    if isinstance(value, str) and value.lower() in CACHE_MODES:
        return value.lower()
    raise UserError(f"--cache {value!r}: expected ram or disk (bare --cache means ram)")


def apply_cache(cfg, mode: str | None) -> None:
    """Point the training dataset's ``cache`` key at ``mode`` (a YOLO data yaml's dataset only)."""
    if mode is None:
        return
    node = cfg.get("TrainDataset")
    name = (dict(node).get("name") if node is not None else None)
    if name != "YOLODataSet":
        raise UserError(f"--cache {mode} works with YOLOv5 data yamls (--data data.yaml); this config's "
                        f"training set is {name or 'missing'}")
    node["cache"] = mode


def train_size(cfg) -> int:
    """The size the training pipeline loads images at: YOLOv5Mosaic's img_size (the op that reads the store),
    else YOLOv5Loss's img_size, else eval_height (--imgsz sets them all)."""
    for op in (cfg.get("TrainReader") or {}).get("sample_transforms") or []:
        body = op.get("YOLOv5Mosaic") if isinstance(op, dict) else None
        if isinstance(body, dict) and body.get("img_size"):
            return int(body["img_size"])
    loss = cfg.get("YOLOv5Loss")
    if loss is not None and dict(loss).get("img_size"):
        return int(dict(loss)["img_size"])
    return int(cfg.get("eval_height") or 640)


def prebuild_cache(dataset, cfg) -> None:
    """Build the training set's cached store now, in the rank's main process (a no-op without --cache): the
    loader's workers fork later and inherit it, and the pipeline's own call finds it built."""
    if getattr(dataset, "cache", None) is None or not hasattr(dataset, "image_store"):
        return
    import time

    t0 = time.perf_counter()
    store = dataset.image_store(train_size(cfg), augment=True)
    if dataset.cache == "ram":
        log.info("--cache ram: %d images, %.0f MB decoded, one copy shared by the ranks of this node (%.1f s)",
                 len(store), store.nbytes / 1e6, time.perf_counter() - t0)
    else:
        log.info("--cache disk: %d images, %d decoded now (%.1f s)", len(store), store.written,
                 time.perf_counter() - t0)
