"""Downloading pretrained weights once into a cache: YOLOv5's release assets and PaddleDetection's weight URLs,
with a progress bar, a size and sha256 check, atomic writes, a mirror (PPMULTI_WEIGHTS_MIRROR) and a clear offline
error."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, Mapping

from ppmulti.common import envvars as E
from ppmulti.common.atomic import atomic_path
from ppmulti.common.errors import UserError

# YOLOv5's release (utils/downloads.py attempt_download: repo ultralytics/yolov5, release v7.0) and its detection
# assets that ppmulti converts (P5 models; the -seg, -cls and P6 ones are refused when read).
YOLOV5_RELEASE = "https://github.com/ultralytics/yolov5/releases/download/v7.0"
YOLOV5_ASSETS = tuple(f"yolov5{size}.pt" for size in "nsmlx")
# ultralytics 8.4's detection release files (its attempt_download_asset: ultralytics/assets, tag v8.4.0)
ULTRA_RELEASE = "https://github.com/ultralytics/assets/releases/download/v8.4.0"
ULTRA_ASSETS = tuple(f"{family}{size}.pt" for family in ("yolov8", "yolo11", "yolo26") for size in "nsmlx")
MIN_BYTES = 100_000       # YOLOv5's safe_download refuses smaller files too (min_bytes=1e5)
TIMEOUT = 30.0            # seconds without a byte before a download is given up
CHECKSUM = ".sha256"      # beside every downloaded file: its sha256, written when the download completed


def weights_cache(environ: Mapping[str, str] | None = None) -> Path:
    """Where downloaded YOLOv5 weights are kept: $XDG_CACHE_HOME/ppmulti/weights (~/.cache/ppmulti/weights)."""
    env = os.environ if environ is None else environ
    base = env.get(E.XDG_CACHE_HOME) or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppmulti" / "weights"


def paddle_weights_cache() -> Path:
    """PaddleDetection's own weights cache (ppdet/utils/download.py WEIGHTS_HOME): files it downloaded are reused."""
    return Path(os.path.expanduser("~/.cache/paddle/weights"))


def is_url(text: str) -> bool:
    return urllib.parse.urlparse(str(text)).scheme in ("http", "https")


def yolov5_url(name: str) -> str:
    return f"{YOLOV5_RELEASE}/{name}"


def source_url(url: str, environ: Mapping[str, str] | None = None) -> str:
    """``url``, or its file name under the mirror that PPMULTI_WEIGHTS_MIRROR names."""
    env = os.environ if environ is None else environ
    mirror = (env.get(E.PPMULTI_WEIGHTS_MIRROR) or "").strip()
    if not mirror:
        return url
    return mirror.rstrip("/") + "/" + urllib.parse.urlparse(url).path.rsplit("/", 1)[-1]


@contextlib.contextmanager
def file_lock(what: str) -> Iterator[None]:
    """Hold a node-local lock for making the file ``what`` once: ranks of one node that need the same file wait
    here while the first one downloads or converts it. The lock is its folder's own (flock on the directory),
    so no lock file is left behind."""
    import fcntl

    folder = Path(what).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        # NFS may refuse a lock on a directory: then each process makes the file itself (atomic renames keep the
        # result whole), which costs time, never correctness
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing releases the lock


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(path: Path) -> bool:
    """A cached file whose sha256, recorded when its download completed, still matches (a file placed by hand,
    with no record, is taken as it is)."""
    record = Path(str(path) + CHECKSUM)
    if not path.is_file():
        return False
    if not record.is_file():
        return True
    return record.read_text().split()[0] == sha256_of(path)


def fetch(url: str, dest: str | os.PathLike, what: str, progress: bool = True) -> Path:
    """``dest``, downloaded from ``url`` (or the mirror) unless it is there and checks; one download per node.

    ``what`` names the setting the URL came from (``--weights yolov5s.pt``) in the one-line errors.
    """
    dest = Path(dest)
    src = source_url(url)
    with file_lock(str(dest)):
        if verified(dest):
            return dest
        if dest.is_file():
            print(f"{dest}: its sha256 no longer matches the one recorded at download; downloading it again",
                  file=sys.stderr)
        _download(src, dest, what, progress)
    return dest


def _download(src: str, dest: Path, what: str, progress: bool) -> None:
    by_hand = (f"download {src} on a machine that has a network and place it at {dest} (or pass its path), "
               f"or set {E.PPMULTI_WEIGHTS_MIRROR} to a server that has the file")
    print(f"{what}: downloading {src} to {dest}", file=sys.stderr)
    try:
        response = urllib.request.urlopen(src, timeout=TIMEOUT)   # noqa: S310 (http/https only, checked by is_url)
    except urllib.error.HTTPError as exc:
        raise UserError(f"{what}: {src} answered HTTP {exc.code} {exc.reason}; {by_hand}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"{what}: cannot download {src} (offline? {reason}); {by_hand}") from None
    with response:
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        digest = hashlib.sha256()
        got = 0
        bar = _bar(expected, dest.name) if progress else None
        try:
            with atomic_path(dest) as tmp, open(tmp, "wb") as out:
                while True:
                    try:
                        block = response.read(1 << 16)
                    except (OSError, ValueError) as exc:   # reset, timeout, IncompleteRead
                        raise UserError(f"{what}: the download of {src} broke off after {got} bytes "
                                        f"({type(exc).__name__}); nothing was kept; try again, or {by_hand}") from None
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    got += len(block)
                    if bar is not None:
                        bar.update(len(block))
                if expected is not None and got != expected:
                    raise UserError(f"{what}: the download of {src} ended after {got} of {expected} bytes; "
                                    f"nothing was kept; try again, or {by_hand}")
                if got < MIN_BYTES:
                    raise UserError(f"{what}: {src} gave {got} bytes, too few for weights (an error page?); "
                                    f"nothing was kept; {by_hand}")
                out.flush()
        finally:
            if bar is not None:
                bar.close()
    from ppmulti.common.atomic import atomic_write_text

    atomic_write_text(str(dest) + CHECKSUM, f"{digest.hexdigest()}  {dest.name}\n")


def _bar(total: int | None, name: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name, file=sys.stderr,
                disable=None)   # None: no bar when stderr is not a terminal (a rank's log file)


def yolov5_weights(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """A YOLOv5 release asset (``yolov5s.pt``) that is not on disk: its path in the cache, downloaded once;
    None for a name that is not one of YOLOv5's detection assets."""
    if Path(name).name != name or name not in YOLOV5_ASSETS:
        return None
    return fetch(yolov5_url(name), weights_cache(environ) / name, f"--weights {name}")


def ultra_weights(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """An ultralytics release file (``yolo11n.pt``) that is not on disk: its path in the cache, downloaded once
    (through the mirror when one is set); None for a name that is not one of its detection release files."""
    if Path(name).name != name or name not in ULTRA_ASSETS:
        return None
    return fetch(f"{ULTRA_RELEASE}/{name}", weights_cache(environ) / name, f"weights {name}")


def cached_yolov5(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """``name`` in the working directory or the cache, if it is already there (no download)."""
    for place in (Path(name), weights_cache(environ) / name):
        if place.is_file():
            return place
    return None


def paddle_weights(url: str) -> Path:
    """A PaddleDetection ``pretrain_weights`` URL as a local file: PaddleDetection's cache (~/.cache/paddle/weights,
    where its own tools put it), downloaded there once if missing."""
    name = urllib.parse.urlparse(url).path.rsplit("/", 1)[-1]
    if not name:
        raise UserError(f"pretrain_weights {url}: the URL names no file")
    return fetch(url, paddle_weights_cache() / name, f"pretrain_weights {url}")
