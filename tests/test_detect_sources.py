"""detect's sources as YOLOv5's detect.py takes them: videos the test writes (mp4, avi, mkv), a folder mixing images and
videos, --vid-stride, a video URL and a live MJPEG stream served on loopback, a webcam that is not there; and, slow,
tools/detect.py end to end on them (NAME.mp4, NAME_FRAME.txt labels, crops, predictions.csv, end of stream, Ctrl-C)."""

from __future__ import annotations

import csv
import http.server
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import CONFIGS, REPO, run_tool

from ppmulti.common.errors import UserError
from ppmulti.rank.compat import quiet_opencv
from ppmulti.rank.engine import sources
from ppmulti.rank.engine.sources import FrameReader, resolve_source

# as tools/detect.py does before its first capture: FFmpeg reads its log level once a process, when first used
quiet_opencv()

STEP = 20   # grey level between consecutive frames: frame i is grey 10 + 20 i, told apart after lossy coding
CODECS = {".mp4": "mp4v", ".avi": "MJPG", ".mkv": "MJPG"}


def grey(i: int, size=(64, 64)) -> np.ndarray:
    return np.full((size[1], size[0], 3), 10 + STEP * i, np.uint8)


def level(image: np.ndarray) -> int:
    """Which frame a grey frame was (see ``grey``)."""
    return int(round((float(image.mean()) - 10) / STEP))


def write_video(path: Path, frames: int = 10, size=(64, 64), fps: float = 10.0) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*CODECS[path.suffix]), fps, size)
    assert writer.isOpened(), path
    for i in range(frames):
        writer.write(grey(i, size))
    writer.release()
    return path


def video_facts(path: Path) -> tuple[int, float, int, int]:
    """(frames, fps, width, height) of a video, counted by reading it."""
    cap = cv2.VideoCapture(str(path))
    try:
        fps, width, height = cap.get(cv2.CAP_PROP_FPS), cap.get(cv2.CAP_PROP_FRAME_WIDTH), \
            cap.get(cv2.CAP_PROP_FRAME_HEIGHT)
        n = 0
        while cap.read()[0]:
            n += 1
        return n, fps, int(width), int(height)
    finally:
        cap.release()


# ----------------------------------------------------------------------------- a loopback server
class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /clip.mp4: the file the test wrote; GET /live: an MJPEG stream of grey frames 0, 1, 2, ... every
    ``pace`` seconds, ``live_frames`` of them, or until ``stop_live`` is set when that is None (then the connection
    closes: the end of the stream)."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        if self.path == "/clip.mp4":
            body = server.clip.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path != "/live":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        self.end_headers()
        i = 0
        try:
            while (i < server.live_frames) if server.live_frames is not None else not server.stop_live.is_set():
                jpeg = cv2.imencode(".jpg", grey(i % 12, (64, 48)))[1].tobytes()
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpeg)
                                 + jpeg + b"\r\n")
                self.wfile.flush()
                i += 1
                time.sleep(server.pace)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server in a thread; stopped, its handler threads joined, when the test ends."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = False   # server_close() joins the handlers: nothing outlives the test
    srv.clip = write_video(tmp_path / "served.mp4")
    srv.live_frames, srv.pace, srv.stop_live = 8, 0.03, threading.Event()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield srv
    finally:
        srv.stop_live.set()
        srv.shutdown()
        srv.server_close()
        thread.join(10)


# ----------------------------------------------------------------------------- which source is which (golden)
def test_source_kinds_as_yolov5_tells_them_apart(tmp_path):
    assert resolve_source("0") == sources.Source("0", stream=0)
    assert resolve_source("rtsp://cam:554/live").stream == "rtsp://cam:554/live"
    assert resolve_source("http://host/cam").stream == "http://host/cam"
    # a URL of a video file is read as a file (all its frames), as YOLOv5 reads the file it downloads
    assert resolve_source("https://host/v/clip.mp4?t=1").files == ("https://host/v/clip.mp4?t=1",)
    assert sources.output_name("https://host/v/clip.mp4?t=1") == "clip.mp4"
    assert sources.output_name("rtsp://cam:554/") == "cam"
    assert sources.output_name("0") == "0"
    # a password in a URL is never printed
    assert sources.shown("rtsp://admin:s3cret@cam/1") == "rtsp://admin:***@cam/1"
    assert sources.shown("rtsp://cam/1") == "rtsp://cam/1" and sources.shown("a/b.mp4") == "a/b.mp4"
    # a folder: its images first, then its videos (YOLOv5's order), each sorted; a list may name videos too
    for name in ("b.mp4", "a.avi", "c.jpg", "d.png", "e.mkv", "notes.md"):
        (tmp_path / name).write_bytes(b"x")
    got = resolve_source(str(tmp_path))
    assert [Path(f).name for f in got.files] == ["c.jpg", "d.png", "a.avi", "b.mp4", "e.mkv"]
    assert [Path(f).name for f in got.videos] == ["a.avi", "b.mp4", "e.mkv"]
    assert [Path(f).name for f in resolve_source(str(tmp_path / "*.m*")).files] == ["b.mp4", "e.mkv"]
    (tmp_path / "list.txt").write_text("b.mp4\nc.jpg\n")
    assert [Path(f).name for f in resolve_source(str(tmp_path / "list.txt")).files] == ["c.jpg", "b.mp4"]


# ----------------------------------------------------------------------------- reading frames
def test_video_files_every_frame_or_every_nth(tmp_path):
    for suffix in CODECS:
        video = write_video(tmp_path / f"clip{suffix}")
        with FrameReader(resolve_source(str(video))) as reader:
            frames = list(reader)
        assert [level(f.image) for f in frames] == list(range(10)), suffix
        assert [f.frame for f in frames] == list(range(1, 11)) and {f.frames for f in frames} == {10}
        assert {f.mode for f in frames} == {"video"} and frames[0].image.shape == (64, 64, 3)
        assert frames[0].fps == pytest.approx(10.0)
    # --vid-stride 3: YOLOv5 reads the 3rd frame of every 3 (frames 3, 6, 9 of 10), numbered 1, 2, 3 of 3
    with FrameReader(resolve_source(str(tmp_path / "clip.mp4")), vid_stride=3) as reader:
        frames = list(reader)
    assert [level(f.image) for f in frames] == [2, 5, 8]
    assert [f.prefix for f in frames][-1] == f"video 1/1 (frame 3/3) {tmp_path / 'clip.mp4'}"


def test_a_folder_of_images_and_videos(tmp_path):
    cv2.imwrite(str(tmp_path / "a.png"), grey(3, (40, 30)))
    cv2.imwrite(str(tmp_path / "b.jpg"), grey(5, (40, 30)))
    write_video(tmp_path / "c.avi", frames=4)
    write_video(tmp_path / "d.mkv", frames=6)
    with FrameReader(resolve_source(str(tmp_path)), vid_stride=2) as reader:
        frames = list(reader)
    assert [(f.mode, f.name, f.frame, level(f.image)) for f in frames] == [
        ("image", "a.png", 0, 3), ("image", "b.jpg", 0, 5),
        ("video", "c.avi", 1, 1), ("video", "c.avi", 2, 3),
        ("video", "d.mkv", 1, 1), ("video", "d.mkv", 2, 3), ("video", "d.mkv", 3, 5)]
    assert frames[0].prefix == f"image 1/4 {tmp_path / 'a.png'}"
    assert frames[-1].prefix == f"video 4/4 (frame 3/3) {tmp_path / 'd.mkv'}"
    assert not reader._caps   # every capture released


def test_a_video_url_and_a_live_stream_on_loopback(server):
    # http://.../clip.mp4: a file, every frame, as from disk
    with FrameReader(resolve_source(f"{server.url}/clip.mp4")) as reader:
        frames = list(reader)
    assert [level(f.image) for f in frames] == list(range(10)) and frames[0].name == "clip.mp4"

    # http://.../live: a stream (MJPEG, 8 frames, then the server closes it); the newest frame each time, numbered
    # 0, 1, ... as detected; the last one is never lost; the reader thread and the capture are gone after
    for stride, kept in ((1, set(range(8))), (2, {0, 2, 4, 6})):
        with FrameReader(resolve_source(f"{server.url}/live"), vid_stride=stride) as reader:
            assert reader.stream_info.startswith(f"stream {server.url}/live: opened, 64x48 at ")
            thread = reader._thread
            frames = list(reader)
        seen = [level(f.image) for f in frames]
        assert set(seen) <= kept and seen == sorted(seen) and seen[-1] == max(kept), (stride, seen)
        assert [f.frame for f in frames] == list(range(len(frames))) and {f.mode for f in frames} == {"stream"}
        assert frames[0].name == "live" and frames[0].prefix == f"stream (frame 0) {server.url}/live"
        assert not thread.is_alive() and not reader._caps


def test_sources_that_cannot_be_opened_are_one_line(tmp_path, server, capfd):
    (tmp_path / "bad.mp4").write_bytes(b"not a video" * 10)
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    cases = [
        ("99", "--source 99: webcam 99 cannot be opened (no such camera, or it is busy)"),
        ("http://127.0.0.1:9/live", "stream http://127.0.0.1:9/live cannot be opened: check the address"),
        (f"{server.url}/missing", "cannot be opened: check the address"),   # HTTP 404
        (str(tmp_path / "bad.mp4"), "bad.mp4 cannot be opened: the file is damaged"),
        (str(tmp_path / "bad.jpg"), "bad.jpg cannot be read as an image"),
    ]
    for source, message in cases:
        reader = FrameReader(resolve_source(source))
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            with reader:
                list(reader)
        assert not reader._caps
    assert capfd.readouterr().err == ""   # OpenCV's and FFmpeg's own lines are silenced: ppmulti's one line is all


def test_frames_are_fed_to_the_model_as_image_files_are(tmp_path):
    """A decoded frame goes through the config's TestReader transforms after Decode: the same arrays as the
    TestReader makes from the image file (YOLOv5's letterbox and PP-YOLOE's resize)."""
    from ppdet.core.workspace import create

    import ppmulti.rank.models  # noqa: F401
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine.detect import FrameFeeder
    from ppmulti.rank.engine.sources import read_image

    image = tmp_path / "noise.png"
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (48, 80, 3), dtype=np.uint8))
    for config in ("yolov5/yolov5_n_300e_coco.yml", "ppyoloe/ppyoloe_crn_s_300e_coco.yml"):
        cfg = config_mod.load(CONFIGS / config, {"TestReader": {"batch_size": 1}})
        dataset = create("TestDataset")()
        dataset.set_images([str(image)])
        want = next(iter(create("TestReader")(dataset, 0)))
        got = FrameFeeder(cfg)(read_image(image))
        for key in ("image", "im_shape", "scale_factor"):
            np.testing.assert_array_equal(got[key], want[key].numpy(), err_msg=f"{config} {key}")


# ----------------------------------------------------------------------------- tools/detect.py end to end (slow)
CONFIG = CONFIGS / "yolov5" / "yolov5_n_300e_coco.yml"


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """YOLOv5n (COCO's 80 classes), random weights whose head biases say 'an object, class 0 (person)' everywhere,
    so that every frame has boxes to write: labels, crops and CSV rows."""
    import paddle
    from ppdet.core.workspace import create

    import ppmulti.rank.models  # noqa: F401
    from ppmulti.rank import config as config_mod

    cfg = config_mod.load(CONFIG, {})
    paddle.seed(0)
    model = create(cfg.architecture)
    state = model.state_dict()
    for key in [k for k in state if k.startswith("yolo_head.convs.") and k.endswith(".bias")]:
        bias = state[key].numpy().reshape(3, -1)   # per anchor: x, y, w, h, objectness, 80 classes
        bias[:, 4] += 6
        bias[:, 5] += 6
        state[key].set_value(bias.reshape(-1))
    path = tmp_path_factory.mktemp("detect_weights") / "w.pdparams"
    paddle.save(model.state_dict(), str(path))
    return path


def _detect(weights: Path, *flags: str) -> list[str]:
    return [str(REPO / "tools" / "detect.py"), "--weights", str(weights), "-c", str(CONFIG), "--imgsz", "64",
            "--max-det", "2", "--device", "cpu", *flags]


@pytest.mark.slow
def test_detect_on_images_and_a_video_writes_what_yolov5_writes(weights, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(1)
    for name in ("img0.jpg", "img1.png"):
        cv2.imwrite(str(src / name), rng.integers(0, 255, (64, 96, 3), dtype=np.uint8))
    write_video(src / "clip.mp4", frames=10, size=(96, 64), fps=10.0)
    proc = run_tool(_detect(weights, "--source", str(src), "--vid-stride", "3", "--save-txt", "--save-crop",
                            "--save-csv"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "Results saved to runs/detect/exp"
    out = tmp_path / "runs" / "detect" / "exp"
    # a progress line a frame, YOLOv5's: image 1/3 ..., video 3/3 (frame 1/3) ... (frame 3/3)
    for prefix in (f"image 1/3 {src / 'img0.jpg'}: 96x64 2 person", f"video 3/3 (frame 3/3) {src / 'clip.mp4'}: 96x64"):
        assert prefix in proc.stderr, proc.stderr[-3000:]
    assert "2 images, 3 video frames, 10 detections in" in proc.stderr
    # the video out: NAME.mp4 with the 10 // 3 frames read, the source's size and rate; no partial file left
    assert video_facts(out / "clip.mp4") == (3, 10.0, 96, 64)
    assert f"3 frames written to {Path('runs/detect/exp/clip.mp4')}" in proc.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["clip.mp4", "img0.jpg", "img1.png",
                                                                      "predictions.csv"]
    # labels: NAME.txt for an image, NAME_FRAME.txt for a video frame (frames numbered from 1)
    assert sorted(p.name for p in (out / "labels").iterdir()) == \
        ["clip_1.txt", "clip_2.txt", "clip_3.txt", "img0.txt", "img1.txt"]
    boxes = {p.stem: p.read_text().splitlines() for p in (out / "labels").iterdir()}
    assert all(len(lines) == 2 and lines[0].startswith("0 ") for lines in boxes.values())
    # crops/CLASS/NAME.jpg, NAME2.jpg, ... one a box, each a little larger than its box and inside the frame
    crops = sorted(p.name for p in (out / "crops" / "person").iterdir())
    assert crops == sorted(["img0.jpg", "img02.jpg", "img1.jpg", "img12.jpg", "clip.jpg"]
                           + [f"clip{n}.jpg" for n in range(2, 7)])
    for crop in (out / "crops" / "person").iterdir():
        h, w = cv2.imread(str(crop)).shape[:2]
        assert 0 < w <= 96 and 0 < h <= 64
    # predictions.csv: YOLOv5's columns, a row a box, the file's name for a video's frames too
    with open(out / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["Image Name", "Prediction", "Confidence"] and len(rows) == 10
    assert [r["Image Name"] for r in rows] == ["img0.jpg"] * 2 + ["img1.png"] * 2 + ["clip.mp4"] * 6
    assert {r["Prediction"] for r in rows} == {"person"} and all(0.25 < float(r["Confidence"]) <= 1 for r in rows)


class _Running:
    """tools/detect.py started in the background, its output lines read as they come."""

    def __init__(self, argv: list[str], cwd: Path):
        # -X faulthandler: a run that does not end is stopped with SIGABRT, which prints every thread's stack
        self.proc = subprocess.Popen([sys.executable, "-X", "faulthandler", *argv], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env={**_env(), "PYTHONUNBUFFERED": "1"},
                                     # Ctrl-C reaches it even where this process ignores SIGINT (a child inherits that)
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, needle: str, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while sum(needle in line for line in self.seen) < count:
            try:
                self.seen.append(self.lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"no {count} lines with {needle!r} in {timeout} s: {self.seen[-20:]}")

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(30)
            code = None
        self.reader.join(10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        if code is None:
            pytest.fail(f"detect did not end within {timeout} s; its last lines and stacks:\n"
                        + "\n".join(self.seen[-80:]))
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _env() -> dict:
    import os

    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(REPO))
    return env


@pytest.mark.slow
def test_detect_on_a_live_stream_until_it_ends_and_until_ctrl_c(weights, server, tmp_path):
    server.live_frames, server.pace = None, 0.05   # 20 FPS until the test stops it
    url = f"{server.url}/live"
    for run, stop in ((1, "the stream ends"), (2, "Ctrl-C")):
        server.stop_live.clear()
        running = _Running(_detect(weights, "--source", url, "--save-txt"), cwd=tmp_path)
        try:
            running.wait_for("stream (frame", 3)
            if stop == "Ctrl-C":
                running.proc.send_signal(signal.SIGINT)
            else:
                server.stop_live.set()   # the server closes the connection: the end of the stream
            code = running.finish()
        finally:
            running.stop()
        out = tmp_path / "runs" / "detect" / ("exp" if run == 1 else "exp2")
        text = "\n".join(running.seen)
        assert code == (0 if run == 1 else 130), text[-3000:]
        assert "Traceback" not in text and f"Results saved to {out.relative_to(tmp_path)}" in text
        assert f"stream {url}: opened, 64x48 at " in text
        detected = sum("stream (frame" in line for line in running.seen)
        assert detected >= 3 and (stop != "Ctrl-C" or "stopped by Ctrl-C" in text)
        # every frame detected on is in the video and has its label file NAME_FRAME.txt, numbered from 0
        assert video_facts(out / "live.mp4")[0] == detected and video_facts(out / "live.mp4")[2:] == (64, 48)
        assert sorted(p.name for p in (out / "labels").iterdir()) == sorted(f"live_{n}.txt" for n in range(detected))
        assert not [p for p in out.iterdir() if p.name.startswith(".")]
