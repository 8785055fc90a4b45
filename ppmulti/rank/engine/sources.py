"""YOLOv5 detect's --source kinds (images, videos, stream URLs, webcams) read as BGR frames; captures released."""

from __future__ import annotations

import glob
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from ppmulti.common.errors import UserError
from ppmulti.common.paths import IMAGE_SUFFIXES

log = logging.getLogger("ppmulti")

VIDEO_SUFFIXES = (".asf", ".avi", ".gif", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts", ".wmv")
STREAM_PREFIXES = ("rtsp://", "rtmp://", "http://", "https://")
STREAM_FPS = 30.0          # a stream that reports no frame rate (YOLOv5's fallback too)
NETWORK_TIMEOUT_MS = 15000  # opening, and each read of, a URL: a dead camera ends the run instead of hanging it
STOP_WAIT_S = 5.0          # how long closing waits for a stream's reader thread


def shown(text: str) -> str:
    """A source as printed: a URL's password replaced by *** (rtsp://user:pass@cam/1 -> rtsp://user:***@cam/1)."""
    if not str(text).lower().startswith(STREAM_PREFIXES):
        return str(text)
    parts = urlsplit(str(text))
    if parts.password is None:
        return str(text)
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _is_url(text: str) -> bool:
    return text.lower().startswith(STREAM_PREFIXES)


def _suffix(item: str) -> str:
    return Path(urlsplit(item).path if _is_url(item) else item).suffix.lower()


def output_name(item: str) -> str:
    """The file name results are named after: a path's name, a URL's last path part (else its host), a webcam's
    index ('0')."""
    if _is_url(item):
        parts = urlsplit(item)
        return Path(parts.path).name or (parts.hostname or "stream").replace(":", "_")
    return Path(item).name


@dataclass(frozen=True)
class Source:
    """What --source names: image and video files or video URLs (``files``, images first, as YOLOv5 orders them),
    or one live stream (``stream``: a URL, or a webcam's index)."""

    text: str
    files: tuple[str, ...] = ()
    stream: str | int | None = None

    @property
    def images(self) -> list[Path]:
        return [Path(f) for f in self.files if _suffix(f) in IMAGE_SUFFIXES]

    @property
    def videos(self) -> list[str]:
        return [f for f in self.files if _suffix(f) in VIDEO_SUFFIXES]


def resolve_source(source: str) -> Source:
    """YOLOv5's ``--source``: an image or video file, a folder, a glob, a .txt file of paths (one per line, relative
    to the current directory or to the list's folder), a video URL (http(s)://.../clip.mp4, read as a file), a stream
    URL (rtsp://, rtmp://, http(s):// without a video suffix) or a webcam index ('0'). Checks names only: opening
    happens in ``open_frames``."""
    text = str(source).strip()
    if text.isnumeric():
        return Source(text, stream=int(text))
    if text.lower().startswith("screen") or text.lower().endswith(".streams"):
        raise UserError(f"--source {text}: screen capture and .streams lists are not supported; pass one stream "
                        f"URL or webcam index (e.g. --source 0) per run")
    if _is_url(text):
        suffix = _suffix(text)
        if suffix in VIDEO_SUFFIXES:
            return Source(text, files=(text,))
        if suffix in IMAGE_SUFFIXES:
            raise UserError(f"--source {shown(text)}: an image URL; download the image and pass its path")
        return Source(text, stream=text)
    path = Path(text)
    if path.suffix.lower() == ".txt" and path.is_file():
        entries = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        files = [p if p.exists() else path.parent / p for p in map(Path, entries)]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise UserError(f"--source {text}: {len(missing)} listed paths are not files, e.g. {missing[0]}")
    elif "*" in text or "?" in text:
        files = [Path(p) for p in sorted(glob.glob(text, recursive=True)) if Path(p).is_file()]
    elif path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif path.is_file():
        files = [path]
    else:
        raise UserError(f"--source {text}: no such file or folder")
    images = [str(p) for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    videos = [str(p) for p in files if p.suffix.lower() in VIDEO_SUFFIXES]
    if not images and not videos:
        raise UserError(f"--source {text}: no images ({'/'.join(IMAGE_SUFFIXES)}) or videos "
                        f"({'/'.join(VIDEO_SUFFIXES)}) found")
    return Source(text, files=tuple(images + videos))


@dataclass
class Frame:
    """One picture to detect on: ``image`` (BGR, as OpenCV reads it) and where it came from. ``frame`` is YOLOv5's
    frame number (0 for an image, 1, 2, ... for a video's frames read, 0, 1, ... for a stream's frames detected on),
    ``frames`` a video's frame count at the stride (None when unknown), ``fps`` the video's or stream's rate."""

    image: np.ndarray
    item: str
    mode: str            # "image", "video" or "stream"
    index: int = 1       # the file's number among ``count``
    count: int = 1
    frame: int = 0
    frames: int | None = None
    fps: float = 0.0

    @property
    def name(self) -> str:
        return output_name(self.item)

    @property
    def stem(self) -> str:
        return Path(self.name).stem

    @property
    def prefix(self) -> str:
        """The start of the progress line, as YOLOv5 prints it."""
        if self.mode == "image":
            return f"image {self.index}/{self.count} {shown(self.item)}"
        if self.mode == "video":
            total = "?" if self.frames is None else self.frames
            return f"video {self.index}/{self.count} (frame {self.frame}/{total}) {shown(self.item)}"
        return f"stream (frame {self.frame}) {shown(self.item)}"


def _capture(item: str | int):
    """An OpenCV capture of a file, URL or webcam index (network reads time out); its errors go to our one line,
    not to stderr."""
    import cv2

    from ppmulti.rank.compat import quiet_opencv

    quiet_opencv()
    if isinstance(item, str) and _is_url(item):
        return cv2.VideoCapture(item, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, NETWORK_TIMEOUT_MS,
                                                       cv2.CAP_PROP_READ_TIMEOUT_MSEC, NETWORK_TIMEOUT_MS])
    return cv2.VideoCapture(item)


def _fps(cap) -> float:
    import cv2

    fps = cap.get(cv2.CAP_PROP_FPS)
    return fps if math.isfinite(fps) and 0 < fps < 1000 else STREAM_FPS


def _frame_count(cap, stride: int) -> int | None:
    import cv2

    count = cap.get(cv2.CAP_PROP_FRAME_COUNT)
    return int(count / stride) if math.isfinite(count) and count > 0 else None


def read_image(path: Path) -> np.ndarray:
    """An image file as ppdet's Decode reads it (imdecode of the file's bytes, colour, BGR)."""
    import cv2

    image = cv2.imdecode(np.fromfile(str(path), dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise UserError(f"--source: {path} cannot be read as an image (damaged, or not an image)")
    return image


class _LatestFrame(threading.Thread):
    """Reads a live stream as fast as it comes and keeps its newest frame (every ``stride``-th one), so detection
    runs on the present, not on a growing backlog, as YOLOv5's LoadStreams does."""

    def __init__(self, cap, first: np.ndarray, stride: int):
        super().__init__(name="ppmulti-stream", daemon=True)
        self.cap, self.stride = cap, stride
        self.cond = threading.Condition()
        self.latest: np.ndarray | None = first
        self.seq = 1          # frames kept so far (the first was read when the stream was opened)
        self.ended = False
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                if not self.cap.grab():
                    break      # end of stream, or a read timed out
                n += 1
                if n % self.stride:
                    continue
                ok, image = self.cap.retrieve()
                if not ok:
                    break
                with self.cond:
                    self.latest, self.seq = image, self.seq + 1
                    self.cond.notify_all()
        finally:
            with self.cond:
                self.ended = True
                self.cond.notify_all()

    def next_after(self, seen: int) -> tuple[np.ndarray, int] | None:
        """The newest frame kept after the ``seen``-th, waiting for one; None once the stream ended."""
        with self.cond:
            while self.seq <= seen and not self.ended:
                self.cond.wait(0.5)   # a timeout keeps Ctrl-C prompt
            if self.seq <= seen:
                return None
            return self.latest, self.seq


class FrameReader:
    """The frames of a ``Source``, every ``vid_stride``-th of a video or stream. A context manager: entering opens
    every video and the stream (one line naming what cannot be opened, before any model is loaded); leaving stops
    the stream's reader thread and releases every capture, also after an error or Ctrl-C."""

    def __init__(self, source: Source, vid_stride: int = 1):
        self.source, self.stride = source, vid_stride
        self._caps: list = []
        self._thread: _LatestFrame | None = None
        self.stream_info = ""

    # ---------------------------------------------------------------- opening and closing
    def __enter__(self) -> "FrameReader":
        try:
            for video in self.source.videos:   # each checked now, read later
                cap = self._open(video, "video")
                self._release(cap)
            if self.source.stream is not None:
                self._open_stream()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, item: str | int, what: str):
        cap = _capture(item)
        self._caps.append(cap)
        if not cap.isOpened():
            self._release(cap)
            shown_item = shown(str(item))
            if isinstance(item, int):
                raise UserError(f"--source {item}: webcam {item} cannot be opened (no such camera, or it is busy); "
                                f"pass the index of a connected camera")
            hint = "check the address, that the server is up and that OpenCV's FFmpeg reads the format" \
                if _is_url(str(item)) else "the file is damaged or in a format OpenCV's FFmpeg cannot read"
            raise UserError(f"--source {shown(self.source.text)}: {what} {shown_item} cannot be opened: {hint}")
        return cap

    def _open_stream(self) -> None:
        import cv2

        item = self.source.stream
        cap = self._open(item, "stream")
        ok, first = cap.read()
        if not ok or first is None:
            raise UserError(f"--source {shown(str(item))}: the stream opened but sent no frame within "
                            f"{NETWORK_TIMEOUT_MS // 1000} s")
        width, height = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        self.fps, self.frames = _fps(cap), _frame_count(cap, self.stride)
        total = "unknown number of" if self.frames is None else str(self.frames)
        self.stream_info = (f"stream {shown(str(item))}: opened, {width}x{height} at {self.fps:.2f} FPS, {total} "
                            f"frames")
        self._thread = _LatestFrame(cap, first, self.stride)   # started by the first read: not while a model loads

    def _release(self, cap) -> None:
        cap.release()
        if cap in self._caps:
            self._caps.remove(cap)

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None and thread.ident is not None:
            thread.stop.set()
            thread.join(STOP_WAIT_S)
            if thread.is_alive():   # blocked in a network read: releasing under it would crash; it times out alone
                self._caps.remove(thread.cap)
        for cap in list(self._caps):
            self._release(cap)

    # ---------------------------------------------------------------- reading
    def __iter__(self) -> Iterator[Frame]:
        if self.source.stream is not None:
            yield from self._stream()
            return
        files = self.source.files
        for index, item in enumerate(files, 1):
            if _suffix(item) in IMAGE_SUFFIXES:
                yield Frame(read_image(Path(item)), item, "image", index, len(files))
            else:
                yield from self._video(item, index, len(files))

    def _video(self, item: str, index: int, count: int) -> Iterator[Frame]:
        cap = self._open(item, "video")
        try:
            frames, fps = _frame_count(cap, self.stride), _fps(cap)
            n = 0
            while True:
                for _ in range(self.stride):   # YOLOv5's stride: the stride-th frame of every stride
                    cap.grab()
                ok, image = cap.retrieve()
                if not ok or image is None:
                    break
                n += 1
                yield Frame(image, item, "video", index, count, n, frames, fps)
            if n == 0:
                log.warning("%s: no frames read", shown(item))
        finally:
            self._release(cap)

    def _stream(self) -> Iterator[Frame]:
        thread, seen, count = self._thread, 0, 0
        assert thread is not None, "the stream is opened when the reader is entered"
        thread.start()
        while True:
            got = thread.next_after(seen)
            if got is None:
                return
            image, seen = got
            yield Frame(image, str(self.source.stream), "stream", 1, 1, count, self.frames, self.fps)
            count += 1
