"""PaddleDetection's config zoo as a user brings it: configs in its form (a ``_BASE_`` tree of datasets/, runtime.yml,
_base_/optimizer, model and reader files), run from their directory with the data in ``dataset/coco``. Detection
families train one epoch on 2 ranks and evaluate; keypoint, MOT, rotated-box and segmentation configs are refused
at start, by name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_tool
from launching import launch_env

from ppmulti.common.errors import UserError
from ppmulti.rank import config as config_mod
from ppmulti.rank import zoo

# ----------------------------------------------------------------------------- a PaddleDetection checkout in small

RUNTIME = """\
use_gpu: true
use_xpu: false
use_mlu: false
use_npu: false
log_iter: 20
save_dir: output
snapshot_epoch: 1
print_flops: false
print_params: false

# Exporting the model
export:
  post_process: True  # Whether post-processing is included in the network when export model.
  nms: True           # Whether NMS is included in the network when export model.
  benchmark: False    # if `True`, post-process and NMS will not be exported.
  fuse_conv_bn: False
"""

COCO_DETECTION = """\
metric: COCO
num_classes: 80

TrainDataset:
  name: COCODataSet
  image_dir: train2017
  anno_path: annotations/instances_train2017.json
  dataset_dir: dataset/coco
  data_fields: ['image', 'gt_bbox', 'gt_class', 'is_crowd']

EvalDataset:
  name: COCODataSet
  image_dir: val2017
  anno_path: annotations/instances_val2017.json
  dataset_dir: dataset/coco
  allow_empty: true

TestDataset:
  name: ImageFolder
  anno_path: annotations/instances_val2017.json # also support txt (like VOC's label_list.txt)
  dataset_dir: dataset/coco # if set, anno_path will be 'dataset_dir/anno_path'
"""

OPTIMIZER_1X = """\
epoch: 12

LearningRate:
  base_lr: 0.01
  schedulers:
  - !PiecewiseDecay
    gamma: 0.1
    milestones: [8, 11]
  - !LinearWarmup
    start_factor: 0.1
    steps: 1000

OptimizerBuilder:
  optimizer:
    momentum: 0.9
    type: Momentum
  regularizer:
    factor: 0.0001
    type: L2
"""

# The R-CNN reader as PaddleDetection's faster_fpn_reader.yml has it, at 64-96 px instead of 800-1333.
RCNN_READER = """\
worker_num: 0
TrainReader:
  sample_transforms:
  - Decode: {}
  - RandomResize: {target_size: [[64, 96], [80, 96]], interp: 2, keep_ratio: True}
  - RandomFlip: {prob: 0.5}
  - NormalizeImage: {is_scale: true, mean: [0.485,0.456,0.406], std: [0.229, 0.224,0.225]}
  - Permute: {}
  batch_transforms:
  - PadBatch: {pad_to_stride: 32}
  batch_size: 2
  shuffle: true
  drop_last: true
  collate_batch: false

EvalReader:
  sample_transforms:
  - Decode: {}
  - Resize: {interp: 2, target_size: [64, 96], keep_ratio: True}
  - NormalizeImage: {is_scale: true, mean: [0.485,0.456,0.406], std: [0.229, 0.224,0.225]}
  - Permute: {}
  batch_transforms:
  - PadBatch: {pad_to_stride: 32}
  batch_size: 1
  shuffle: false
  drop_last: false

TestReader:
  sample_transforms:
  - Decode: {}
  - Resize: {interp: 2, target_size: [64, 96], keep_ratio: True}
  - NormalizeImage: {is_scale: true, mean: [0.485,0.456,0.406], std: [0.229, 0.224,0.225]}
  - Permute: {}
  batch_transforms:
  - PadBatch: {pad_to_stride: 32}
  batch_size: 1
  shuffle: false
  drop_last: false
"""

# PaddleDetection's faster_rcnn_r50_fpn.yml with ResNet-18 and narrow FPN/heads.
FASTER_RCNN_MODEL = """\
architecture: FasterRCNN
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_cos_pretrained.pdparams

FasterRCNN:
  backbone: ResNet
  neck: FPN
  rpn_head: RPNHead
  bbox_head: BBoxHead
  # post process
  bbox_post_process: BBoxPostProcess


ResNet:
  # index 0 stands for res2
  depth: 18
  norm_type: bn
  freeze_at: 0
  return_idx: [0,1,2,3]
  num_stages: 4

FPN:
  out_channel: 32

RPNHead:
  anchor_generator:
    aspect_ratios: [0.5, 1.0, 2.0]
    anchor_sizes: [[16], [32], [64], [128], [256]]
    strides: [4, 8, 16, 32, 64]
  rpn_target_assign:
    batch_size_per_im: 64
    fg_fraction: 0.5
    negative_overlap: 0.3
    positive_overlap: 0.7
    use_random: True
  train_proposal:
    min_size: 0.0
    nms_thresh: 0.7
    pre_nms_top_n: 200
    post_nms_top_n: 100
    topk_after_collect: True
  test_proposal:
    min_size: 0.0
    nms_thresh: 0.7
    pre_nms_top_n: 100
    post_nms_top_n: 50


BBoxHead:
  head: TwoFCHead
  roi_extractor:
    resolution: 7
    sampling_ratio: 0
    aligned: True
  bbox_assigner: BBoxAssigner

BBoxAssigner:
  batch_size_per_im: 64
  bg_thresh: 0.5
  fg_thresh: 0.5
  fg_fraction: 0.25
  use_random: True

TwoFCHead:
  out_channel: 64


BBoxPostProcess:
  decode: RCNNBox
  nms:
    name: MultiClassNMS
    keep_top_k: 100
    score_threshold: 0.05
    nms_threshold: 0.5
"""

# PaddleDetection's fcos_r50_fpn_1x_coco.yml (its _base_/fcos_r50_fpn.yml and fcos_reader.yml folded in), with
# ResNet-18, one conv in the head's towers (FCOSHead's own convs take 256 channels), and 64-96 px images padded to
# its largest stride, 128.
FCOS = """\
_BASE_: [
  '../datasets/coco_detection.yml',
  '../runtime.yml',
  '_base_/optimizer_1x.yml',
]

weights: output/fcos_r18_fpn_1x_coco/model_final
architecture: FCOS
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_cos_pretrained.pdparams

FCOS:
  backbone: ResNet
  neck: FPN
  fcos_head: FCOSHead

ResNet:
  depth: 18
  variant: 'b'
  norm_type: bn
  freeze_at: 0 # res2
  return_idx: [1, 2, 3]
  num_stages: 4

FPN:
  out_channel: 256
  spatial_scales: [0.125, 0.0625, 0.03125]
  extra_stage: 2
  has_extra_convs: True
  use_c5: False

FCOSHead:
  fcos_feat:
    name: FCOSFeat
    feat_in: 256
    feat_out: 256
    num_convs: 1
    norm_type: "gn"
    use_dcn: False
  fpn_stride: [8, 16, 32, 64, 128]
  prior_prob: 0.01
  norm_reg_targets: True
  centerness_on_reg: True
  num_shift: 0.5
  fcos_loss:
    name: FCOSLoss
    loss_alpha: 0.25
    loss_gamma: 2.0
    iou_loss_type: "giou"
    reg_weights: 1.0
  nms:
    name: MultiClassNMS
    nms_top_k: 1000
    keep_top_k: 100
    score_threshold: 0.025
    nms_threshold: 0.6

worker_num: 0
TrainReader:
  sample_transforms:
  - Decode: {}
  - Resize: {target_size: [64, 96], keep_ratio: True, interp: 1}
  - NormalizeImage: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], is_scale: True}
  - RandomFlip: {}
  batch_transforms:
  - Permute: {}
  - PadBatch: {pad_to_stride: 128}
  - Gt2FCOSTarget:
      object_sizes_boundary: [64, 128, 256, 512]
      center_sampling_radius: 1.5
      downsample_ratios: [8, 16, 32, 64, 128]
      norm_reg_targets: True
  batch_size: 2
  shuffle: True
  drop_last: True

EvalReader:
  sample_transforms:
  - Decode: {}
  - Resize: {target_size: [64, 96], keep_ratio: True, interp: 1}
  - NormalizeImage: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], is_scale: True}
  - Permute: {}
  batch_transforms:
  - PadBatch: {pad_to_stride: 128}
  batch_size: 1

TestReader:
  sample_transforms:
  - Decode: {}
  - Resize: {target_size: [64, 96], keep_ratio: True, interp: 1}
  - NormalizeImage: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], is_scale: True}
  - Permute: {}
  batch_transforms:
  - PadBatch: {pad_to_stride: 128}
  batch_size: 1
  fuse_normalize: True
"""


# PaddleDetection's cascade_rcnn_r50_fpn.yml in the same small form: the R-CNN above with three cascade stages
CASCADE_RCNN_MODEL = FASTER_RCNN_MODEL
for _old, _new in (("architecture: FasterRCNN", "architecture: CascadeRCNN"), ("FasterRCNN:\n", "CascadeRCNN:\n"),
                   ("  bbox_head: BBoxHead\n", "  bbox_head: CascadeHead\n"),
                   ("BBoxHead:\n  head: TwoFCHead", "CascadeHead:\n  head: CascadeTwoFCHead"),
                   ("  use_random: True\n\nTwoFCHead:",
                    "  cascade_iou: [0.5, 0.6, 0.7]\n  use_random: True\n\nCascadeTwoFCHead:"),
                   ("  decode: RCNNBox\n",
                    "  decode:\n    name: RCNNBox\n    prior_box_var: [30.0, 30.0, 15.0, 15.0]\n")):
    assert _old in CASCADE_RCNN_MODEL, _old
    CASCADE_RCNN_MODEL = CASCADE_RCNN_MODEL.replace(_old, _new)


def _cascade_rcnn(name: str) -> dict[str, str]:
    return {f"configs/cascade_rcnn/{name}.yml": (
        "_BASE_: [\n  '../datasets/coco_detection.yml',\n  '../runtime.yml',\n  '_base_/optimizer_1x.yml',\n"
        "  '_base_/cascade_rcnn_r18_fpn.yml',\n  '_base_/cascade_fpn_reader.yml',\n]\n"
        f"weights: output/{name}/model_final\n"),
        "configs/cascade_rcnn/_base_/optimizer_1x.yml": OPTIMIZER_1X,
        "configs/cascade_rcnn/_base_/cascade_rcnn_r18_fpn.yml": CASCADE_RCNN_MODEL,
        "configs/cascade_rcnn/_base_/cascade_fpn_reader.yml": RCNN_READER}


def _faster_rcnn(name: str) -> dict[str, str]:
    return {f"configs/faster_rcnn/{name}.yml": (
        "_BASE_: [\n  '../datasets/coco_detection.yml',\n  '../runtime.yml',\n  '_base_/optimizer_1x.yml',\n"
        "  '_base_/faster_rcnn_r18_fpn.yml',\n  '_base_/faster_fpn_reader.yml',\n]\n"
        f"weights: output/{name}/model_final\n"),
        "configs/faster_rcnn/_base_/optimizer_1x.yml": OPTIMIZER_1X,
        "configs/faster_rcnn/_base_/faster_rcnn_r18_fpn.yml": FASTER_RCNN_MODEL,
        "configs/faster_rcnn/_base_/faster_fpn_reader.yml": RCNN_READER}


FAMILIES = {
    "faster_rcnn": ("configs/faster_rcnn/faster_rcnn_r18_fpn_1x_coco.yml", _faster_rcnn("faster_rcnn_r18_fpn_1x_coco")),
    "cascade_rcnn": ("configs/cascade_rcnn/cascade_rcnn_r18_fpn_1x_coco.yml",
                     _cascade_rcnn("cascade_rcnn_r18_fpn_1x_coco")),
    "fcos": ("configs/fcos/fcos_r18_fpn_1x_coco.yml", {"configs/fcos/fcos_r18_fpn_1x_coco.yml": FCOS,
                                                       "configs/fcos/_base_/optimizer_1x.yml": OPTIMIZER_1X}),
}


def write_checkout(root: Path, files: dict[str, str]) -> Path:
    """PaddleDetection's shared files (datasets/coco_detection.yml, runtime.yml) and ``files`` under ``root``."""
    for rel, text in {"configs/runtime.yml": RUNTIME, "configs/datasets/coco_detection.yml": COCO_DETECTION,
                      **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def write_coco(root: Path, train: int = 8, val: int = 4, size: int = 80) -> None:
    """``dataset/coco`` as PaddleDetection lays it out (train2017, val2017, annotations/instances_*2017.json), made
    by ppmulti's demo-set writer: three shape classes."""
    demo = root / "demo"
    proc = run_tool(["-m", "ppmulti.cli", "data", "demo", str(demo), "--format", "coco", "--train", str(train),
                     "--val", str(val), "--size", str(size)], cwd=root)
    assert proc.returncode == 0, proc.stderr
    coco = root / "dataset" / "coco"
    (coco / "annotations").mkdir(parents=True)
    for split in ("train", "val"):
        (demo / "images" / split).rename(coco / f"{split}2017")
        (demo / "annotations" / f"instances_{split}.json").rename(coco / "annotations" / f"instances_{split}2017.json")


# ----------------------------------------------------------------------------- refused families, by name

KEYPOINT = """\
_BASE_: ['../../runtime.yml']
weights: output/hrnet_w32_256x192/model_final
epoch: 210
num_joints: &num_joints 17
pixel_std: &pixel_std 200
metric: KeyPointTopDownCOCOEval
num_classes: 1
train_height: &train_height 256
train_width: &train_width 192
trainsize: &trainsize [*train_width, *train_height]
hmsize: &hmsize [48, 64]
flip_perm: &flip_perm [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14], [15, 16]]

architecture: TopDownHRNet

TopDownHRNet:
  backbone: HRNet
  post_process: HRNetPostProcess
  flip_perm: *flip_perm
  num_joints: *num_joints
  width: &width 32
  loss: KeyPointMSELoss

HRNet:
  width: *width
  freeze_at: -1
  freeze_norm: false
  return_idx: [0]

KeyPointMSELoss:
  use_target_weight: true

TrainDataset:
  !KeypointTopDownCocoDataset
    image_dir: train2017
    anno_path: annotations/person_keypoints_train2017.json
    dataset_dir: dataset/coco
    num_joints: *num_joints
    trainsize: *trainsize
    pixel_std: *pixel_std
    use_gt_bbox: True
"""

FAIRMOT = """\
_BASE_: ['../../runtime.yml']
metric: MOT
num_classes: 1
weights: output/fairmot_dla34_30e_1088x608/model_final

architecture: FairMOT
FairMOT:
  detector: CenterNet
  reid: FairMOTEmbeddingHead
  loss: FairMOTLoss
  tracker: JDETracker

TrainDataset:
  !MOTDataSet
    dataset_dir: dataset/mot
    image_lists: ['mot17.train']
    data_fields: ['image', 'gt_bbox', 'gt_class', 'gt_ide']
"""

PPYOLOE_R = """\
_BASE_: ['../../datasets/coco_detection.yml', '../../runtime.yml']
metric: RBOX
num_classes: 15
architecture: YOLOv3
YOLOv3:
  backbone: CSPResNet
  neck: CustomCSPPAN
  yolo_head: PPYOLOERHead
  post_process: ~
"""

S2ANET = """\
_BASE_: ['../datasets/coco_detection.yml', '../runtime.yml']
metric: RBOX
architecture: S2ANet
S2ANet:
  backbone: ResNet
  neck: FPN
  head: S2ANetHead
"""

MASK_RCNN = """\
_BASE_: ['../datasets/coco_instance.yml', '../runtime.yml']
architecture: MaskRCNN
MaskRCNN:
  backbone: ResNet
  neck: FPN
  rpn_head: RPNHead
  bbox_head: BBoxHead
  mask_head: MaskHead
  bbox_post_process: BBoxPostProcess
  mask_post_process: MaskPostProcess
"""

CASCADE_MASK_RCNN = """\
_BASE_: ['../datasets/coco_instance.yml', '../runtime.yml']
architecture: CascadeRCNN
CascadeRCNN:
  backbone: ResNet
  neck: FPN
  rpn_head: RPNHead
  bbox_head: CascadeHead
  mask_head: MaskHead
  bbox_post_process: BBoxPostProcess
  mask_post_process: MaskPostProcess
"""

COCO_INSTANCE = COCO_DETECTION.replace("['image', 'gt_bbox', 'gt_class', 'is_crowd']",
                                       "['image', 'gt_bbox', 'gt_class', 'gt_poly', 'is_crowd']")

# release/2.6's HigherHRNet: its dataset takes a keyword ppdet 2.6.0's does not know, so ppdet's loader fails on it
HIGHERHRNET = """\
_BASE_: ['../../runtime.yml']
metric: COCO
num_classes: 1
architecture: HigherHRNet
HigherHRNet:
  backbone: HRNet
  hrhrnet_head: HrHRNetHead
  post_process: HrHRNetPostProcess
TrainDataset:
  !KeypointBottomUpCocoDataset
    image_dir: train2017
    anno_path: annotations/person_keypoints_train2017.json
    dataset_dir: dataset/coco
    num_joints: 17
    return_bbox: False
"""

REFUSED = {
    "configs/keypoint/higherhrnet/higherhrnet_hrnet_w32_512.yml": (HIGHERHRNET, "keypoint", "architecture HigherHRNet"),
    "configs/keypoint/hrnet/hrnet_w32_256x192.yml": (KEYPOINT, "keypoint", "architecture TopDownHRNet"),
    "configs/mot/fairmot/fairmot_dla34_30e_1088x608.yml": (FAIRMOT, "MOT", "architecture FairMOT"),
    "configs/rotate/ppyoloe_r/ppyoloe_r_crn_s_3x_dota.yml": (PPYOLOE_R, "rotated-box", "metric RBOX"),
    "configs/dota/s2anet_1x_spine.yml": (S2ANET, "rotated-box", "architecture S2ANet"),
    "configs/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yml": (MASK_RCNN, "segmentation", "architecture MaskRCNN"),
    "configs/cascade_rcnn/cascade_mask_rcnn_r50_fpn_1x_coco.yml": (CASCADE_MASK_RCNN, "segmentation",
                                                                   "CascadeRCNN.mask_head MaskHead"),
}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    files = {rel: text for rel, (text, _, _) in REFUSED.items()}
    files["configs/datasets/coco_instance.yml"] = COCO_INSTANCE
    for _, family_files in FAMILIES.values():
        files.update(family_files)
    return write_checkout(tmp_path_factory.mktemp("PaddleDetection"), files)


@pytest.mark.parametrize("rel", list(REFUSED), ids=[Path(r).stem for r in REFUSED])
def test_other_families_are_refused_by_name(checkout, rel, monkeypatch):
    _, family, why = REFUSED[rel]
    monkeypatch.chdir(checkout)
    with pytest.raises(UserError) as err:
        config_mod.load(rel, ["use_gpu=false"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{rel} is a {family} config ({why}): ppmulti trains detection configs only")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_detection_families_are_not_refused(checkout, family, monkeypatch):
    monkeypatch.chdir(checkout)
    cfg = config_mod.load(FAMILIES[family][0], ["use_gpu=false"])
    assert zoo.kind(cfg) is None
    assert cfg["architecture"] in ("FasterRCNN", "CascadeRCNN", "FCOS")


def test_mask_head_left_empty_is_a_detector():
    assert zoo.kind({"architecture": "CascadeRCNN", "CascadeRCNN": {"bbox_head": "CascadeHead", "mask_head": None}}) \
        is None
    assert zoo.kind({"architecture": "YOLOv3", "metric": "COCO"}) is None
    assert zoo.kind({"architecture": "YOLOv3", "metric": "MCMOT"}) == ("MOT", "metric MCMOT")


def test_the_family_is_read_through_base_files(tmp_path):
    """A child config inherits its family from a _BASE_ file; a later file wins, as in ppdet's loader."""
    (tmp_path / "base.yml").write_text("architecture: FasterRCNN\nmetric: COCO\nFasterRCNN: {backbone: ResNet}\n")
    (tmp_path / "mask.yml").write_text("_BASE_: ['base.yml']\narchitecture: MaskRCNN\n")
    (tmp_path / "det.yml").write_text("_BASE_: ['base.yml']\nepoch: 1\n")
    with pytest.raises(UserError, match="is a segmentation config \\(architecture MaskRCNN\\)"):
        zoo.refuse_unsupported(tmp_path / "mask.yml")
    zoo.refuse_unsupported(tmp_path / "det.yml")
    zoo.refuse_unsupported(tmp_path / "missing.yml")    # left to ppdet's loader, which names the file


def test_train_tool_refuses_a_keypoint_config_in_one_line(checkout):
    rel = "configs/keypoint/hrnet/hrnet_w32_256x192.yml"
    proc = run_tool([str(REPO / "tools" / "train.py"), "-c", rel, "--eval", "-o", "use_gpu=false"], cwd=checkout,
                    timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: {rel} is a keypoint config (architecture TopDownHRNet)"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- detection families train and evaluate

# Faster R-CNN: ppdet's 0-D shapes on both stacks and the RPN's batch loop on Paddle 3 (compat F7, F8); Cascade
# R-CNN: parameters unused in some steps, with PaddleDetection's find_unused_parameters (compat.distributed_model);
# FCOS: its targets with numpy 2.4 (F10)
SLOW_FAMILIES = [pytest.param(family, marks=pytest.mark.seam) for family in ("faster_rcnn", "cascade_rcnn", "fcos")]
EXTRA = {"cascade_rcnn": ["find_unused_parameters=true"]}   # what PaddleDetection's DETR and DINO configs set


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("family", SLOW_FAMILIES)
def test_family_trains_an_epoch_on_two_ranks_and_evaluates(tmp_path, family):
    """What a PaddleDetection user types, from their checkout: ``ppmulti launch --nproc_per_node 2
    <ppmulti>/tools/train.py -c configs/<family>/<config>.yml --eval -o epoch=1 use_gpu=false``."""
    rel, files = FAMILIES[family]
    root = write_checkout(tmp_path / "PaddleDetection", files)
    write_coco(root)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ppmulti.cli", "launch", "--nproc_per_node", "2",
                           str(REPO / "tools" / "train.py"), "-c", rel, "--eval", "-o", "epoch=1", "use_gpu=false",
                           "pretrain_weights=", *EXTRA.get(family, [])], cwd=root, env=launch_env(),
                          capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0.0 <= summary["mAP50"] <= 1.0 and 0.0 <= summary["mAP50_95"] <= summary["mAP50"]
    assert re.search(r"world size 2, global batch 4 \(2 per rank\)", out), out[-4000:]
    run = root / summary["run_dir"]                  # PaddleDetection's save_dir: output, under the checkout
    assert run.parent == root / "output", summary
    resolved = yaml.safe_load((run / "config.yml").read_text())
    assert resolved["architecture"] == {"faster_rcnn": "FasterRCNN", "cascade_rcnn": "CascadeRCNN",
                                        "fcos": "FCOS"}[family]
    assert resolved["num_classes"] == 3   # taken from the data: coco_detection.yml says 80
    print(f"{family}: {took:.1f} s")
