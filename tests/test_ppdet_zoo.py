"""PaddleDetection's config zoo as a user brings it: configs in its form (a ``_BASE_`` tree of datasets/, runtime.yml,
_base_/optimizer, model and reader files), run from their directory with the data in ``dataset/coco``. Every detection
family ppdet 2.6 implements that runs on a CPU trains one epoch on 2 ranks and evaluates, one config each (FAMILIES):
PP-YOLOE+, PicoDet, YOLOX, YOLOv3, PP-YOLO, SSD, FCOS, TOOD, GFL, RetinaNet, Faster R-CNN, Cascade R-CNN, DETR,
Deformable DETR and DINO; keypoint, MOT, rotated-box and segmentation configs are refused at start, by name."""

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


# ----- the other families, each a config and its _base_ files as PaddleDetection release/2.6 writes that family's
# smallest config, shrunk: the smallest backbone its keys allow (depth/width multipliers, ResNet-18, LCNet 0.25,
# MobileNet 0.25), narrow necks and heads, a small transformer, and images of 96-128 px where the family's
# assigners allow it (PicoDet 192, TOOD and GFL 384 in training: their ATSS assigners take 9 cells of every level)

IMAGENET = "{is_scale: true, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}"


def _family(family: str, name: str, bases: dict[str, str], own: str) -> tuple[str, dict[str, str]]:
    """``configs/<family>/<name>.yml`` with the _BASE_ list PaddleDetection's configs open with (the shared dataset
    and runtime files, then ``bases`` in order, written under ``_base_/``) and its own keys ``own``."""
    rel = f"configs/{family}/{name}.yml"
    text = ("_BASE_: [\n  '../datasets/coco_detection.yml',\n  '../runtime.yml',\n"
            + "".join(f"  '_base_/{base}',\n" for base in bases) + "]\n" + own)
    return rel, {rel: text, **{f"configs/{family}/_base_/{base}": body for base, body in bases.items()}}


def _momentum(epoch: int, base_lr: float, schedulers: str, decay: str, extra: str = "") -> str:
    """An optimizer_*.yml of PaddleDetection's CNN families: Momentum with L2 decay."""
    return (f"epoch: {epoch}\n\nLearningRate:\n  base_lr: {base_lr}\n  schedulers:\n{schedulers}\n"
            f"OptimizerBuilder:\n{extra}  optimizer:\n    momentum: 0.9\n    type: Momentum\n"
            f"  regularizer:\n    factor: {decay}\n    type: L2\n")


def _adamw(epoch: int, base_lr: float, milestone: int) -> str:
    """The DETR families' optimizer_1x.yml: AdamW, clipped gradients, one LR step, no warmup."""
    return (f"epoch: {epoch}\n\nLearningRate:\n  base_lr: {base_lr}\n  schedulers:\n  - !PiecewiseDecay\n"
            f"    gamma: 0.1\n    milestones: [{milestone}]\n    use_warmup: false\n\n"
            "OptimizerBuilder:\n  clip_grad_by_norm: 0.1\n  regularizer: false\n  optimizer:\n    type: AdamW\n"
            "    weight_decay: 0.0001\n")


PAD_32 = "  batch_transforms:\n  - PadBatch: {pad_to_stride: 32}\n"
PAD_MASK = "  batch_transforms:\n  - PadMaskBatch: {pad_to_stride: -1, return_pad_mask: true}\n"
NO_SHUFFLE = "  shuffle: false\n"
NO_SHUFFLE_NO_DROP = NO_SHUFFLE + "  drop_last: false\n"

PIECEWISE_1X = ("  - !PiecewiseDecay\n    gamma: 0.1\n    milestones: [8, 11]\n"
                "  - !LinearWarmup\n    start_factor: 0.001\n    steps: 500\n")


def _eval_test_readers(resize: str, batch: str = "", extra_eval: str = "") -> str:
    """EvalReader and TestReader, which PaddleDetection's reader files write alike."""
    return "".join(f"""\
{reader}:
  sample_transforms:
  - Decode: {{}}
  - {resize}
  - NormalizeImage: {IMAGENET}
  - Permute: {{}}
{batch}  batch_size: 1
{extra_eval if reader == "EvalReader" else ""}""" for reader in ("EvalReader", "TestReader"))


# PP-YOLOE+ (ppyoloe_plus_crn_s_80e_coco): CSPResNet at depth_mult 0.33 / width_mult 0.25, 96 px (its ATSS
# assigner, used in the first static_assigner_epoch epochs, takes 9 cells of each level: 3 x the stride 32)
PPYOLOE = _family("ppyoloe", "ppyoloe_plus_crn_xs_80e_coco", {
    "optimizer_80e.yml": _momentum(80, 0.001, "    - name: CosineDecay\n      max_epochs: 96\n"
                                              "    - name: LinearWarmup\n      start_factor: 0.\n      epochs: 5\n",
                                   "0.0005"),
    "ppyoloe_plus_crn.yml": """\
architecture: YOLOv3
norm_type: sync_bn
use_ema: true
ema_decay: 0.9998
ema_black_list: ['proj_conv.weight']
custom_black_list: ['reduce_mean']

YOLOv3:
  backbone: CSPResNet
  neck: CustomCSPPAN
  yolo_head: PPYOLOEHead
  post_process: ~

CSPResNet:
  layers: [3, 6, 6, 3]
  channels: [64, 128, 256, 512, 1024]
  return_idx: [1, 2, 3]
  use_large_stem: True
  use_alpha: True

CustomCSPPAN:
  out_channels: [768, 384, 192]
  stage_num: 1
  block_num: 3
  act: 'swish'
  spp: true

PPYOLOEHead:
  fpn_strides: [32, 16, 8]
  grid_cell_scale: 5.0
  grid_cell_offset: 0.5
  static_assigner_epoch: 30
  use_varifocal_loss: True
  loss_weight: {class: 1.0, iou: 2.5, dfl: 0.5}
  static_assigner:
    name: ATSSAssigner
    topk: 9
  assigner:
    name: TaskAlignedAssigner
    topk: 13
    alpha: 1.0
    beta: 6.0
  nms:
    name: MultiClassNMS
    nms_top_k: 1000
    keep_top_k: 300
    score_threshold: 0.01
    nms_threshold: 0.7
""",
    "ppyoloe_plus_reader.yml": """\
worker_num: 0
eval_height: &eval_height 96
eval_width: &eval_width 96
eval_size: &eval_size [*eval_height, *eval_width]

TrainReader:
  sample_transforms:
    - Decode: {}
    - RandomDistort: {}
    - RandomExpand: {fill_value: [123.675, 116.28, 103.53]}
    - RandomCrop: {}
    - RandomFlip: {}
  batch_transforms:
    - BatchRandomResize: {target_size: [96], random_size: True, random_interp: True, keep_ratio: False}
    - NormalizeImage: {mean: [0., 0., 0.], std: [1., 1., 1.], norm_type: none}
    - Permute: {}
    - PadGT: {}
  batch_size: 2
  shuffle: true
  drop_last: true
  collate_batch: true

EvalReader:
  sample_transforms:
    - Decode: {}
    - Resize: {target_size: *eval_size, keep_ratio: False, interp: 2}
    - NormalizeImage: {mean: [0., 0., 0.], std: [1., 1., 1.], norm_type: none}
    - Permute: {}
  batch_size: 2

TestReader:
  inputs_def:
    image_shape: [3, *eval_height, *eval_width]
  sample_transforms:
    - Decode: {}
    - Resize: {target_size: *eval_size, keep_ratio: False, interp: 2}
    - NormalizeImage: {mean: [0., 0., 0.], std: [1., 1., 1.], norm_type: none}
    - Permute: {}
  batch_size: 1
"""}, """\
log_iter: 100
snapshot_epoch: 5
weights: output/ppyoloe_plus_crn_xs_80e_coco/model_final

pretrain_weights: https://bj.bcebos.com/v1/paddledet/models/pretrained/ppyoloe_crn_s_obj365_pretrained.pdparams
depth_mult: 0.33
width_mult: 0.25
""")

# PicoDet (picodet_s_320_coco_lcnet): LCNet x0.25, a 32-channel LCPAN and head with one conv, 192 px (its ATSS
# assigner takes 9 cells of each level: 3 x the stride 64)
PICODET = _family("picodet", "picodet_xs_192_coco_lcnet", {
    "picodet_v2.yml": """\
architecture: PicoDet
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/LCNet_x1_5_pretrained.pdparams

PicoDet:
  backbone: LCNet
  neck: LCPAN
  head: PicoHeadV2

LCNet:
  scale: 1.5
  feature_maps: [3, 4, 5]

LCPAN:
  out_channels: 128
  use_depthwise: True
  num_features: 4

PicoHeadV2:
  conv_feat:
    name: PicoFeat
    feat_in: 128
    feat_out: 128
    num_convs: 4
    num_fpn_stride: 4
    norm_type: bn
    share_cls_reg: True
    use_se: True
  fpn_stride: [8, 16, 32, 64]
  feat_in_chan: 128
  prior_prob: 0.01
  reg_max: 7
  cell_offset: 0.5
  grid_cell_scale: 5.0
  static_assigner_epoch: 100
  use_align_head: True
  static_assigner:
    name: ATSSAssigner
    topk: 9
    force_gt_matching: False
  assigner:
    name: TaskAlignedAssigner
    topk: 13
    alpha: 1.0
    beta: 6.0
  loss_class:
    name: VarifocalLoss
    use_sigmoid: False
    iou_weighted: True
    loss_weight: 1.0
  loss_dfl:
    name: DistributionFocalLoss
    loss_weight: 0.5
  loss_bbox:
    name: GIoULoss
    loss_weight: 2.5
  nms:
    name: MultiClassNMS
    nms_top_k: 1000
    keep_top_k: 100
    score_threshold: 0.025
    nms_threshold: 0.6
""",
    "optimizer_300e.yml": _momentum(300, 0.32, "  - name: CosineDecay\n    max_epochs: 300\n"
                                               "  - name: LinearWarmup\n    start_factor: 0.1\n    steps: 300\n",
                                    "0.00004"),
    "picodet_192_reader.yml": f"""\
worker_num: 0
eval_height: &eval_height 192
eval_width: &eval_width 192
eval_size: &eval_size [*eval_height, *eval_width]

TrainReader:
  sample_transforms:
  - Decode: {{}}
  - RandomCrop: {{}}
  - RandomFlip: {{prob: 0.5}}
  - RandomDistort: {{}}
  batch_transforms:
  - BatchRandomResize: {{target_size: [192], random_size: True, random_interp: True, keep_ratio: False}}
  - NormalizeImage: {IMAGENET}
  - Permute: {{}}
  - PadGT: {{}}
  batch_size: 2
  shuffle: true
  drop_last: true

{_eval_test_readers("Resize: {interp: 2, target_size: *eval_size, keep_ratio: False}",
                    PAD_32, NO_SHUFFLE)}"""}, """\
pretrain_weights: https://paddle-imagenet-models-name.bj.bcebos.com/dygraph/legendary_models/PPLCNet_x0_75_pretrained.pdparams
weights: output/picodet_xs_192_coco/best_model
find_unused_parameters: True
use_ema: true
epoch: 300
snapshot_epoch: 10

LCNet:
  scale: 0.25
  feature_maps: [3, 4, 5]

LCPAN:
  out_channels: 32

PicoHeadV2:
  conv_feat:
    name: PicoFeat
    feat_in: 32
    feat_out: 32
    num_convs: 1
    num_fpn_stride: 4
    norm_type: bn
    share_cls_reg: True
    use_se: True
  feat_in_chan: 32

TrainReader:
  batch_size: 2
""")

# YOLOX (yolox_nano_300e_coco): CSPDarkNet at depth_mult 0.33 / width_mult 0.25, depthwise, mosaic, 64-96 px (the
# model's multi-scale size_range x its size_stride 32; input_size, YOLOX's own key, the size the reader pads to)
YOLOX = _family("yolox", "yolox_nano_300e_coco", {
    "optimizer_300e.yml": _momentum(300, 0.01, "  - !CosineDecay\n    max_epochs: 300\n    min_lr_ratio: 0.05\n"
                                               "    last_plateau_epochs: 15\n  - !ExpWarmup\n    epochs: 5\n",
                                    "0.0005").replace("    type: Momentum\n", "    type: Momentum\n"
                                                                             "    use_nesterov: True\n"),
    "yolox_cspdarknet.yml": """\
architecture: YOLOX
norm_type: sync_bn
use_ema: True
ema_decay: 0.9999
ema_decay_type: "exponential"
act: silu
find_unused_parameters: True

depth_mult: 1.0
width_mult: 1.0

YOLOX:
  backbone: CSPDarkNet
  neck: YOLOCSPPAN
  head: YOLOXHead
  size_stride: 32
  size_range: [15, 25] # multi-scale range [480*480 ~ 800*800]

CSPDarkNet:
  arch: "X"
  return_idx: [2, 3, 4]
  depthwise: False

YOLOCSPPAN:
  depthwise: False

YOLOXHead:
  l1_epoch: 285
  depthwise: False
  loss_weight: {cls: 1.0, obj: 1.0, iou: 5.0, l1: 1.0}
  assigner:
    name: SimOTAAssigner
    candidate_topk: 10
    use_vfl: False
  nms:
    name: MultiClassNMS
    nms_top_k: 10000
    keep_top_k: 1000
    score_threshold: 0.001
    nms_threshold: 0.65
""",
    "yolox_reader.yml": """\
worker_num: 0
TrainReader:
  sample_transforms:
    - Decode: {}
    - Mosaic:
        prob: 0.5
        input_dim: [96, 96]
        degrees: [-10, 10]
        scale: [0.5, 1.5]
        shear: [-2, 2]
        translate: [-0.1, 0.1]
        enable_mixup: False
    - AugmentHSV: {is_bgr: False, hgain: 5, sgain: 30, vgain: 30}
    - PadResize: {target_size: 96}
    - RandomFlip: {}
  batch_transforms:
    - Permute: {}
  batch_size: 2
  shuffle: True
  drop_last: True
  collate_batch: False
  mosaic_epoch: 285

EvalReader:
  sample_transforms:
    - Decode: {}
    - Resize: {target_size: [96, 96], keep_ratio: True, interp: 1}
    - Pad: {size: [96, 96], fill_value: [114., 114., 114.]}
    - Permute: {}
  batch_size: 2

TestReader:
  inputs_def:
    image_shape: [3, 96, 96]
  sample_transforms:
    - Decode: {}
    - Resize: {target_size: [96, 96], keep_ratio: True, interp: 1}
    - Pad: {size: [96, 96], fill_value: [114., 114., 114.]}
    - Permute: {}
  batch_size: 1
"""}, """\
depth_mult: 0.33
width_mult: 0.25

log_iter: 100
snapshot_epoch: 10
weights: output/yolox_nano_300e_coco/model_final

YOLOX:
  backbone: CSPDarkNet
  neck: YOLOCSPPAN
  head: YOLOXHead
  input_size: [96, 96]
  size_stride: 32
  size_range: [2, 3] # multi-scale range [64*64 ~ 96*96]

CSPDarkNet:
  arch: "X"
  return_idx: [2, 3, 4]
  depthwise: True

YOLOCSPPAN:
  depthwise: True

YOLOXHead:
  depthwise: True
""")

YOLO_ANCHORS = "[[10, 13], [16, 30], [33, 23], [30, 61], [62, 45], [59, 119], [116, 90], [156, 198], [373, 326]]"


def _yolo_reader(anchor_masks: str, anchors: str, downsample: str, mixup_epoch: int) -> str:
    """yolov3_reader.yml / ppyolo_reader.yml at 96 px."""
    return f"""\
worker_num: 0
TrainReader:
  inputs_def:
    num_max_boxes: 50
  sample_transforms:
    - Decode: {{}}
    - Mixup: {{alpha: 1.5, beta: 1.5}}
    - RandomDistort: {{}}
    - RandomExpand: {{fill_value: [123.675, 116.28, 103.53]}}
    - RandomCrop: {{}}
    - RandomFlip: {{}}
  batch_transforms:
    - BatchRandomResize: {{target_size: [96], random_size: True, random_interp: True, keep_ratio: False}}
    - NormalizeBox: {{}}
    - PadBox: {{num_max_boxes: 50}}
    - BboxXYXY2XYWH: {{}}
    - NormalizeImage: {IMAGENET}
    - Permute: {{}}
    - Gt2YoloTarget: {{anchor_masks: {anchor_masks}, anchors: {anchors}, downsample_ratios: {downsample}}}
  batch_size: 2
  shuffle: true
  drop_last: true
  mixup_epoch: {mixup_epoch}

{_eval_test_readers("Resize: {target_size: [96, 96], keep_ratio: False, interp: 2}")}"""


# YOLOv3 (yolov3_mobilenet_v1_270e_coco): MobileNetV1 x0.25, 96 px
YOLOV3 = _family("yolov3", "yolov3_mobilenet_v1_x0_25_270e_coco", {
    "optimizer_270e.yml": _momentum(270, 0.001, "  - !PiecewiseDecay\n    gamma: 0.1\n    milestones:\n    - 216\n"
                                                "    - 243\n  - !LinearWarmup\n    start_factor: 0.\n    steps: 4000\n",
                                    "0.0005"),
    "yolov3_mobilenet_v1.yml": f"""\
architecture: YOLOv3
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/MobileNetV1_pretrained.pdparams
norm_type: sync_bn

YOLOv3:
  backbone: MobileNet
  neck: YOLOv3FPN
  yolo_head: YOLOv3Head
  post_process: BBoxPostProcess

MobileNet:
  scale: 0.25
  feature_maps: [4, 6, 13]
  with_extra_blocks: false
  extra_block_filters: []

YOLOv3Head:
  anchors: {YOLO_ANCHORS}
  anchor_masks: [[6, 7, 8], [3, 4, 5], [0, 1, 2]]
  loss: YOLOv3Loss

YOLOv3Loss:
  ignore_thresh: 0.7
  downsample: [32, 16, 8]
  label_smooth: false

BBoxPostProcess:
  decode:
    name: YOLOBox
    conf_thresh: 0.005
    downsample_ratio: 32
    clip_bbox: true
  nms:
    name: MultiClassNMS
    keep_top_k: 100
    score_threshold: 0.01
    nms_threshold: 0.45
    nms_top_k: 1000
""",
    "yolov3_reader.yml": _yolo_reader("[[6, 7, 8], [3, 4, 5], [0, 1, 2]]", YOLO_ANCHORS, "[32, 16, 8]", 250)}, """\
snapshot_epoch: 5
weights: output/yolov3_mobilenet_v1_x0_25_270e_coco/model_final
""")

# PP-YOLO (ppyolo_r18vd_coco): its own ResNet-18-vd with two YOLO levels, DropBlock and MatrixNMS, 96 px
PPYOLO_ANCHORS = "[[10, 14], [23, 27], [37, 58], [81, 82], [135, 169], [344, 319]]"
PPYOLO = _family("ppyolo", "ppyolo_r18vd_coco", {
    "ppyolo_r18vd.yml": f"""\
architecture: YOLOv3
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet18_vd_pretrained.pdparams
norm_type: sync_bn
use_ema: true
ema_decay: 0.9998

YOLOv3:
  backbone: ResNet
  neck: PPYOLOFPN
  yolo_head: YOLOv3Head
  post_process: BBoxPostProcess

ResNet:
  depth: 18
  variant: d
  return_idx: [2, 3]
  freeze_at: -1
  freeze_norm: false
  norm_decay: 0.

PPYOLOFPN:
  drop_block: true
  block_size: 3
  keep_prob: 0.9
  conv_block_num: 0

YOLOv3Head:
  anchor_masks: [[3, 4, 5], [0, 1, 2]]
  anchors: {PPYOLO_ANCHORS}
  loss: YOLOv3Loss

YOLOv3Loss:
  ignore_thresh: 0.7
  downsample: [32, 16]
  label_smooth: false
  scale_x_y: 1.05
  iou_loss: IouLoss

IouLoss:
  loss_weight: 2.5
  loss_square: true

BBoxPostProcess:
  decode:
    name: YOLOBox
    conf_thresh: 0.01
    downsample_ratio: 32
    clip_bbox: true
    scale_x_y: 1.05
  nms:
    name: MatrixNMS
    keep_top_k: 100
    score_threshold: 0.01
    post_threshold: 0.01
    nms_top_k: -1
    background_label: -1
""",
    "optimizer_1x.yml": _momentum(405, 0.01, "  - !PiecewiseDecay\n    gamma: 0.1\n    milestones:\n    - 243\n"
                                             "    - 324\n  - !LinearWarmup\n    start_factor: 0.\n    steps: 4000\n",
                                  "0.0005", "  clip_grad_by_norm: 35.\n"),
    "ppyolo_reader.yml": _yolo_reader("[[6, 7, 8], [3, 4, 5], [0, 1, 2]]", YOLO_ANCHORS, "[32, 16, 8]", 25000)}, f"""\
snapshot_epoch: 10
weights: output/ppyolo_r18vd_coco/model_final

TrainReader:
  batch_transforms:
    - BatchRandomResize:
        target_size: [96]
        random_size: True
        random_interp: True
        keep_ratio: False
    - NormalizeBox: {{}}
    - PadBox: {{num_max_boxes: 50}}
    - BboxXYXY2XYWH: {{}}
    - NormalizeImage:
        mean: [0.485, 0.456, 0.406]
        std: [0.229, 0.224, 0.225]
        is_scale: True
    - Permute: {{}}
    - Gt2YoloTarget:
        anchor_masks: [[3, 4, 5], [0, 1, 2]]
        anchors: {PPYOLO_ANCHORS}
        downsample_ratios: [32, 16]
  batch_size: 2
  mixup_epoch: 500
  shuffle: true

epoch: 270

LearningRate:
  base_lr: 0.004
  schedulers:
  - !PiecewiseDecay
    gamma: 0.1
    milestones:
    - 162
    - 216
  - !LinearWarmup
    start_factor: 0.
    steps: 4000
""")

# SSD (ssdlite_mobilenet_v1_300_coco): MobileNetV1 x1 (its extra blocks take the x1 width: ppdet's MobileNet builds
# them for 1024 channels) with narrow extra blocks, separable head convs, 128 px
SSD = _family("ssd", "ssdlite_mobilenet_v1_128_coco", {
    "optimizer_1700e.yml": _momentum(1700, 0.4, "  - !CosineDecay\n    max_epochs: 1700\n  - !LinearWarmup\n"
                                                "    start_factor: 0.3333333333333333\n    steps: 2000\n", "0.0005"),
    "ssdlite_mobilenet_v1_300.yml": """\
architecture: SSD
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/MobileNetV1_ssld_pretrained.pdparams

SSD:
  backbone: MobileNet
  ssd_head: SSDHead
  post_process: BBoxPostProcess

MobileNet:
  conv_decay: 0.00004
  scale: 1
  extra_block_filters: [[64, 128], [32, 64], [32, 64], [16, 32]]
  with_extra_blocks: true
  feature_maps: [11, 13, 14, 15, 16, 17]

SSDHead:
  use_sepconv: True
  conv_decay: 0.00004
  anchor_generator:
    steps: [16, 32, 64, 100, 150, 300]
    aspect_ratios: [[2.], [2., 3.], [2., 3.], [2., 3.], [2., 3.], [2., 3.]]
    min_ratio: 20
    max_ratio: 95
    base_size: 300
    min_sizes: []
    max_sizes: []
    offset: 0.5
    flip: true
    clip: true
    min_max_aspect_ratios_order: False

BBoxPostProcess:
  decode:
    name: SSDBox
  nms:
    name: MultiClassNMS
    keep_top_k: 200
    score_threshold: 0.01
    nms_threshold: 0.45
    nms_top_k: 400
    nms_eta: 1.0
""",
    "ssdlite128_reader.yml": f"""\
worker_num: 0
TrainReader:
  inputs_def:
    num_max_boxes: 90
  sample_transforms:
    - Decode: {{}}
    - RandomDistort: {{brightness: [0.5, 1.125, 0.875], random_apply: False}}
    - RandomExpand: {{fill_value: [123.675, 116.28, 103.53]}}
    - RandomCrop: {{allow_no_crop: False}}
    - RandomFlip: {{}}
    - Resize: {{target_size: [128, 128], keep_ratio: False, interp: 1}}
    - NormalizeBox: {{}}
    - PadBox: {{num_max_boxes: 90}}
  batch_transforms:
    - NormalizeImage: {IMAGENET}
    - Permute: {{}}
  batch_size: 2
  shuffle: true
  drop_last: true

{_eval_test_readers("Resize: {target_size: [128, 128], keep_ratio: False, interp: 1}")}"""}, """\
weights: output/ssdlite_mobilenet_v1_128_coco/model_final
""")

# RetinaNet, TOOD and GFL share FPN one-stage readers: 64-96 px for RetinaNet; 384 px in training for TOOD and GFL
# (ATSS takes 9 cells of each level: 3 x the stride 128), 96 px in evaluation


def _fpn_reader(train_resize: str, eval_resize: str, train_batch_extra: str = "", train_tail: str = "") -> str:
    return f"""\
worker_num: 0
TrainReader:
  sample_transforms:
  - Decode: {{}}
  - RandomFlip: {{prob: 0.5}}
  - {train_resize}
  - NormalizeImage: {IMAGENET}
  - Permute: {{}}
  batch_transforms:
  - PadBatch: {{pad_to_stride: 32}}
{train_batch_extra}  batch_size: 2
  shuffle: true
  drop_last: true
{train_tail}
{_eval_test_readers(eval_resize, PAD_32)}"""


RESNET18_FPN = """\
ResNet:
  depth: 18
  variant: b
  norm_type: bn
  freeze_at: 0
  return_idx: [1, 2, 3]
  num_stages: 4

FPN:
  out_channel: 64
  spatial_scales: [0.125, 0.0625, 0.03125]
  extra_stage: 2
  has_extra_convs: true
  use_c5: false
"""

# RetinaNet (retinanet_r50_fpn_1x_coco): ResNet-18, a 64-channel FPN and one conv in each tower
RETINANET = _family("retinanet", "retinanet_r18_fpn_1x_coco", {
    "retinanet_r18_fpn.yml": f"""\
architecture: RetinaNet
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_cos_pretrained.pdparams

RetinaNet:
  backbone: ResNet
  neck: FPN
  head: RetinaHead

{RESNET18_FPN}
RetinaHead:
  conv_feat:
    name: RetinaFeat
    feat_in: 64
    feat_out: 64
    num_convs: 1
    norm_type: null
    use_dcn: false
  anchor_generator:
    name: RetinaAnchorGenerator
    octave_base_scale: 4
    scales_per_octave: 3
    aspect_ratios: [0.5, 1.0, 2.0]
    strides: [8.0, 16.0, 32.0, 64.0, 128.0]
  bbox_assigner:
    name: MaxIoUAssigner
    positive_overlap: 0.5
    negative_overlap: 0.4
    allow_low_quality: true
  loss_class:
    name: FocalLoss
    gamma: 2.0
    alpha: 0.25
    loss_weight: 1.0
  loss_bbox:
    name: SmoothL1Loss
    beta: 0.0
    loss_weight: 1.0
  nms:
    name: MultiClassNMS
    nms_top_k: 1000
    keep_top_k: 100
    score_threshold: 0.05
    nms_threshold: 0.5
""",
    "optimizer_1x.yml": _momentum(12, 0.01, PIECEWISE_1X, "0.0001"),
    "retinanet_reader.yml": _fpn_reader(
        "RandomResize: {target_size: [[64, 96], [80, 96]], keep_ratio: True, interp: 1}",
        "Resize: {target_size: [64, 96], keep_ratio: True, interp: 1}", "", "  collate_batch: false\n")}, """\
weights: output/retinanet_r18_fpn_1x_coco/model_final
""")

# TOOD (tood_r50_fpn_1x_coco): ResNet-18, a 64-channel FPN (TOODHead takes its width) and 2 stacked convs
TOOD = _family("tood", "tood_r18_fpn_1x_coco", {
    "tood_r18_fpn.yml": f"""\
architecture: TOOD
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_cos_pretrained.pdparams

TOOD:
  backbone: ResNet
  neck: FPN
  head: TOODHead

{RESNET18_FPN}
TOODHead:
  stacked_convs: 2
  grid_cell_scale: 8
  static_assigner_epoch: 4
  loss_weight: {{ class: 1.0, iou: 2.0 }}
  static_assigner:
    name: ATSSAssigner
    topk: 9
  assigner:
    name: TaskAlignedAssigner
    topk: 13
    alpha: 1.0
    beta: 6.0
  nms:
    name: MultiClassNMS
    nms_top_k: 1000
    keep_top_k: 100
    score_threshold: 0.05
    nms_threshold: 0.6
""",
    "optimizer_1x.yml": _momentum(12, 0.01, PIECEWISE_1X, "0.0001"),
    "tood_reader.yml": _fpn_reader("Resize: {target_size: [384, 640], keep_ratio: true}",
                                   "Resize: {target_size: [96, 160], keep_ratio: True}", "  - PadGT: {}\n",
                                   "  collate_batch: true\n")}, """\
weights: output/tood_r18_fpn_1x_coco/model_final
find_unused_parameters: True
log_iter: 100
""")

# GFL (gfl_r18vd_1x_coco): as PaddleDetection's, the R-50 base file with ResNet-18-vd in the config; here also a
# 64-channel FPN and one conv in the head
GFL = _family("gfl", "gfl_r18vd_1x_coco", {
    "gfl_r50_fpn.yml": RESNET18_FPN.replace("depth: 18", "depth: 50").replace("out_channel: 64", "out_channel: 256")
    .join(("""\
architecture: GFL
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_cos_pretrained.pdparams

GFL:
  backbone: ResNet
  neck: FPN
  head: GFLHead

""", """
GFLHead:
  conv_feat:
    name: FCOSFeat
    feat_in: 256
    feat_out: 256
    num_convs: 4
    norm_type: "gn"
    use_dcn: false
  fpn_stride: [8, 16, 32, 64, 128]
  prior_prob: 0.01
  reg_max: 16
  loss_class:
    name: QualityFocalLoss
    use_sigmoid: True
    beta: 2.0
    loss_weight: 1.0
  loss_dfl:
    name: DistributionFocalLoss
    loss_weight: 0.25
  loss_bbox:
    name: GIoULoss
    loss_weight: 2.0
  nms:
    name: MultiClassNMS
    nms_top_k: 1000
    keep_top_k: 100
    score_threshold: 0.025
    nms_threshold: 0.6
""")),
    "optimizer_1x.yml": _momentum(12, 0.01, PIECEWISE_1X, "0.0001"),
    "gfl_reader.yml": _fpn_reader("Resize: {target_size: [384, 640], keep_ratio: true, interp: 1}",
                                  "Resize: {interp: 1, target_size: [96, 160], keep_ratio: True}",
                                  "  - Gt2GFLTarget:\n      downsample_ratios: [8, 16, 32, 64, 128]\n"
                                  "      grid_cell_scale: 8\n")}, """\
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet18_vd_pretrained.pdparams
weights: output/gfl_r18vd_1x_coco/model_final
find_unused_parameters: True

ResNet:
  depth: 18
  variant: d
  norm_type: bn
  freeze_at: 0
  return_idx: [1,2,3]
  num_stages: 4

FPN:
  out_channel: 64

GFLHead:
  conv_feat:
    name: FCOSFeat
    feat_in: 64
    feat_out: 64
    num_convs: 1
    norm_type: "gn"
    use_dcn: false
  feat_in_chan: 64
""")

# The DETR family's reader: short sides of 64-96 px (at most 128) where PaddleDetection's are 480-800 (at most 1333)
DETR_READER = f"""\
worker_num: 0
TrainReader:
  sample_transforms:
  - Decode: {{}}
  - RandomFlip: {{prob: 0.5}}
  - RandomSelect: {{ transforms1: [ RandomShortSideResize: {{ short_side_sizes: [ 64, 80, 96 ], max_size: 128 }} ],
                    transforms2: [
                        RandomShortSideResize: {{ short_side_sizes: [ 64, 80 ] }},
                        RandomSizeCrop: {{ min_size: 48, max_size: 80 }},
                        RandomShortSideResize: {{ short_side_sizes: [ 64, 80, 96 ], max_size: 128 }} ]
  }}
  - NormalizeImage: {IMAGENET}
  - NormalizeBox: {{}}
  - BboxXYXY2XYWH: {{}}
  - Permute: {{}}
  batch_transforms:
  - PadMaskBatch: {{pad_to_stride: -1, return_pad_mask: true}}
  batch_size: 2
  shuffle: true
  drop_last: true
  collate_batch: false
  use_shared_memory: false

{_eval_test_readers("Resize: {target_size: [96, 128], keep_ratio: True}",
                    PAD_MASK, NO_SHUFFLE_NO_DROP)}"""

# DETR (detr_r50_1x_coco): ResNet-18, hidden_dim 64, one encoder and one decoder layer, 10 queries
DETR = _family("detr", "detr_r18_1x_coco", {
    "optimizer_1x.yml": _adamw(500, 0.0001, 400),
    "detr_r18.yml": """\
architecture: DETR
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_vb_normal_pretrained.pdparams
hidden_dim: 64

DETR:
  backbone: ResNet
  transformer: DETRTransformer
  detr_head: DETRHead
  post_process: DETRBBoxPostProcess

ResNet:
  depth: 18
  norm_type: bn
  freeze_at: 0
  return_idx: [3]
  lr_mult_list: [0.0, 0.1, 0.1, 0.1]
  num_stages: 4

DETRTransformer:
  num_queries: 10
  position_embed_type: sine
  nhead: 8
  num_encoder_layers: 1
  num_decoder_layers: 2
  dim_feedforward: 128
  dropout: 0.1
  activation: relu

DETRHead:
  num_mlp_layers: 3

DETRLoss:
  loss_coeff: {class: 1, bbox: 5, giou: 2, no_object: 0.1, mask: 1, dice: 1}
  aux_loss: True

HungarianMatcher:
  matcher_coeff: {class: 1, bbox: 5, giou: 2}
""",
    "detr_reader.yml": DETR_READER}, """\
weights: output/detr_r18_1x_coco/model_final
find_unused_parameters: True
""")

# Deformable DETR (deformable_detr_r50_1x_coco): ResNet-18, hidden_dim 64, one layer each, 30 queries; the
# post-process keeps 50 of its 30 x 3 class scores (its default 100 is more than there are)
DEFORMABLE_DETR = _family("deformable_detr", "deformable_detr_r18_1x_coco", {
    "deformable_optimizer_1x.yml": _adamw(50, 0.0002, 40),
    "deformable_detr_r18.yml": """\
architecture: DETR
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_vb_normal_pretrained.pdparams
hidden_dim: 64
use_focal_loss: True

DETR:
  backbone: ResNet
  transformer: DeformableTransformer
  detr_head: DeformableDETRHead
  post_process: DETRBBoxPostProcess

ResNet:
  depth: 18
  norm_type: bn
  freeze_at: 0
  return_idx: [1, 2, 3]
  lr_mult_list: [0.0, 0.1, 0.1, 0.1]
  num_stages: 4

DeformableTransformer:
  num_queries: 30
  position_embed_type: sine
  nhead: 8
  num_encoder_layers: 1
  num_decoder_layers: 2
  dim_feedforward: 128
  dropout: 0.1
  activation: relu
  num_feature_levels: 4
  num_encoder_points: 4
  num_decoder_points: 4

DeformableDETRHead:
  num_mlp_layers: 3

DETRLoss:
  loss_coeff: {class: 2, bbox: 5, giou: 2, mask: 1, dice: 1}
  aux_loss: True

HungarianMatcher:
  matcher_coeff: {class: 2, bbox: 5, giou: 2}

DETRBBoxPostProcess:
  num_top_queries: 50
""",
    "deformable_detr_reader.yml": DETR_READER}, """\
weights: output/deformable_detr_r18_1x_coco/model_final
find_unused_parameters: True
""")

# DINO (dino_r50_4scale_1x_coco): ResNet-18, hidden_dim 64, one layer each, 30 queries and 20 denoising queries
# (its 900 queries need 900 encoder tokens, about 300 px; 30 need 96 px)
DINO = _family("dino", "dino_r18_4scale_1x_coco", {
    "optimizer_1x.yml": _adamw(12, 0.0001, 11),
    "dino_r18.yml": """\
architecture: DETR
pretrain_weights: https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_cos_pretrained.pdparams
hidden_dim: 64
use_focal_loss: True

DETR:
  backbone: ResNet
  transformer: DINOTransformer
  detr_head: DINOHead
  post_process: DETRBBoxPostProcess

ResNet:
  depth: 18
  norm_type: bn
  freeze_at: 0
  return_idx: [1, 2, 3]
  lr_mult_list: [0.0, 0.1, 0.1, 0.1]
  num_stages: 4

DINOTransformer:
  num_queries: 30
  position_embed_type: sine
  num_levels: 4
  nhead: 8
  num_encoder_layers: 1
  num_decoder_layers: 2
  dim_feedforward: 128
  dropout: 0.0
  activation: relu
  pe_temperature: 20
  pe_offset: 0.0
  num_denoising: 20
  label_noise_ratio: 0.5
  box_noise_scale: 1.0
  learnt_init_query: True

DINOHead:
  loss:
    name: DINOLoss
    loss_coeff: {class: 1, bbox: 5, giou: 2}
    aux_loss: True
    matcher:
      name: HungarianMatcher
      matcher_coeff: {class: 2, bbox: 5, giou: 2}

DETRBBoxPostProcess:
  num_top_queries: 50
""",
    "dino_reader.yml": DETR_READER}, """\
weights: output/dino_r18_4scale_1x_coco/model_final
find_unused_parameters: True
log_iter: 100
""")


FAMILIES = {
    "ppyoloe": PPYOLOE,
    "picodet": PICODET,
    "yolox": YOLOX,
    "yolov3": YOLOV3,
    "ppyolo": PPYOLO,
    "ssd": SSD,
    "fcos": ("configs/fcos/fcos_r18_fpn_1x_coco.yml", {"configs/fcos/fcos_r18_fpn_1x_coco.yml": FCOS,
                                                       "configs/fcos/_base_/optimizer_1x.yml": OPTIMIZER_1X}),
    "tood": TOOD,
    "gfl": GFL,
    "retinanet": RETINANET,
    "faster_rcnn": ("configs/faster_rcnn/faster_rcnn_r18_fpn_1x_coco.yml", _faster_rcnn("faster_rcnn_r18_fpn_1x_coco")),
    "cascade_rcnn": ("configs/cascade_rcnn/cascade_rcnn_r18_fpn_1x_coco.yml",
                     _cascade_rcnn("cascade_rcnn_r18_fpn_1x_coco")),
    "detr": DETR,
    "deformable_detr": DEFORMABLE_DETR,
    "dino": DINO,
}
# the architecture each family's config names (PP-YOLOE+, YOLOv3 and PP-YOLO are all ppdet's YOLOv3; the three
# DETRs its DETR)
ARCHITECTURES = {"ppyoloe": "YOLOv3", "picodet": "PicoDet", "yolox": "YOLOX", "yolov3": "YOLOv3", "ppyolo": "YOLOv3",
                 "ssd": "SSD", "fcos": "FCOS", "tood": "TOOD", "gfl": "GFL", "retinanet": "RetinaNet",
                 "faster_rcnn": "FasterRCNN", "cascade_rcnn": "CascadeRCNN", "detr": "DETR", "deformable_detr": "DETR",
                 "dino": "DETR"}


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
    assert cfg["architecture"] == ARCHITECTURES[family]


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

# All 15 families, each through the ppdet fixes it needs (ppmulti/rank/compat.py): PP-YOLOE+, PicoDet and TOOD the
# assigners' int64 labels on Paddle 3 (F1, F2); SSD its hard-example mining (F9), GFL its quality focal loss (F11),
# Deformable DETR its sampling offsets (F12) and DINO its denoising mask (F13) on Paddle 3; Faster R-CNN, Cascade
# R-CNN, TOOD, Deformable DETR and DINO ppdet's 0-D shapes on both stacks (F7), the RPN's batch loop on Paddle 3
# (F8); FCOS its targets with numpy 2.4 (F10). Cascade R-CNN: parameters unused in some steps, so ppmulti turns on
# find_unused_parameters for it (zoo.find_unused_parameters; its PaddleDetection config does not set it, as the
# configs of PicoDet, YOLOX, TOOD, GFL and the three DETRs do), said in one line.
SLOW_FAMILIES = [pytest.param(family, marks=pytest.mark.seam) for family in FAMILIES]
NOTES = {"cascade_rcnn": "find_unused_parameters: on for CascadeRCNN on 2 ranks"}


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
                           "pretrain_weights="], cwd=root, env=launch_env(),
                          capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0.0 <= summary["mAP50"] <= 1.0 and 0.0 <= summary["mAP50_95"] <= summary["mAP50"]
    assert re.search(r"world size 2, global batch 4 \(2 per rank\)", out), out[-4000:]
    if family in NOTES:   # the run log's plan notes reach the console
        assert NOTES[family] in out, out[-4000:]
    else:
        assert "find_unused_parameters: on for" not in out
    run = root / summary["run_dir"]                  # PaddleDetection's save_dir: output, under the checkout
    assert run.parent == root / "output", summary
    resolved = yaml.safe_load((run / "config.yml").read_text())
    assert resolved["architecture"] == ARCHITECTURES[family]
    assert resolved["num_classes"] == 3   # taken from the data: coco_detection.yml says 80
    print(f"{family}: {took:.1f} s")
