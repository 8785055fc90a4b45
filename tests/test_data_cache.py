"""ppmulti.rank.data.cache: the validated scan cache, --cache ram (one /dev/shm copy per node) and --cache disk."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from ppmulti.common import shm
from ppmulti.common.envvars import PPMULTI_LAUNCH_DIR, XDG_CACHE_HOME
from ppmulti.common.errors import UserError
from ppmulti.rank.data import cache, images, yolo

cv2 = pytest.importorskip("cv2")


def _dataset(root: Path, n: int = 6) -> yolo.DataSpec:
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        h, w = 40 + 8 * i, 64
        cv2.imwrite(str(root / "images" / "train" / f"{i}.jpg"), rng.integers(0, 255, (h, w, 3), np.uint8))
        if i % 3:
            (root / "labels" / "train" / f"{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n")
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nnames: [a, b]\n")
    return yolo.load_data_yaml(root / "data.yaml")


@pytest.fixture()
def user_cache(tmp_path, monkeypatch):
    d = tmp_path / "usercache"
    monkeypatch.setenv(XDG_CACHE_HOME, str(d))
    return d / "ppmulti"


@pytest.fixture()
def opened(monkeypatch):
    """Counts the image headers the scan opens."""
    calls = []
    real = yolo.image_size

    def counting(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(yolo, "image_size", counting)
    return calls


def _bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_scan_cache_built_once_reused_and_invalidated(tmp_path, user_cache, opened):
    spec = _dataset(tmp_path / "d")
    first, report1 = yolo.scan(spec, "train")
    assert len(opened) == 6
    cache_file = tmp_path / "d" / "labels" / "train.ppmulti.cache"
    assert cache_file.is_file() and not (tmp_path / "d" / "labels" / "train.cache").exists()   # not YOLOv5's name
    assert not os.path.exists(shm.lock_path(str(cache_file)))      # the builder's lock file goes with the build
    second, report2 = yolo.scan(spec, "train")
    assert len(opened) == 6, "the second scan opened images"
    assert report1.line("train") == report2.line("train")
    for a, b in zip(first, second):
        assert a["im_file"] == b["im_file"] and (a["h"], a["w"]) == (b["h"], b["w"])
        np.testing.assert_array_equal(a["gt_bbox"], b["gt_bbox"])
        np.testing.assert_array_equal(a["gt_class"], b["gt_class"])
    # a changed label is read again, and its new boxes are what the scan returns
    label = tmp_path / "d" / "labels" / "train" / "1.txt"
    label.write_text("1 0.5 0.5 0.4 0.4\n")
    _bump(label)
    third, _ = yolo.scan(spec, "train")
    assert len(opened) == 12 and len(third[1]["gt_bbox"]) == 1 and int(third[1]["gt_class"][0, 0]) == 1
    # a changed image too
    image = tmp_path / "d" / "images" / "train" / "0.jpg"
    cv2.imwrite(str(image), np.zeros((20, 30, 3), np.uint8))
    _bump(image)
    fourth, _ = yolo.scan(spec, "train")
    assert len(opened) == 18 and (fourth[0]["h"], fourth[0]["w"]) == (20.0, 30.0)
    yolo.scan(spec, "train")
    assert len(opened) == 18


def test_scan_cache_read_only_folder_uses_the_user_cache_dir(tmp_path, user_cache, opened, monkeypatch):
    spec = _dataset(tmp_path / "d")
    labels_root = tmp_path / "d" / "labels"
    real = cache._writable_dir
    # root ignores file modes, so the read-only folder is what os.access says
    monkeypatch.setattr(cache, "_writable_dir", lambda d: real(d) and Path(d) != labels_root)
    yolo.scan(spec, "train")
    assert not (labels_root / "train.ppmulti.cache").exists()
    written = list((user_cache / "scan").glob("*.ppmulti.cache"))
    assert len(written) == 1
    yolo.scan(spec, "train")
    assert len(opened) == 6


def test_scan_in_one_thread_or_several_gives_the_same_arrays(tmp_path, monkeypatch):
    """The first scan runs in YOLOv5's thread count (cores - 1, at most 8; one here on 2 cores, where threads
    only add GIL contention): one thread and four give the same arrays, in the files' order."""
    spec = _dataset(tmp_path / "d", n=12)
    files = yolo.image_names(spec, "train")
    one, four = yolo.scan_files(files, spec.nc, threads=1), yolo.scan_files(files, spec.nc, threads=4)
    assert one.keys() == four.keys()
    for key in one:
        np.testing.assert_array_equal(one[key], four[key])
    for cores, want in ((1, 1), (2, 1), (4, 3), (32, 8)):
        monkeypatch.setattr(os, "cpu_count", lambda c=cores: c)
        assert yolo.scan_threads() == want


def test_corrupt_or_foreign_scan_cache_is_rebuilt(tmp_path, user_cache, opened):
    spec = _dataset(tmp_path / "d")
    yolo.scan(spec, "train")
    path = tmp_path / "d" / "labels" / "train.ppmulti.cache"
    path.write_bytes(path.read_bytes()[:100])             # truncated
    records, _ = yolo.scan(spec, "train")
    assert len(opened) == 12 and len(records) == 6
    np.save(open(path, "wb"), {"hash": "x"}, allow_pickle=True)   # a pickle (YOLOv5's format): never loaded
    yolo.scan(spec, "train")
    assert len(opened) == 18
    yolo.scan(spec, "train")
    assert len(opened) == 18


def _race(root: str, out: str, barrier) -> None:
    spec = yolo.load_data_yaml(Path(root) / "data.yaml")
    files = yolo.image_names(spec, "train")
    labels = [yolo.label_path(p) for p in files]

    def compute():
        with open(out, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        return yolo.scan_files(files, spec.nc)

    barrier.wait()
    cache.cached_scan(files, labels, "race", compute)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_processes_racing_build_the_scan_once(tmp_path, user_cache):
    _dataset(tmp_path / "d")
    out = tmp_path / "computed"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_race, args=(str(tmp_path / "d"), str(out), barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(out.read_text().split()) == 1


# ----------------------------------------------------------------------------- --cache ram / disk
def _images(tmp_path: Path, n: int = 5) -> list[str]:
    rng = np.random.default_rng(1)
    files = []
    for i in range(n):
        p = tmp_path / f"im{i}.png"
        cv2.imwrite(str(p), rng.integers(0, 255, (30 + 10 * i, 50, 3), np.uint8))
        files.append(str(p))
    return files


def _segments() -> list[str]:
    return [n for n in os.listdir(shm.shm_dir()) if n.startswith(shm.CACHE_PREFIX)]


@pytest.fixture()
def launch_dir(tmp_path, monkeypatch):
    d = tmp_path / "launch"
    d.mkdir()
    monkeypatch.setenv(PPMULTI_LAUNCH_DIR, str(d))
    cache._MAPPED.clear()
    return d


def test_ram_store_matches_decode_and_leaves_nothing_in_shm(tmp_path, launch_dir):
    files = _images(tmp_path)
    before = _segments()
    store = images.make_store(files, 32, True, cache="ram")
    assert isinstance(store, images.RamStore)
    assert store.nbytes == sum(h * w * 3 for h, w in store.hw)
    for i, f in enumerate(files):
        got, want = store.load(i), images.decode(f, 32, True)
        assert got.hw == want.hw and got.orig_hw == want.orig_hw
        np.testing.assert_array_equal(got.image, want.image)
        assert not got.image.flags.writeable      # the node's one copy cannot be changed by an augmentation
    assert _segments() == before                  # one local process: unlinked as soon as it mapped it
    assert shm.launch_leftovers(str(launch_dir)) == []


def test_ram_cache_that_does_not_fit_is_refused(tmp_path, launch_dir, monkeypatch):
    files = _images(tmp_path)
    monkeypatch.setattr(cache, "mem_available", lambda: 1000)
    with pytest.raises(UserError, match=r"--cache ram needs .* GiB .* only .* GiB .*--cache disk"):
        images.make_store(files, 32, True, cache="ram")
    assert shm.launch_leftovers(str(launch_dir)) == []


def _map_and_report(files, conn) -> None:
    store = images.RamStore(files, 32, True, local_size=2)
    name = shm.segment_path(images.store_key(files, 32, True))
    with open("/proc/self/maps") as f:
        inodes = {line.split()[4] for line in f if os.path.basename(name) in line}
    conn.send((inodes, int(store.load(1).image.sum())))
    conn.recv()   # hold the mapping until the parent has looked


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_local_ranks_map_one_file_which_goes_after_both_mapped(tmp_path, launch_dir):
    files = _images(tmp_path)
    ctx = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for _ in range(2):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_map_and_report, args=(files, child))
        p.start()
        pipes.append(parent)
        procs.append(p)
    got = [c.recv() for c in pipes]
    assert got[0][1] == got[1][1]
    assert len(got[0][0]) == 1 and got[0][0] == got[1][0], "the ranks map different files"
    assert shm.launch_leftovers(str(launch_dir)) == []     # unlinked while both still use it
    for c in pipes:
        c.send("done")
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]


def test_launcher_leftovers_are_the_launch_own_only(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    mine, other = shm.launch_tag("/tmp/a"), shm.launch_tag("/tmp/b")
    for name in (f"{shm.CACHE_PREFIX}{mine}-r0-abc", f"{shm.CACHE_PREFIX}{mine}-r0-abc.lock",
                 f"{shm.CACHE_PREFIX}{other}-r0-abc", "paddle_123_4"):
        (d / name).write_bytes(b"x")
    assert sorted(os.path.basename(p) for p in shm.launch_leftovers("/tmp/a", str(d))) == [
        f"{shm.CACHE_PREFIX}{mine}-r0-abc", f"{shm.CACHE_PREFIX}{mine}-r0-abc.lock"]


def test_a_dead_lone_process_cache_is_removed_by_the_next(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    child.start()
    child.join()
    dead, alive = f"{shm.CACHE_PREFIX}p{child.pid}-abc.building", f"{shm.CACHE_PREFIX}p{os.getppid()}-abc"
    for name in (dead, alive, f"{shm.CACHE_PREFIX}{shm.launch_tag('/x')}-r0-abc"):
        (d / name).write_bytes(b"x")
    assert shm.dead_lone_leftovers(str(d)) == [str(d / dead)]


def test_disk_store_writes_once_and_follows_a_changed_image(tmp_path, user_cache, monkeypatch):
    files = _images(tmp_path)
    store = images.make_store(files, 32, True, cache="disk")
    assert isinstance(store, images.DiskStore) and store.written == len(files)
    npys = sorted(tmp_path.glob("*.ppmulti.npy"))
    assert len(npys) == len(files) and not list(tmp_path.glob("im0.npy"))   # YOLOv5's own name stays free
    decodes = []
    real = images.decode
    monkeypatch.setattr(images, "decode", lambda *a: decodes.append(a) or real(*a))
    again = images.make_store(files, 32, True, cache="disk")
    assert again.written == 0
    for i, f in enumerate(files):
        np.testing.assert_array_equal(again.load(i).image, real(f, 32, True).image)
    assert decodes == []
    cv2.imwrite(files[2], np.full((64, 16, 3), 7, np.uint8))
    _bump(Path(files[2]))
    third = images.make_store(files, 32, True, cache="disk")
    assert third.written == 1 and third.load(2).image.shape == (32, 8, 3) and int(third.load(2).image[0, 0, 0]) == 7
    assert len(sorted(tmp_path.glob("im2.png.*.ppmulti.npy"))) == 1         # the stale one is gone


def test_disk_store_read_only_folder_keeps_its_npys_in_the_user_cache(tmp_path, user_cache, monkeypatch):
    files = _images(tmp_path, 2)
    real = cache._writable_dir
    monkeypatch.setattr(cache, "_writable_dir", lambda d: real(d) and Path(d) != tmp_path)
    store = images.make_store(files, 32, True, cache="disk")
    assert not list(tmp_path.glob("*.npy")) and len(list((user_cache / "images").rglob("*.npy"))) == 2
    np.testing.assert_array_equal(store.load(1).image, images.decode(files[1], 32, True).image)


def test_cache_values_and_config_hook():
    assert [cache.parse_cache(v) for v in (None, False, True, "", "ram", "RAM", "disk")] == [
        None, None, "ram", "ram", "ram", "ram", "disk"]
    with pytest.raises(UserError, match="expected ram or disk"):
        cache.parse_cache("gpu")
    cfg = {"TrainDataset": {"name": "YOLODataSet", "data": "x.yaml"}}
    cache.apply_cache(cfg, "ram")
    assert cfg["TrainDataset"]["cache"] == "ram"
    with pytest.raises(UserError, match="works with YOLOv5 data yamls"):
        cache.apply_cache({"TrainDataset": {"name": "COCODataSet"}}, "disk")


# ----------------------------------------------------------------------------- 2 ranks under ppmulti launch
def _cache_files() -> set[str]:
    return set(_segments())


def _ranks(launches, tmp_path: Path, small_demo: Path, mode: str, size: int, *extra: str) -> tuple[int, Path]:
    from launching import FIXTURES

    out = tmp_path / f"out-{mode}-{'-'.join(extra) or 'ok'}"
    out.mkdir()
    proc = launches.start("--nproc_per_node", "2", "--log_dir", str(out / "log"), str(FIXTURES / "cache_ranks.py"),
                          str(small_demo / "data.yaml"), str(out), mode, str(size), *extra)
    return launches.wait(proc, 300), out


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_hold_one_copy_and_leave_nothing_in_shm(launches, tmp_path, small_demo):
    """Summed PSS (RSS counts a shared page in every process; PSS splits it between them) of 2 ranks with
    --cache ram stays within 1.2 copies of the cache above what the same ranks hold without one."""
    import json

    before = _cache_files()
    size = 1024     # 48 demo images of 128 px, enlarged: 151 MB decoded, far above the ranks' own noise
    rc, plain = _ranks(launches, tmp_path, small_demo, "none", size)
    assert rc == 0, (plain / "log").glob("*")
    rc, ram = _ranks(launches, tmp_path, small_demo, "ram", size)
    assert rc == 0
    p = [json.loads((plain / f"rank{r}.json").read_text()) for r in range(2)]
    r = [json.loads((ram / f"rank{r}.json").read_text()) for r in range(2)]
    copy = r[0]["nbytes"]
    assert copy > 100e6 and r[1]["nbytes"] == copy
    assert r[0]["checksum"] == r[1]["checksum"] == p[0]["checksum"]       # the same pixels as decoding
    assert len(r[0]["inodes"]) == 1 and r[0]["inodes"] == r[1]["inodes"]    # both ranks map one file
    assert not r[0]["segment_left"] and not r[1]["segment_left"]            # unlinked while still in use
    extra = sum(x["pss"] for x in r) - sum(x["pss"] for x in p)
    assert extra <= 1.2 * copy, f"2 ranks hold {extra / copy:.2f} copies"
    assert sum(x["rss"] for x in r) - sum(x["rss"] for x in p) > 1.5 * copy  # what RSS would have claimed
    assert _cache_files() == before


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_rank_killed_before_mapping_leaves_no_cache_in_shm(launches, tmp_path, small_demo):
    import json

    before = _cache_files()
    rc, out = _ranks(launches, tmp_path, small_demo, "ram", 256, "die")
    assert rc != 0
    seen = json.loads((out / "segment").read_text())
    assert seen["exists"], "the cache should still be linked while rank 1 has not mapped it"
    assert not os.path.exists(seen["path"]) and _cache_files() == before


# ----------------------------------------------------------------------------- COCO json
def test_coco_json_parse_is_cached_and_follows_the_json(tmp_path, user_cache, small_demo, monkeypatch):
    import shutil

    from ppmulti.rank import compat

    compat.import_ppdet()
    from ppdet.data.source.coco import COCODataSet

    from ppmulti.rank.data import coco

    root = tmp_path / "demo"
    shutil.copytree(small_demo, root)
    cls = coco.register_source()
    kwargs = dict(dataset_dir=str(root), image_dir="images/train", anno_path="annotations/instances_train.json",
                  data_fields=["image", "gt_bbox", "gt_class", "is_crowd"], allow_empty=True)
    parses = []
    real = COCODataSet.parse_dataset
    monkeypatch.setattr(COCODataSet, "parse_dataset", lambda self: parses.append(1) or real(self))

    def roidbs(klass):
        ds = klass(**kwargs)
        ds.parse_dataset()
        return ds

    want = roidbs(COCODataSet)
    first, second = roidbs(cls), roidbs(cls)
    assert len(parses) == 2          # ppdet's own, then the cached class's first start; the second reads the cache
    assert (root / "annotations" / "instances_train.json.ppmulti.cache").is_file()
    for got in (first, second):
        assert got.catid2clsid == want.catid2clsid and got.cname2cid == want.cname2cid
        assert len(got.roidbs) == len(want.roidbs)
        for a, b in zip(got.roidbs, want.roidbs):
            assert set(a) == set(b) and a["im_file"] == b["im_file"] and (a["h"], a["w"]) == (b["h"], b["w"])
            for k in ("im_id", "gt_bbox", "gt_class", "is_crowd"):
                np.testing.assert_array_equal(a[k], b[k])
    anno = root / "annotations" / "instances_train.json"
    anno.write_text(anno.read_text().replace('"iscrowd": 0', '"iscrowd": 0 '))
    _bump(anno)
    roidbs(cls)
    assert len(parses) == 3
    cfg = {"TrainDataset": {"name": "COCODataSet"}, "EvalDataset": {"name": "YOLODataSet"}}
    coco.swap_in(cfg)
    assert cfg == {"TrainDataset": {"name": coco.NAME}, "EvalDataset": {"name": "YOLODataSet"}}


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_loopback_nodes_each_build_their_own_copy(launches, tmp_path, small_demo):
    """Two ``ppmulti launch`` nodes on one machine: each node's ranks share a cache named by its own launch, so
    each node builds one (as on two real machines), and neither leaves anything in /dev/shm."""
    import json

    from launching import FIXTURES, free_ports

    before = _cache_files()
    port = free_ports(2)
    out = tmp_path / "out"
    out.mkdir()
    common = ["--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
              "--rdzv-timeout", "60"]
    script = [str(FIXTURES / "cache_ranks.py"), str(small_demo / "data.yaml"), str(out), "ram", "256"]
    nodes = [launches.start(*common, "--node_rank", str(r), "--log_dir", str(tmp_path / f"l{r}"), *script)
             for r in (1, 0)]
    for node in nodes:
        assert launches.wait(node, 200) == 0, launches.output(node)[-3000:]
    r = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    assert r[0]["checksum"] == r[1]["checksum"] and r[0]["nbytes"] == r[1]["nbytes"] > 0
    assert len(r[0]["inodes"]) == len(r[1]["inodes"]) == 1 and r[0]["inodes"] != r[1]["inodes"]
    assert _cache_files() == before


def test_exif_rotated_jpeg_scans_and_caches_as_opencv_decodes_it(tmp_path, launch_dir):
    from PIL import Image

    path = tmp_path / "sideways.jpg"
    exif = Image.Exif()
    exif[yolo.EXIF_ORIENTATION] = 6               # stored 60 wide x 40 high, shown 40 wide x 60 high
    Image.new("RGB", (60, 40), (10, 200, 30)).save(path, exif=exif)
    assert cv2.imread(str(path)).shape[:2] == (60, 40)
    assert yolo.image_size(path) == (40, 60)
    assert images.image_shapes([str(path)]) == [(60, 40)]
    store = images.make_store([str(path)], 32, True, cache="ram")
    np.testing.assert_array_equal(store.load(0).image, images.decode(str(path), 32, True).image)


def test_the_store_is_built_at_the_size_the_pipeline_loads():
    cfg = {"TrainReader": {"sample_transforms": [{"YOLOv5Mosaic": {"img_size": 320}}, {"YOLOv5HSV": {}}]},
           "YOLOv5Loss": {"img_size": 640}, "eval_height": 640}
    assert cache.train_size(cfg) == 320
    assert cache.train_size({"YOLOv5Loss": {"img_size": 416}, "eval_height": 640}) == 416
    assert cache.train_size({"eval_height": 256}) == 256
