"""Pretrained starts: YOLOv5 .pt files read without torch, converted once and cached; release weights downloaded
from a loopback server (mirror, progress, size and sha256 checks, no partial file, the offline error); the head's
class layers re-initialised for another number of classes; the YOLOv5 command line without --weights."""

from __future__ import annotations

import argparse
import http.server
import logging
import os
import struct
import threading
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import ptwriter as W
from ppmulti.common import download, torchpt
from ppmulti.common.envvars import PPMULTI_WEIGHTS_MIRROR, XDG_CACHE_HOME
from ppmulti.common.errors import UserError
from ppmulti.rank.models.convert import map_name, read_pt

YOLOV5N = {"nc": 80, "depth_multiple": 0.33, "width_multiple": 0.25,
           "anchors": [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]],
           "backbone": [[-1, 1, "Conv", [64, 6, 2, 2]]] * 10, "head": [[-1, 1, "Conv", [512, 1, 1]]] * 15}
GRID = (np.array([[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]],
                 np.float32).reshape(3, 3, 2) / np.array([8, 16, 32], np.float32).reshape(3, 1, 1))
_CLASS = {"conv": "torch.nn.modules.conv.Conv2d", "bn": "torch.nn.modules.batchnorm.BatchNorm2d",
          "m": "torch.nn.modules.container.Sequential", "model": "torch.nn.modules.container.Sequential"}
_LAYER = {2: "C3", 4: "C3", 6: "C3", 8: "C3", 13: "C3", 17: "C3", 20: "C3", 23: "C3", 9: "SPPF", 24: "Detect"}


def yolov5_state(nc: int = 80, seed: int = 0) -> dict[str, np.ndarray]:
    """A YOLOv5n state dict (YOLOv5's names and shapes, taken from ppmulti's model through the name map)."""
    import ppmulti.rank.models  # noqa: F401  (registers the model)
    from ppdet.core.workspace import create

    from ppmulti.common.paths import CONFIGS
    from ppmulti.rank import config as config_mod
    from test_convert import yolov5_v6_keys

    cfg = config_mod.load(CONFIGS / "yolov5/yolov5_n_300e_coco.yml", {"num_classes": nc})
    own = create(cfg.architecture).state_dict()
    rng = np.random.default_rng(seed)
    state = {}
    for key in yolov5_v6_keys(0.33):
        mapped = map_name(key)
        if key.endswith("num_batches_tracked"):
            state[key] = np.array(5, np.int64)
        elif key.endswith("anchors"):
            state[key] = GRID
        else:
            state[key] = rng.standard_normal(own[mapped].shape).astype(np.float32)
    return state


def module_tree(state: dict[str, np.ndarray], half: bool = True, nc: int = 80, cls: str = "DetectionModel"):
    """The pickled DetectionModel of a YOLOv5 checkpoint: nested modules under YOLOv5's and torch's class names."""
    root = W.Module(f"models.yolo.{cls}", yaml={**YOLOV5N, "nc": nc}, names=[f"c{i}" for i in range(nc)],
                    nc=nc, stride=W.Tensor(np.array([8.0, 16.0, 32.0], np.float32)))
    for key, value in state.items():
        *path, leaf = key.split(".")
        node = root
        for depth, part in enumerate(path):
            children = node.state["_modules"]
            if part not in children:
                kind = _CLASS.get(part) or (f"models.common.{_LAYER.get(int(part), 'Conv')}" if depth == 1 else
                                            "models.common.Bottleneck" if path[depth - 1] == "m" and depth == 3 else
                                            "models.common.Conv")
                if depth == 2 and path[1] == "24" and part == "m":
                    kind = "torch.nn.modules.container.ModuleList"
                if depth == 3 and path[1] == "24":
                    kind = "torch.nn.modules.conv.Conv2d"
                children[part] = W.Module(kind)
            node = children[part]
        arr = value.astype(np.float16) if half and value.dtype == np.float32 else value
        buffer = leaf in ("running_mean", "running_var", "num_batches_tracked", "anchors")
        where = "_buffers" if buffer else "_parameters"
        node.state[where][leaf] = W.Tensor(arr, parameter=where == "_parameters")
    return root


def release(path: Path, state, nc: int = 80) -> Path:
    """A release .pt as strip_optimizer leaves it: the model in float16, no ema, no optimizer, epoch -1."""
    return W.save({"epoch": -1, "best_fitness": None, "model": module_tree(state, nc=nc), "ema": None,
                   "updates": None, "optimizer": None, "opt": {"weights": "yolov5n.pt"}, "git": {}, "date": "x"}, path)


@pytest.fixture(scope="module")
def state():
    return yolov5_state()


# ------------------------------------------------------------------ the file format, checked against torch itself
def test_the_writer_and_the_reader_agree_with_torch_save(tmp_path):
    torch = pytest.importorskip("torch", reason="checks ptwriter and torchpt against a real torch.save once")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).half()
    net[1].running_mean.uniform_()
    view = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()   # a strided view of a shared storage
    torch.save({"model": net, "epoch": -1, "view": view, "bf16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16)},
               tmp_path / "real.pt")
    got = torchpt.load(str(tmp_path / "real.pt"))
    own = torchpt.module_state(got["model"])
    ref = net.state_dict()
    assert set(own) == set(ref)
    for key, value in ref.items():
        np.testing.assert_array_equal(own[key].numpy(), value.numpy())
    np.testing.assert_array_equal(got["view"].numpy(), view.numpy())
    np.testing.assert_array_equal(got["bf16"].numpy(), [1.5, -2.25])
    assert got["model"].pt_class == "torch.nn.modules.container.Sequential"
    # the writer's file is one torch reads, in torch's layout
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    shared = W.Storage(a)
    W.save({"h": W.Tensor(a.astype(np.float16)), "t": W.Tensor(a.T, storage=shared, stride=(1, 4)),
            "a": W.Tensor(a, storage=shared), "n": W.Tensor(np.array(7, np.int64)),
            "conv": W.Module("torch.nn.modules.conv.Conv2d", parameters={"weight": W.Tensor(a, parameter=True)})},
           tmp_path / "ours.pt")
    back = torch.load(tmp_path / "ours.pt", weights_only=False)
    assert back["h"].dtype == torch.float16 and back["n"].item() == 7
    np.testing.assert_array_equal(back["t"].numpy(), a.T)
    assert back["t"].untyped_storage().data_ptr() == back["a"].untyped_storage().data_ptr()
    np.testing.assert_array_equal(back["conv"].weight.detach().numpy(), a)
    real, ours = zipfile.ZipFile(tmp_path / "real.pt"), zipfile.ZipFile(tmp_path / "ours.pt")
    strip = lambda z: {n.split("/", 1)[1] for n in z.namelist() if "/data/" not in n}   # noqa: E731
    assert strip(ours) <= strip(real)
    for path in (tmp_path / "real.pt", tmp_path / "ours.pt"):   # every storage's bytes start 64-byte aligned
        raw = path.read_bytes()
        for i in zipfile.ZipFile(path).infolist():
            if "/data/" in i.filename:
                name_len, extra_len = struct.unpack("<HH", raw[i.header_offset + 26: i.header_offset + 30])
                assert (i.header_offset + 30 + name_len + extra_len) % 64 == 0, i.filename


def test_torch_and_the_torch_free_reader_give_the_same_state(tmp_path, state):
    torch = pytest.importorskip("torch", reason="compares with what torch.load reads from the same file")
    path = release(tmp_path / "yolov5n.pt", state)
    ours = read_pt(str(path)).state
    theirs = _torch_state(torch_load_standins(torch, path)["model"])
    assert set(ours) == set(theirs)
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key].detach().float().numpy())


def torch_load_standins(torch, path):
    """``torch.load`` of a YOLOv5 file without YOLOv5's code: its module classes as inert stand-ins."""
    import pickle
    import types

    class Stub:
        def __init__(self, *args):
            pass

        def __setstate__(self, d):
            self.__dict__.update(d)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            keep = module.startswith(("torch", "collections", "builtins")) and not module.startswith("torch.nn")
            return super().find_class(module, name) if keep else Stub

    mod = types.ModuleType("stub_pickle")
    mod.Unpickler, mod.load = Unpickler, pickle.load
    return torch.load(path, weights_only=False, pickle_module=mod)


def _torch_state(module, prefix=""):
    out = {}
    for key in ("_parameters", "_buffers"):
        out.update({prefix + k: v for k, v in module.__dict__.get(key, {}).items()})
    for name, child in module.__dict__.get("_modules", {}).items():
        out.update(_torch_state(child, f"{prefix}{name}."))
    return out


# ------------------------------------------------------------------ reading and converting, no torch needed
def test_a_release_file_converts_once_and_is_cached_beside_it(tmp_path, state, monkeypatch, caplog):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)   # as on a machine without torch
    path = release(tmp_path / "yolov5n.pt", state)
    got = read_pt(str(path))
    assert (got.kind, got.cfg, got.num_classes, got.names[:2]) == ("release", "yolov5n", 80, ["c0", "c1"])
    np.testing.assert_array_equal(got.state["model.0.conv.weight"],
                                  state["model.0.conv.weight"].astype(np.float16).astype(np.float32))
    import paddle

    from ppmulti.rank.models.convert import pdparams_for

    out, read = pdparams_for(str(path))
    assert read is not None and Path(out).parent == tmp_path and Path(out).name.startswith(".yolov5n.pt.")
    params = paddle.load(out)
    np.testing.assert_array_equal(params["yolo_head.convs.1.weight"].numpy(),
                                  state["model.24.m.1.weight"].astype(np.float16).astype(np.float32))
    assert len(params) == len([k for k in state if map_name(k)])
    assert pdparams_for(str(path)) == (out, None)   # the second time: the cache, unread
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_train_checkpoint_gives_its_model_as_yolov5_train_does(tmp_path, state):
    other = {k: v + 1 if v.dtype == np.float32 else v for k, v in state.items()}
    opt = {"state": {0: {"momentum_buffer": W.Tensor(np.zeros(3, np.float32))}},
           "param_groups": [{"lr": 0.01, "momentum": 0.937, "nesterov": True, "params": [0]}]}
    W.save({"epoch": 3, "best_fitness": W.Tensor(np.array([0.5])), "model": module_tree(state),
            "ema": module_tree(other), "updates": 40, "optimizer": opt, "opt": {"weights": "x"},
            "git": {"commit": "abc"}, "date": "2026"}, tmp_path / "last.pt")
    got = read_pt(str(tmp_path / "last.pt"))
    assert got.kind == "train.py checkpoint"
    np.testing.assert_array_equal(got.state["model.2.cv1.bn.bias"],
                                  state["model.2.cv1.bn.bias"].astype(np.float16).astype(np.float32))
    ema = read_pt(str(tmp_path / "last.pt"), prefer="ema")
    np.testing.assert_array_equal(ema.state["model.2.cv1.bn.bias"],
                                  other["model.2.cv1.bn.bias"].astype(np.float16).astype(np.float32))


class Boom:
    def __reduce__(self):
        return (os.system, ("touch SHOULD_NOT_EXIST",))


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_text("<html>Not Found</html>"), "not a PyTorch zip checkpoint .an HTML page"),
    (lambda p: W.save({"model": Boom()}, p), "names posix.system.*refused unread"),
    (lambda p: W.save({"model": W.Module("models.yolo.SegmentationModel")}, p), "segmentation model"),
    (lambda p: W.save({"model": W.Module("models.common.Classify")}, p), "classification model"),
    (lambda p: W.save({"model": W.Module("models.yolo.DetectionModel", yaml={**YOLOV5N, "backbone": [[]] * 12},
                                         parameters={"w": W.Tensor(np.zeros(2, np.float32))})}, p), "P6"),
    (lambda p: W.save({"epoch": 1}, p), "holds no tensors"),
])
def test_what_cannot_be_read_is_refused_by_name(tmp_path, make, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "w.pt"
    make(path)
    with pytest.raises(UserError, match=message) as err:
        read_pt(str(path))
    assert str(path) in str(err.value) and not (tmp_path / "SHOULD_NOT_EXIST").exists()


def test_fine_tuning_to_other_classes_reinitialises_the_head_in_one_line(tmp_path, state, caplog):
    import paddle

    import ppmulti.rank.models  # noqa: F401
    from ppdet.core.workspace import create

    from ppmulti.common.paths import CONFIGS
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine.pretrained import load_initial_weights

    cfg = config_mod.load(CONFIGS / "yolov5/yolov5_n_300e_coco.yml", {"num_classes": 3})
    paddle.seed(0)
    model = create(cfg.architecture)
    fresh = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    path = release(tmp_path / "yolov5n.pt", state)
    with caplog.at_level(logging.INFO, logger="ppmulti"):
        load_initial_weights(model, cfg, str(path))
    lines = [r.getMessage() for r in caplog.records if "re-initialised" in r.getMessage()]
    assert lines == ["3 layers re-initialised for 3 classes (the weights have 80): "
                     "yolo_head.convs.0, yolo_head.convs.1, yolo_head.convs.2"]
    now = model.state_dict()
    np.testing.assert_array_equal(now["yolo_head.convs.0.weight"].numpy(), fresh["yolo_head.convs.0.weight"])
    np.testing.assert_array_equal(now["backbone.stem.conv.weight"].numpy(),
                                  state["model.0.conv.weight"].astype(np.float16).astype(np.float32))


def test_yolov5_weights_into_another_architecture_are_refused(tmp_path, state):
    import ppmulti.rank.models  # noqa: F401
    from ppdet.core.workspace import create

    from ppmulti.common.paths import CONFIGS
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine.pretrained import load_initial_weights

    cfg = config_mod.load(CONFIGS / "ppyoloe/ppyoloe_crn_s_300e_coco.yml", {"num_classes": 3})
    with pytest.raises(UserError, match=r"yolov5n.pt: none of its 291 parameters .*--cfg yolov5s"):
        load_initial_weights(create(cfg.architecture), cfg, str(release(tmp_path / "yolov5n.pt", state)))


# ------------------------------------------------------------------ downloads from a loopback server
@contextmanager
def serve(files: dict[str, bytes], short: bool = False):
    """An HTTP server on 127.0.0.1 serving ``files`` by name; ``short`` announces the size and sends half."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            name = self.path.rsplit("/", 1)[-1]
            hits.append(self.path)
            if name not in files:
                self.send_error(404)
                return
            body = files[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if short else body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v7.0", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv(XDG_CACHE_HOME, str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_release_asset_downloads_once_from_the_mirror(env, monkeypatch, state):
    body = release(env / "src.pt", state).read_bytes()
    with serve({"yolov5n.pt": body}) as (url, hits):
        monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, url)
        got = download.yolov5_weights("yolov5n.pt")
        assert got == env / "cache" / "ppmulti" / "weights" / "yolov5n.pt" and got.read_bytes() == body
        assert hits == ["/v7.0/yolov5n.pt"]   # one download for both ranks
        assert Path(str(got) + ".sha256").read_text().split()[0] == download.sha256_of(got)
        assert download.yolov5_weights("yolov5n.pt") == got and len(hits) == 1   # cached, checked, not fetched
        got.write_bytes(body[:-1] + b"x")   # damaged in the cache: its recorded sha256 no longer matches
        assert download.yolov5_weights("yolov5n.pt").read_bytes() == body and len(hits) == 2
    assert download.yolov5_weights("yolov5s6.pt") is None   # not an asset ppmulti converts


def test_a_short_download_leaves_nothing(env, monkeypatch):
    with serve({"yolov5s.pt": os.urandom(300_000)}, short=True) as (url, _):
        monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, url)
        with pytest.raises(UserError, match=r"--weights yolov5s.pt: the download of .*yolov5s.pt (ended after "
                                            r"150000 of 300000 bytes|broke off).*nothing was kept"):
            download.yolov5_weights("yolov5s.pt")
    folder = env / "cache" / "ppmulti" / "weights"
    assert not folder.exists() or list(folder.iterdir()) == []


def test_offline_names_the_url_and_how_to_place_the_file(env, monkeypatch):
    with serve({}) as (url, _):
        dead = url   # the server is gone after this block: its port refuses connections
    monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, dead)
    with pytest.raises(UserError) as err:
        download.yolov5_weights("yolov5m.pt")
    text = str(err.value)
    assert f"{dead}/yolov5m.pt" in text and "offline?" in text and "\n" not in text
    assert str(env / "cache" / "ppmulti" / "weights" / "yolov5m.pt") in text and PPMULTI_WEIGHTS_MIRROR in text
    monkeypatch.delenv(PPMULTI_WEIGHTS_MIRROR)
    assert download.source_url(download.yolov5_url("yolov5m.pt")) == \
        "https://github.com/ultralytics/yolov5/releases/download/v7.0/yolov5m.pt"


def test_pretrain_weights_urls_go_to_paddledetections_cache(env, monkeypatch):
    body = os.urandom(200_000)
    with serve({"ppyoloe_crn_s_300e_coco.pdparams": body}) as (url, hits):
        monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, url)
        got = download.paddle_weights("https://paddledet.bj.bcebos.com/models/ppyoloe_crn_s_300e_coco.pdparams")
        assert got == env / "home" / ".cache" / "paddle" / "weights" / "ppyoloe_crn_s_300e_coco.pdparams"
        assert got.read_bytes() == body and hits == ["/v7.0/ppyoloe_crn_s_300e_coco.pdparams"]


def test_a_pretrain_weights_url_is_downloaded_and_loaded(env, monkeypatch):
    import paddle

    import ppmulti.rank.models  # noqa: F401
    from ppdet.core.workspace import create

    from ppmulti.common.paths import CONFIGS
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.engine.pretrained import load_initial_weights

    url = "https://paddledet.bj.bcebos.com/models/yolov5_n_300e_coco.pdparams"
    cfg = config_mod.load(CONFIGS / "yolov5/yolov5_n_300e_coco.yml", {"num_classes": 3, "pretrain_weights": url})
    paddle.seed(1)
    source = create(cfg.architecture)
    paddle.save(source.state_dict(), str(env / "w.pdparams"))
    paddle.seed(2)
    model = create(cfg.architecture)
    with serve({"yolov5_n_300e_coco.pdparams": (env / "w.pdparams").read_bytes()}) as (mirror, hits):
        monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, mirror)
        load_initial_weights(model, cfg, None)
    assert hits == ["/v7.0/yolov5_n_300e_coco.pdparams"]
    for key, value in source.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[key].numpy(), value.numpy())


def test_a_missing_file_on_the_server_is_one_line(env, monkeypatch):
    with serve({}) as (url, _):
        monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, url)
        with pytest.raises(UserError, match=r"--weights yolov5l.pt: .*/v7.0/yolov5l.pt answered HTTP 404 .*place it"):
            download.yolov5_weights("yolov5l.pt")


# ------------------------------------------------------------------ the --weights flag as YOLOv5 takes it
def _args(**kw):
    base = dict(weights=None, cfg=None, config=None, data="d.yaml", hyp=None, resume=None, evolve=None)
    return argparse.Namespace(**{**base, **kw})


def test_weights_pt_downloads_and_names_the_model(env, monkeypatch, state):
    from ppmulti.rank.engine.pretrained import resolve_weights_flag

    with serve({"yolov5n.pt": release(env / "src.pt", state).read_bytes()}) as (url, _):
        monkeypatch.setenv(PPMULTI_WEIGHTS_MIRROR, url)
        args = _args(weights="yolov5n.pt")
        resolve_weights_flag(args)
    assert args.weights == str(env / "cache" / "ppmulti" / "weights" / "yolov5n.pt") and args.cfg == "yolov5n"
    with pytest.raises(UserError, match="--weights nope.pt: file not found"):
        resolve_weights_flag(_args(weights="nope.pt"))


def test_a_checkpoints_own_anchors_come_with_it(env, capsys, state):
    from ppmulti.common.train_flags import build_parser
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.entry import resolve

    W.save({"epoch": 9, "model": module_tree({**state, "model.24.anchors": GRID * 1.5}), "ema": None,
            "optimizer": {"state": {}, "param_groups": []}}, env / "last.pt")
    opts = resolve(build_parser().parse_args(["--weights", "last.pt", "--epochs", "1"]))
    assert "its own anchors replace yolov5n's" in capsys.readouterr().err
    cfg = config_mod.load(opts.config, opts.overrides)
    assert cfg["YOLOv5Head"]["anchors"][0] == [[15.0, 19.5], [24.0, 45.0], [49.5, 34.5]]
    release(env / "rel.pt", state)   # YOLOv5's own anchors: nothing to say, nothing changed
    opts = resolve(build_parser().parse_args(["--weights", "rel.pt", "--epochs", "1"]))
    assert "anchors" not in capsys.readouterr().err and not any("anchors" in o for o in opts.overrides)


def test_no_weights_on_a_yolov5_command_line_is_said_in_one_line(env, capsys, state):
    from ppmulti.rank.engine.pretrained import resolve_weights_flag

    args = _args(cfg="yolov5n.yaml")
    resolve_weights_flag(args)
    assert args.weights is None
    assert capsys.readouterr().err.strip().splitlines() == [
        "no --weights: training from scratch (YOLOv5 would start from its pretrained yolov5n.pt); "
        "--weights yolov5n.pt downloads it once and starts from it, --weights '' says from scratch"]
    release(env / "yolov5n.pt", state)   # on this machine already: YOLOv5's default start
    args = _args(cfg="yolov5n")
    resolve_weights_flag(args)
    assert args.weights == "yolov5n.pt" and "starting from YOLOv5's pretrained yolov5n.pt" in capsys.readouterr().err
    for quiet in (_args(weights=""), _args(data=None), _args(resume="runs/train/exp")):
        resolve_weights_flag(quiet)
    assert capsys.readouterr().err == ""


def test_weights_pt_as_a_train_flag_reaches_the_trainer_options(env, state):
    from ppmulti.common.train_flags import build_parser
    from ppmulti.rank.entry import resolve

    release(env / "mine.pt", state)
    opts = resolve(build_parser().parse_args(["--weights", "mine.pt", "--epochs", "1"]))
    assert opts.weights == "mine.pt" and opts.config.endswith("yolov5_n_300e_coco.yml")



# ------------------------------------------------------------------ YOLOv5's own command line, end to end
@pytest.mark.slow
def test_yolov5_command_line_downloads_converts_and_fine_tunes_on_two_ranks(tmp_path, state):
    """`train.py --weights yolov5n.pt --data data.yaml` with the .pt on no disk: downloaded once (from a loopback
    mirror), converted once, read by both ranks, its head re-initialised for the data's 3 classes."""
    from conftest import REPO, clean_env

    from ppmulti.common.synthdata import generate

    generate(tmp_path / "data", fmt="yolo", n_train=4, n_val=4, size=64, seed=5)
    body = release(tmp_path / "src.pt", state).read_bytes()
    env = {**clean_env(), XDG_CACHE_HOME: str(tmp_path / "cache")}
    with serve({"yolov5n.pt": body}) as (url, hits):
        env[PPMULTI_WEIGHTS_MIRROR] = url
        import subprocess
        import sys

        proc = subprocess.run([sys.executable, str(REPO / "tools" / "train.py"), "--weights", "yolov5n.pt",
                               "--data", "data/data.yaml", "--imgsz", "64", "--batch", "4", "--epochs", "1",
                               "--device", "cpu", "--nproc", "2", "--workers", "0", "--noplots"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert hits == ["/v7.0/yolov5n.pt"]   # one download for both ranks
    cache = tmp_path / "cache" / "ppmulti" / "weights"
    assert (cache / "yolov5n.pt").read_bytes() == body
    assert len(list(cache.glob(".yolov5n.pt.*.pdparams"))) == 1
    logs = out + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("workerlog.*"))
    assert "3 layers re-initialised for 3 classes (the weights have 80): yolo_head.convs.0, yolo_head.convs.1, " \
           "yolo_head.convs.2" in logs
    cfg = (tmp_path / "runs" / "train" / "exp" / "config.yml").read_text()
    assert "width_mult: 0.25" in cfg   # the model the .pt holds (yolov5n), as YOLOv5 builds it from the checkpoint


# ------------------------------------------------------------------ --weights x.pt in val, detect and export
def _eval_args(**kw):
    base = dict(weights=None, cfg=None, config=None, data=None)
    return argparse.Namespace(**{**base, **kw})


def test_a_pt_gives_the_tools_its_model_classes_names_and_anchors(env, state):
    from ppmulti.rank.eval_setup import pt_model, resolve_model

    W.save({"epoch": 9, "model": module_tree(state, nc=80), "ema": module_tree({**state, "model.24.anchors": GRID * 2}),
            "optimizer": {"state": {}, "param_groups": []}}, env / "last.pt")
    model = resolve_model(_eval_args(weights="last.pt"))
    assert model.config.endswith("yolov5_n_300e_coco.yml") and model.weights == "last.pt" and model.from_pt
    assert (model.weights_classes, model.names[:2], model.overrides["num_classes"]) == (80, ["c0", "c1"], 80)
    assert model.overrides["YOLOv5Head"]["anchors"][0] == [[20.0, 26.0], [32.0, 60.0], [66.0, 46.0]]   # the ema's
    assert model.note == "model: yolov5n from last.pt (YOLOv5 train.py checkpoint, 80 classes, its own anchors)"
    from ppmulti.rank import config as config_mod
    from ppmulti.rank.eval_setup import detect_edit, val_edit

    cfg = config_mod.load(model.config)
    detect_edit(None, False, model)(cfg)   # detect and export: the checkpoint's class names
    import json

    names = json.loads(Path(cfg["TestDataset"]["anno_path"]).read_text())["categories"]
    assert [c["name"] for c in names][:3] == ["c0", "c1", "c2"] and len(names) == 80
    with pytest.raises(UserError, match=r"--weights last.pt: pass --data DATA.yaml"):   # val: the data to score on
        val_edit(argparse.Namespace(weights="last.pt", config=None, data=None), model)(config_mod.load(model.config))
    given = pt_model(_eval_args(weights="last.pt", cfg="yolov5s"), env / "last.pt")   # --cfg wins, as given
    assert given.config.endswith("yolov5_s_300e_coco.yml") and given.overrides == {}
    with pytest.raises(UserError, match=r"--weights mine.pt: file not found \(the release files downloaded by "
                                        r"name are yolov5n.pt"):
        resolve_model(_eval_args(weights="mine.pt"))
    W.save({"model": W.Module("models.yolo.DetectionModel", yaml={**YOLOV5N, "width_multiple": 0.3},
                              parameters={"w": W.Tensor(np.zeros(2, np.float32))})}, env / "odd.pt")
    with pytest.raises(UserError, match=r"--weights odd.pt: its model is not a YOLOv5 v6/v7 n/s/m/l/x.*--cfg"):
        resolve_model(_eval_args(weights="odd.pt"))
    W.save({"model": W.Module("models.yolo.SegmentationModel")}, env / "seg.pt")
    with pytest.raises(UserError, match=r"seg.pt.*segmentation model"):
        resolve_model(_eval_args(weights="seg.pt"))


def _detecting(state, nc: int = 3, cls: int = 1) -> dict:
    """``state`` with a Detect head that sees class ``cls`` with full confidence in every cell (weights 0, biases
    saturated), so that detect's output is known without a trained model; the layers before it are scaled so that
    their activations stay finite (BN: identity; convolutions: 1 / sqrt(fan-in))."""
    out = {}
    for key, value in state.items():
        leaf = key.rsplit(".", 1)[-1]
        if ".bn." in key and leaf != "num_batches_tracked":
            value = np.full_like(value, 1.0 if leaf in ("weight", "running_var") else 0.0)
        elif key.endswith("conv.weight"):
            value = value / np.sqrt(np.prod(value.shape[1:]))
        out[key] = value
    for i in range(3):
        weight = out[f"model.24.m.{i}.weight"]
        out[f"model.24.m.{i}.weight"] = np.zeros((3 * (5 + nc),) + weight.shape[1:], np.float32)
        bias = np.full((3, 5 + nc), -12.0, np.float32)
        bias[:, :4], bias[:, 4], bias[:, 5 + cls] = 0.0, 12.0, 12.0
        out[f"model.24.m.{i}.bias"] = bias.reshape(-1)
    return out


@pytest.mark.slow
def test_val_detect_and_export_take_a_release_pt_by_name(tmp_path, state):
    """`val.py --weights yolov5n.pt --data data.yaml` with no --cfg and the .pt on no disk: downloaded once from a
    loopback mirror, its ema converted once beside it; detect draws the .pt's class names, export writes them."""
    from conftest import REPO, clean_env, run_tool

    from ppmulti.common.synthdata import generate

    generate(tmp_path / "data", fmt="yolo", n_train=2, n_val=4, size=64, seed=5)
    body = release(tmp_path / "src.pt", _detecting(yolov5_state(nc=3)), nc=3).read_bytes()
    env = {**clean_env(), XDG_CACHE_HOME: str(tmp_path / "cache")}
    cache = tmp_path / "cache" / "ppmulti" / "weights"

    def tool(*argv):
        proc = run_tool([str(REPO / "tools" / argv[0]), "--weights", "yolov5n.pt", *argv[1:]], cwd=tmp_path,
                        env=env)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        return proc.stdout + proc.stderr

    with serve({"yolov5n.pt": body}) as (url, hits):
        env[PPMULTI_WEIGHTS_MIRROR] = url
        out = tool("val.py", "--data", "data/data.yaml", "--img", "64", "--workers", "0")
        assert "model: yolov5n from yolov5n.pt (YOLOv5 release, 3 classes)" in out
        assert '"images": 4' in out
        out = tool("detect.py", "--source", "data/images/val", "--imgsz", "64", "--max-det", "2", "--save-txt")
        assert "64x64 2 c1," in out   # the .pt's own name for class 1
        labels = (tmp_path / "runs" / "detect" / "exp" / "labels" / "000000.txt").read_text().split("\n")
        assert [line.split()[0] for line in labels if line] == ["1", "1"]
        tool("export.py", "--include", "paddle", "--imgsz", "64")
    assert hits == ["/v7.0/yolov5n.pt"]   # one download for all three tools
    assert (cache / "yolov5n.pt").read_bytes() == body and len(list(cache.glob(".yolov5n.pt.*.ema.v1.pdparams"))) == 1
    import yaml

    assert yaml.safe_load((cache / "yolov5n_paddle_model" / "infer_cfg.yml").read_text())["label_list"] == \
        ["c0", "c1", "c2"]
