"""The rank side's version seam: every Paddle or ppdet internal a rank relies on, behind one function each.

Private attributes, ``paddle.base`` internals, ppdet 2.6.0's quirks and its Paddle-3 fixes, export, custom ops:
paddle and ppdet are imported inside the functions only, so importing this module stays cheap. The installed
version comes from the launcher's seam (ppmulti/common/compat.py), re-exported here so that rank code reads
everything version-dependent from this one module.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ppmulti.common import compat as _launcher
from ppmulti.common.compat import installed_version as installed_version
from ppmulti.common.envvars import PADDLE_SOT_SWITCH


def paddle3(version: tuple[int, ...] | None = None) -> bool:
    """True for Paddle 3 or newer: ``version``, default the installed Paddle (looked up in this module, so a test
    can stand in another version for every rank-side fact at once)."""
    return _launcher.paddle3((installed_version() or ()) if version is None else version)


# Paddle 3.x's ``import paddle`` warns "No ccache found ..." in every process (find_ccache_home in
# paddle/utils/cpp_extension/extension_utils.py, run at import): noise in every rank's log and tool's stderr.
_CCACHE_MESSAGE = r"No ccache found"
_CCACHE_MODULE = r"paddle\.utils\.cpp_extension\.extension_utils"


def before_paddle_import() -> None:
    """What must happen in a process before ``import paddle``: load Python's zlib, and hide Paddle 3.x's
    "No ccache found" UserWarning (and nothing else).

    zlib: Paddle 2.6's libpaddle.so carries zlib symbols of its own, and an extension loaded after it binds
    ``inflate*`` to them. Python's ``zlib`` module loaded after paddle then fails (``zlib.error: Error -2 ...
    inconsistent stream state`` when scikit-learn 1.9, scipy 1.17 or pyclipper 1.4 unpack their Cython
    constants; a segfault in ``inflateReset2`` with pycocotools 2.0.11 or lap 0.5.13); loaded before, it is bound
    to the system's libz and every order works (tests/test_stack.py). The warning filter is matched on its
    message and the module that warns, so any other warning still shows. Imports nothing heavy: the rank side's
    package and its worker entry call it first thing. Both are harmless where not needed.
    """
    import warnings
    import zlib  # noqa: F401  (see above)

    warnings.filterwarnings("ignore", message=_CCACHE_MESSAGE, category=UserWarning, module=_CCACHE_MODULE)


# ppdet's import, and ppdet 2.6.0's fixes for Paddle 3
_IMPORTED = False


def import_ppdet() -> None:
    """Import ppdet without its unconditional numba notice on stdout (it would garble logs and CSV pipes).

    ppdet 2.6.0 prints "Warning: Unable to use numba in PP-Tracking" from ``ppdet.modeling.mot.motion`` on every import
    when numba is missing, and its logger both has its own handler and propagates to the root logger.
    """
    global _IMPORTED
    if _IMPORTED:
        return
    # pycocotools must be imported before paddle with some builds; the pins make both orders safe,
    # importing it first costs nothing and keeps older environments alive.
    import pycocotools.coco  # noqa: F401
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        import ppdet  # noqa: F401
        import ppdet.modeling  # noqa: F401
    for line in buf.getvalue().splitlines():
        if "numba" not in line and line.strip():
            print(line)
    # ppdet's logger writes every debug line twice through the root logger otherwise.
    logging.getLogger("ppdet").propagate = False
    apply_ppdet_fixes()
    _IMPORTED = True


# ppdet 2.6.0 on Paddle 3: narrow runtime fixes, one per broken ppdet callable. ppdet's files are never edited:
# each fix wraps the callable where ppdet looks it up, marks the wrapper, and a second application is a no-op.
_FIX_MARK = "_ppmulti_paddle3_fix"


def is_ppdet_fix(func: Any) -> bool:
    """True for a wrapper one of the ``fix_*`` functions below put in place of a ppdet callable."""
    return bool(getattr(func, _FIX_MARK, False))


def _mark_fixed(wrapper: Callable, original: Callable) -> Callable:
    import functools

    functools.update_wrapper(wrapper, original)   # __wrapped__ lets a test reach ppdet's original
    setattr(wrapper, _FIX_MARK, True)
    return wrapper


def _int64_labels_forward(forward: Callable) -> Callable:
    """Wrap an assigner's ``forward(self, ..., gt_labels, ...)`` so ``gt_labels`` reaches it as int64 and the
    assigned labels (its first result) come back in the caller's dtype; other dtypes pass through."""
    import inspect

    import paddle

    if is_ppdet_fix(forward):
        return forward
    signature = inspect.signature(forward)

    def forward_int64_labels(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        labels = bound.arguments.get("gt_labels")
        if labels is None or getattr(labels, "dtype", None) != paddle.int32:
            return forward(*args, **kwargs)
        bound.arguments["gt_labels"] = labels.astype("int64")
        result = forward(*bound.args, **bound.kwargs)
        # int32 labels in, int32 assigned labels out: what the heads got on Paddle 2.6
        return (result[0].astype(labels.dtype), *result[1:])

    return _mark_fixed(forward_int64_labels, forward)


def fix_assigner_int32_labels() -> list[str]:
    """F1, F2: ppdet 2.6.0's TaskAlignedAssigner (ppdet/modeling/assigners/task_aligned_assigner.py:166) and
    ATSSAssigner (ppdet/modeling/assigners/atss_assigner.py:194) add ``batch_ind``, built with the labels'
    dtype (int32 from ppdet's data pipeline), to an ``argmax`` result (int64). Paddle 2.x promoted silently;
    Paddle 3 raises ``TypeError: (InvalidType) Type promotion only support calculations between
    floating-point numbers and between complex and real numbers. But got different data type x: int64,
    y: int32.`` in every PP-YOLOE training (ATSS while epoch < static_assigner_epoch). PaddleDetection fixed
    the expression itself in 352fa27 (#8857; cherry-picked as 3139f55 and ecc9e6d onto release_2_7_npu).
    Here both classes' ``forward`` get int64 labels, so every integer inside is int64, and hand back int32
    assigned labels. Patched on the classes: ppdet's registry builds every head's assigner from them.
    Returns the names it patched now (empty when already patched)."""
    from ppdet.modeling.assigners.atss_assigner import ATSSAssigner
    from ppdet.modeling.assigners.task_aligned_assigner import TaskAlignedAssigner

    patched = []
    for cls in (TaskAlignedAssigner, ATSSAssigner):
        if not is_ppdet_fix(cls.forward):
            cls.forward = _int64_labels_forward(cls.forward)
            patched.append(f"{cls.__name__}.forward")
    return patched


def in_pir_static_mode() -> bool:
    """True while Paddle builds a PIR program (Paddle 3's to_static / export); False in dygraph, under the old
    static IR, and on a Paddle without PIR (2.6.2's ``paddle.framework.in_pir_mode`` exists but is off)."""
    import paddle

    probe = getattr(paddle.framework, "in_pir_mode", None)
    return bool(probe is not None and probe())


def fix_multiclass_nms_under_pir() -> list[str]:
    """F3: ppdet 2.6.0's ``ppdet.modeling.ops.multiclass_nms`` builds its static-graph op with the old program
    API (``helper.append_op(type="multiclass_nms3", ...)``, ppdet/modeling/ops.py:612), which Paddle 3's PIR
    programs reject during export: ``TypeError: The type of '%BBoxes' in operator multiclass_nms3 should be
    one of [str, bytes, Variable]. but received : Value(...)``. PaddleDetection switched that function to
    ``paddle._C_ops.multiclass_nms3`` under PIR in 60b1dff (#9071) and kept the old path for Paddles without
    PIR in e9786ca (#9160). Here the module attribute is replaced (``MultiClassNMS.__call__``,
    ppdet/modeling/layers.py:558/564, looks it up as ``ops.multiclass_nms`` at call time): in PIR static mode
    the phi op is called with its positional order (bboxes, scores, rois_num, score_threshold, nms_top_k,
    keep_top_k, nms_threshold, normalized, nms_eta, background_label); everywhere else ppdet's original runs.
    Returns the names it patched now (empty when already patched)."""
    import inspect

    import paddle
    from ppdet.modeling import ops

    original = ops.multiclass_nms
    if is_ppdet_fix(original):
        return []
    signature = inspect.signature(original)

    def multiclass_nms(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        if not in_pir_static_mode():
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        out, index, rois_num = paddle._C_ops.multiclass_nms3(
            a["bboxes"], a["scores"], a["rois_num"], a["score_threshold"], a["nms_top_k"], a["keep_top_k"],
            a["nms_threshold"], a["normalized"], a["nms_eta"], a["background_label"])
        # ppdet's return convention: (out, rois_num or None, index or None)
        return out, (rois_num if a["return_rois_num"] else None), (index if a["return_index"] else None)

    # like ppdet's own: dy2static must call it as a whole, not convert its Python branches
    ops.multiclass_nms = paddle.jit.not_to_static(_mark_fixed(multiclass_nms, original))
    return ["ops.multiclass_nms"]


def _is_0d(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    return shape is not None and len(shape) == 0


def concat_0d_as_1d(x: Any, axis: Any = 0, name: str | None = None) -> Any:
    """``paddle.concat`` that takes a 0-D tensor among 0-D and 1-D ones as the 1-element tensor it was before
    Paddle 2.5 (``paddle.shape(t)[0]``, ``bbox_num[i]``): concatenating scalars is stacking them. Any other
    input goes to ``paddle.concat`` unchanged."""
    import paddle

    if isinstance(x, (list, tuple)) and any(_is_0d(t) for t in x) and all(len(getattr(t, "shape", [0, 0])) <= 1
                                                                          for t in x):
        x = [t.reshape([1]) if _is_0d(t) else t for t in x]
    if _is_array_of_0d(x):   # F14: the list a converted loop appended 0-D values to, stacked: [n]
        if callable(getattr(x, "is_dense_tensor_array_type", None)):   # Paddle 3's PIR
            out, _ = paddle._C_ops.array_to_tensor(x, axis, True)
        else:                                                          # Paddle 2.6's program
            out, _ = paddle.tensor.manipulation.tensor_array_to_tensor(x, axis=axis, use_stack=True)
        return out
    return paddle.concat(x, axis=axis, name=name)


def _is_array_of_0d(x: Any) -> bool:
    """A tensor array of 0-D tensors: what a Python list becomes inside a loop that to_static converted (a PIR
    array Value on Paddle 3, a LOD_TENSOR_ARRAY Variable on Paddle 2.6; both report the element's shape)."""
    probe = getattr(x, "is_dense_tensor_array_type", None)
    if callable(probe):
        return bool(probe()) and len(x.shape) == 0
    from paddle.base import core

    array = getattr(core.VarDesc.VarType, "LOD_TENSOR_ARRAY", None)
    return array is not None and getattr(x, "type", None) == array and len(getattr(x, "shape", [0])) == 0


class _ModuleView(types.ModuleType):
    """A module as one ppdet module sees it after a fix (F7's ``paddle``, F10's ``np``): the names given are
    replaced, every other name is the module's own."""

    def __init__(self, module: types.ModuleType, **replaced: Callable):
        super().__init__(module.__name__)
        self.__wrapped__ = module
        self.__dict__.update(replaced)
        setattr(self, _FIX_MARK, True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


# the ppdet 2.6.0 modules that concatenate 0-D tensors; PaddleDetection's 79f77ba (#8653, the cherry-pick of #8112
# and #8140 onto release/2.6, after paddledet 2.6.0 was released) changed each such ``[0]`` / ``[i]`` to a slice;
# DINO's encoder input (dino_transformer.py:478-479) has the same ``concat([h, w])`` and was not in that commit
ZERO_DIM_MODULES = ("ppdet.modeling.proposal_generator.rpn_head", "ppdet.modeling.proposal_generator.target",
                    "ppdet.modeling.heads.cascade_head", "ppdet.modeling.post_process",
                    "ppdet.modeling.heads.tood_head", "ppdet.modeling.transformers.deformable_transformer",
                    "ppdet.modeling.transformers.dino_transformer")


def fix_concat_of_0d_shapes() -> list[str]:
    """F7: since Paddle 2.5 indexing a 1-D tensor gives a 0-D tensor (``paddle.shape(rois)[0]``,
    ``bbox_num[i]``, ``scale_factor[i][0]``); ppdet 2.6.0 still concatenates such values, which Paddle 2.6 and 3
    refuse: ``ValueError: (InvalidArgument) The axis is expected to be in range of [0, 0), but got 0``. Every
    two-stage detector dies in its first step (``RPNHead._gen_proposal``, ``generate_proposal_target``,
    ``CascadeHead._get_rois_from_bbox``) and in evaluation (``BBoxPostProcess.get_pred``); TOOD, Deformable
    DETR and DINO build shapes that way. Here those modules' global ``paddle`` becomes a view of paddle whose
    ``concat`` takes 0-D tensors as 1-element ones (``concat_0d_as_1d``), what upstream's slices give.
    F14, the same under Paddle 3's export: to_static turns ``RPNHead._gen_proposal``'s per-image loop into a while
    loop whose list of 0-D counts is a PIR tensor array, which ppdet's concat joins into a 0-D ``rois_num``; then
    ``RCNNBox``'s ``rois_num[idx]`` (ppdet/modeling/layers.py:476) stops the export of every Faster/Cascade R-CNN:
    ``ValueError: (InvalidArgument) The axis value should be less than the rank of input``. The same ``concat``
    stacks such an array into the 1-D counts. Returns the modules it patched now."""
    import importlib

    patched = []
    for name in ZERO_DIM_MODULES:
        module = importlib.import_module(name)
        if not is_ppdet_fix(module.paddle):
            module.paddle = _ModuleView(module.paddle, concat=concat_0d_as_1d)
            patched.append(f"{name.rsplit('.', 1)[-1]}.paddle.concat")
    return patched


@contextlib.contextmanager
def one_element_tensor_index() -> Iterator[None]:
    """Within the block, ``range(t)``, ``list[t]`` and ``operator.index(t)`` take a 1-element integer tensor of
    any rank, as Paddle 2.6 does with numpy 1.x. Paddle 3.3.1's ``Tensor.__index__`` returns ``int(np.array(t))``,
    which numpy >= 2.4 refuses for a 1-D array (``TypeError: only 0-dimensional arrays can be converted to Python
    scalars``)."""
    import paddle

    tensor = paddle.Tensor
    original = tensor.__index__

    def index(var: Any) -> int:
        if len(var.shape) == 1 and var.shape[0] == 1:
            var = var.reshape([])
        return original(var)

    tensor.__index__ = index
    try:
        yield
    finally:
        tensor.__index__ = original


def fix_rpn_batch_size_index() -> list[str]:
    """F8: ppdet 2.6.0's ``RPNHead._gen_proposal`` (ppdet/modeling/proposal_generator/rpn_head.py:195-199) loops
    ``for i in range(batch_size)`` over ``batch_size = paddle.slice(paddle.shape(im_shape), [0], [0], [1])``, a
    shape-[1] tensor; on Paddle 3 with numpy >= 2.4 every Faster/Cascade R-CNN training dies in its first step with
    ``TypeError: only 0-dimensional arrays can be converted to Python scalars``. Here the method runs inside
    ``one_element_tensor_index``. Returns the names it patched now (empty when already patched)."""
    from ppdet.modeling.proposal_generator.rpn_head import RPNHead

    original = RPNHead._gen_proposal
    if is_ppdet_fix(original):
        return []

    def _gen_proposal(*args: Any, **kwargs: Any) -> Any:
        with one_element_tensor_index():
            return original(*args, **kwargs)

    RPNHead._gen_proposal = _mark_fixed(_gen_proposal, original)
    return ["RPNHead._gen_proposal"]


def fix_ssd_hard_example_mining() -> list[str]:
    """F9: ppdet 2.6.0's ``SSDLoss._mine_hard_example`` (ppdet/modeling/losses/ssd_loss.py:127) compares the
    loss ranks, an int64 ``argsort``, with float32 negative counts: ``idx_rank < num_negs``. Paddle 2.x promoted;
    Paddle 3 raises ``TypeError: (InvalidType) Type promotion only support calculations between floating-point
    numbers ... x: int64, y: float32`` in every SSD training step. Here the method is replaced by the same
    mining, with the counts cast to the ranks' int64 as Paddle 2.x did: per image, the negatives (anchors matched
    to the background) ranked by loss, largest first, are kept while their rank is below ``neg_pos_ratio`` x the
    image's positives (at most every anchor; ``mine_neg_ratio`` x the anchors, truncated, when it has none), and
    every positive is kept. Returns the names it
    patched now (empty when already patched)."""
    import paddle
    from ppdet.modeling.losses.ssd_loss import SSDLoss

    original = SSDLoss._mine_hard_example
    if is_ppdet_fix(original):
        return []

    def _mine_hard_example(self: Any, conf_loss: Any, targets_label: Any, bg_index: int,
                           mine_neg_ratio: float = 0.01) -> Any:
        pos = (targets_label != bg_index).astype(conf_loss.dtype)
        neg = (targets_label == bg_index).astype(conf_loss.dtype)
        anchors = pos.shape[1]
        rank = (conf_loss.detach() * neg).argsort(axis=1, descending=True).argsort(axis=1)
        wanted = paddle.clip(pos.sum(axis=1, keepdim=True) * self.neg_pos_ratio, max=anchors)
        wanted = paddle.where(wanted > 0, wanted, paddle.full_like(wanted, anchors * mine_neg_ratio))
        # Paddle 2.x compared in the ranks' int64, truncating the counts: so does this
        return ((rank < wanted.astype(rank.dtype)).astype(conf_loss.dtype) + pos).astype("bool")

    SSDLoss._mine_hard_example = _mark_fixed(_mine_hard_example, original)
    return ["SSDLoss._mine_hard_example"]


def reshape_with_newshape(a: Any, shape: Any = None, *args: Any, newshape: Any = None, **kwargs: Any) -> Any:
    """``numpy.reshape`` that also takes the shape as ``newshape=``, the keyword numpy 2.4 removed."""
    import numpy

    return numpy.reshape(a, shape if newshape is None else newshape, *args, **kwargs)


def fix_numpy_reshape_newshape() -> list[str]:
    """F10: ppdet 2.6.0's ``Gt2FCOSTarget`` (ppdet/data/transform/batch_operators.py:362-487) calls
    ``np.reshape(x, newshape=...)``; numpy 2.4 (Paddle 3's stack) removed that keyword: ``TypeError: reshape() got
    an unexpected keyword argument 'newshape'`` in FCOS's first batch. Here that module's ``np`` becomes a view of
    numpy whose ``reshape`` takes it (``reshape_with_newshape``). Due wherever numpy's reshape lacks the keyword,
    whatever the Paddle. Returns the module it patched now (empty when already patched or not due)."""
    import inspect

    import numpy
    from ppdet.data.transform import batch_operators

    if "newshape" in inspect.signature(numpy.reshape).parameters or is_ppdet_fix(batch_operators.np):
        return []
    batch_operators.np = _ModuleView(batch_operators.np, reshape=reshape_with_newshape)
    return ["batch_operators.np.reshape"]


def fix_quality_focal_loss_mask() -> list[str]:
    """F11: ppdet 2.6.0's ``quality_focal_loss`` (ppdet/modeling/losses/gfocal_loss.py:78, GFL's
    QualityFocalLoss) multiplies float32 losses by a bool mask of the positives (``loss * logical_not(pos_mask) +
    loss_pos * pos_mask``). Paddle 2.x promoted; Paddle 3 raises ``TypeError: (InvalidType) Type promotion only
    support calculations between floating-point numbers ... x: float32, y: bool`` in GFL's first step. Here the
    module's function (``QualityFocalLoss.forward`` looks it up there at call time) is replaced by the same loss
    with a float32 mask: every (anchor, class) pair is supervised towards quality 0 with weight sigmoid(pred) **
    beta, except each positive anchor's own class, supervised towards its quality score with weight
    |score - sigmoid(pred)| ** beta; summed over classes. Returns the names it patched now (empty when already
    patched)."""
    import paddle
    import paddle.nn.functional as F
    from ppdet.modeling.losses import gfocal_loss

    original = gfocal_loss.quality_focal_loss
    if is_ppdet_fix(original):
        return []

    def quality_focal_loss(pred: Any, target: Any, beta: float = 2.0, use_sigmoid: bool = True) -> Any:
        label, score = target
        bce = F.binary_cross_entropy_with_logits if use_sigmoid else F.binary_cross_entropy
        prob = F.sigmoid(pred) if use_sigmoid else pred
        loss = bce(pred, paddle.zeros(pred.shape, dtype="float32"), reduction="none") * prob.pow(beta)
        classes = pred.shape[1]
        # 1 at (anchor, its class) for anchors with a class in [0, classes); the background, ``classes``, gets none
        valid = (label >= 0).astype("float32").unsqueeze(-1)
        mask = F.one_hot(label.clip(0, classes), classes + 1)[:, :classes] * valid
        if float(mask.sum()) == 0:
            return loss.sum(axis=1)
        score = score.unsqueeze(-1).expand([-1, classes]).cast("float32")
        loss_pos = bce(pred, score, reduction="none") * (score - prob).abs().pow(beta)
        return (loss * (1.0 - mask) + loss_pos * mask).sum(axis=1)

    gfocal_loss.quality_focal_loss = _mark_fixed(quality_focal_loss, original)
    return ["gfocal_loss.quality_focal_loss"]


def fix_deformable_attention_offsets() -> list[str]:
    """F12: ppdet 2.6.0's ``MSDeformableAttention.forward`` (ppdet/modeling/transformers/deformable_transformer.py:142,
    Deformable DETR's and DINO's attention) divides float32 sampling offsets by the levels' sizes, an int64 tensor
    (``sampling_offsets / offset_normalizer``). Paddle 2.x promoted; Paddle 3 raises ``TypeError: (InvalidType) Type
    promotion only support calculations between floating-point numbers ... x: float32, y: int64`` in the first
    step. Here the method gets the sizes as float32, and its sampling core (``ms_deformable_attn_core``, which
    splits the values by them) still gets the int64 ones, for that call. Returns the names it patched now."""
    import functools
    import inspect

    from ppdet.modeling.transformers.deformable_transformer import MSDeformableAttention

    original = MSDeformableAttention.forward
    if is_ppdet_fix(original):
        return []
    signature = inspect.signature(original)

    def core_with_int_sizes(core: Callable, sizes: Any, value: Any, _float_sizes: Any, *rest: Any) -> Any:
        return core(value, sizes, *rest)

    def forward(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        layer, sizes = bound.arguments["self"], bound.arguments["value_spatial_shapes"]
        if "int" not in str(sizes.dtype):
            return original(*args, **kwargs)
        core = layer.ms_deformable_attn_core
        bound.arguments["value_spatial_shapes"] = sizes.astype(bound.arguments["query"].dtype)
        layer.ms_deformable_attn_core = functools.partial(core_with_int_sizes, core, sizes)
        try:
            return original(*bound.args, **bound.kwargs)
        finally:
            layer.ms_deformable_attn_core = core

    MSDeformableAttention.forward = _mark_fixed(forward, original)
    return ["MSDeformableAttention.forward"]


@contextlib.contextmanager
def bool_times_float_promotes() -> Iterator[None]:
    """Within the block, ``a * b`` of a bool tensor and a tensor of another dtype casts the bool one to the other's
    dtype first, as Paddle 2.x did; Paddle 3 raises ``TypeError: (InvalidType) Type promotion only support
    calculations between floating-point numbers ... x: bool, y: float32``."""
    import paddle

    tensor = paddle.Tensor
    mul, rmul = tensor.__mul__, tensor.__rmul__

    def promoted(op: Callable) -> Callable:
        def times(a: Any, b: Any) -> Any:
            if isinstance(b, tensor) and (a.dtype == paddle.bool) != (b.dtype == paddle.bool):
                a, b = (a.astype(b.dtype), b) if a.dtype == paddle.bool else (a, b.astype(a.dtype))
            return op(a, b)

        return times

    tensor.__mul__, tensor.__rmul__ = promoted(mul), promoted(rmul)
    try:
        yield
    finally:
        tensor.__mul__, tensor.__rmul__ = mul, rmul


def fix_dino_denoising_mask() -> list[str]:
    """F13: ppdet 2.6.0's ``get_contrastive_denoising_training_group`` (ppdet/modeling/transformers/utils.py:175,
    DINO's denoising queries) multiplies a bool mask (``paddle.rand(...) < ratio``) by float32 ``pad_gt_mask``;
    Paddle 3 raises ``TypeError: (InvalidType) Type promotion only support calculations between floating-point
    numbers ... x: bool, y: float32`` in DINO's first step. Here the function runs inside
    ``bool_times_float_promotes``, where it is looked up: ``ppdet.modeling.transformers.utils`` and the name
    ``dino_transformer`` imported from it. Returns the names it patched now (empty when already patched)."""
    from ppdet.modeling.transformers import dino_transformer, utils

    original = utils.get_contrastive_denoising_training_group
    if is_ppdet_fix(original):
        return []

    def get_contrastive_denoising_training_group(*args: Any, **kwargs: Any) -> Any:
        with bool_times_float_promotes():
            return original(*args, **kwargs)

    fixed = _mark_fixed(get_contrastive_denoising_training_group, original)
    utils.get_contrastive_denoising_training_group = fixed
    dino_transformer.get_contrastive_denoising_training_group = fixed
    return ["get_contrastive_denoising_training_group"]


def fix_rcnn_get_pred_in_export() -> list[str]:
    """F15: ppdet 2.6.0's ``BBoxPostProcess.get_pred`` (ppdet/modeling/post_process.py:123-130, every Faster and
    Cascade R-CNN's last step) picks each image's count as ``fake_bbox_num`` (shape [1]) or ``bbox_num[i]`` (0-D
    since Paddle 2.5) in an ``if`` that Paddle 3's export turns into a ``cond``, whose branches must agree:
    ``EnforceNotMet: Does not support rank inconsistency: rank1=0, rank2=1``. PaddleDetection's 79f77ba (release/2.6,
    after paddledet 2.6.0) slices ``bbox_num[i:i + 1]`` there; on Paddle 2.6 the program builds but its
    ``tensor_array_to_tensor`` of those counts fails when run (``The axis is expected to be in range of [0, 0)``).
    Here, while a static program is built (an export) only, the method takes ppdet's own ``export_onnx`` path,
    which skips that per-image loop: the
    program then serves batch 1 (PaddleDetection's deploy runs batch 1 by default) and an image without a detection
    gives ``bbox_num`` 0 instead of ppdet's placeholder box. Training and evaluation (dygraph) are untouched.
    Returns the names it patched now (empty when already patched)."""
    import paddle
    from ppdet.modeling.post_process import BBoxPostProcess

    original = BBoxPostProcess.get_pred
    if is_ppdet_fix(original):
        return []

    def get_pred(self: Any, *args: Any, **kwargs: Any) -> Any:
        if paddle.in_dynamic_mode() or self.export_onnx:
            return original(self, *args, **kwargs)
        self.export_onnx = True
        try:
            return original(self, *args, **kwargs)
        finally:
            self.export_onnx = False

    # run as Python, not converted: to_static would convert the original's source (the wrapper's __wrapped__)
    BBoxPostProcess.get_pred = paddle.jit.not_to_static(_mark_fixed(get_pred, original))
    return ["BBoxPostProcess.get_pred"]


def fix_old_op_builders_under_pir() -> list[str]:
    """F16: ppdet 2.6.0's ``ops.prior_box`` (SSD's anchors, ppdet/modeling/ops.py:473) and ``ops.matrix_nms``
    (PP-YOLO's NMS, ops.py:761) build their static-graph ops with the old program API, as F3's multiclass_nms
    does; Paddle 3's export stops: ``TypeError: The type of '%Input' in operator prior_box should be one of [str,
    bytes, Variable]`` (and ``'%BBoxes' in operator matrix_nms``). Paddle's own ``paddle.vision.ops.prior_box``
    and ``matrix_nms`` take the same arguments in the same order and build the phi ops under PIR; here, in PIR
    static mode only, ppdet's functions hand over to them (ppdet's callers look them up as ``ops.<name>`` at call
    time: layers.py:423, 592); everywhere else ppdet's originals run. ppdet's prior_box reads a ``max_sizes``
    whose first value is not positive as none, and so does the hand-over. Returns the names it patched now."""
    import inspect

    import paddle
    from ppdet.modeling import ops

    patched = []
    for name in ("prior_box", "matrix_nms"):
        original = getattr(ops, name)
        if is_ppdet_fix(original):
            continue
        ours = getattr(paddle.vision.ops, name)

        def handed_over(*args: Any, _original: Callable = original, _ours: Callable = ours, _name: str = name,
                        **kwargs: Any) -> Any:
            if not in_pir_static_mode():
                return _original(*args, **kwargs)
            if _name == "prior_box":
                bound = inspect.signature(_original).bind(*args, **kwargs)
                sizes = bound.arguments.get("max_sizes")
                sizes = [sizes] if sizes is not None and not isinstance(sizes, (list, tuple)) else sizes
                bound.arguments["max_sizes"] = list(sizes) if sizes and sizes[0] > 0 else None
                return _ours(*bound.args, **bound.kwargs)
            return _ours(*args, **kwargs)

        setattr(ops, name, paddle.jit.not_to_static(_mark_fixed(handed_over, original)))
        patched.append(f"ops.{name}")
    return patched


# (the Paddle version from which a fix is due, the fix): ppdet 2.6.0 was written for Paddle 2.4, before 0-D tensors
_PPDET_FIXES: tuple[tuple[tuple[int, int], Callable[[], list[str]]], ...] = (
    ((0, 0), fix_numpy_reshape_newshape), ((2, 5), fix_concat_of_0d_shapes),
    ((3, 0), fix_assigner_int32_labels), ((3, 0), fix_multiclass_nms_under_pir), ((3, 0), fix_rpn_batch_size_index),
    ((3, 0), fix_ssd_hard_example_mining), ((3, 0), fix_quality_focal_loss_mask),
    ((3, 0), fix_deformable_attention_offsets), ((3, 0), fix_dino_denoising_mask),
    ((2, 5), fix_rcnn_get_pred_in_export), ((3, 0), fix_old_op_builders_under_pir))


def apply_ppdet_fixes() -> list[str]:
    """Apply every fix for ppdet 2.6.0 (see ``fix_*`` above) that the installed Paddle and numpy need: F7 from
    Paddle 2.5 (both supported stacks), F10 with numpy >= 2.4, the others from Paddle 3; anything else about ppdet
    is left untouched. Idempotent. Returns what it patched now."""
    version = tuple(installed_version() or ())
    return [name for since, fix in _PPDET_FIXES if version[:2] >= since for name in fix()]


@contextlib.contextmanager
def full_graph_to_static() -> Iterator[None]:
    """ppdet 2.6.0's exporter reads ``static_model.forward.main_program``, which Paddle 2.6's default
    symbolic (SOT) mode refuses ("Can't call main_program when full_graph=False"); the AST mode
    that ppdet was written for is chosen by Paddle's ENABLE_FALL_BACK switch, read at call time
    (paddle/jit/api.py, Paddle 2.6.2)."""
    old = os.environ.get(PADDLE_SOT_SWITCH)
    os.environ[PADDLE_SOT_SWITCH] = "False"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PADDLE_SOT_SWITCH, None)
        else:
            os.environ[PADDLE_SOT_SWITCH] = old


def exported_program_name(version: tuple[int, ...] | None = None) -> str:
    """The file holding the program that ppdet's exporter writes with ``paddle.jit.save`` (beside
    ``model.pdiparams`` and ppdet's ``infer_cfg.yml``) on Paddle ``version`` (default: the installed one):
    Paddle 2.6.2 saves the ProgramDesc as ``model.pdmodel``; Paddle 3, whose to_static builds PIR programs
    (its default, FLAGS_enable_pir_api), saves ``model.json`` instead."""
    return "model.json" if paddle3(version) else "model.pdmodel"


LEGACY_PROGRAM = "model.pdmodel"   # the ProgramDesc PaddleDetection release/2.6's deploy/python/infer.py reads
# The models Paddle 3.3.1 writes as the old program, by architecture and the head it must have (several families
# share ppdet's YOLOv3 architecture). Measured 2026-12-02, Paddle 3.3.1, Python 3.11: every family CI trains, built
# untrained and exported with the old program forced, each in its own process; "passes" = model.pdmodel written,
# model.pdiparams byte-identical to model.json's, Paddle Inference 3.3.1 gives model.json's boxes (classes and count
# equal, scores within 7e-6, coordinates within 1e-3 px of 96), and PaddleDetection release/2.6's deploy/python/infer.py
# runs on the directory.
#   passes:  YOLOv3 with YOLOv3Head (YOLOv3 itself, PP-YOLO: neither calls the ops below in its forward)
#   fails with an error, so is not tried (export_model's INFO line names model.json's readers): Paddle 3.3.1's
#            generated ops take PIR values only, so the old program cannot hold them ("sigmoid(): argument
#            (position 1) must be Value, but got Variable"): sigmoid: YOLOX, YOLOv5, YOLOv8, GFL, TOOD; matmul:
#            YOLO11, YOLO26; exp: SSD; logical_not: RetinaNet, Faster/Cascade R-CNN; sin: DETR; and FCOS: "No
#            Input(Y) found for ElementwiseOp"
#   crashes the process (SIGSEGV, "Paddle static graph(PIR) not support input out tensor"), after model.json is
#            written: PP-YOLOE(+) (YOLOv3 with PPYOLOEHead), RT-DETR
#   not exported at all on Paddle 3 (tests/test_ppdet_export.py): PicoDet, Deformable DETR, DINO
LEGACY_PROGRAM_MODELS = {"YOLOv3": "YOLOv3Head"}


def writes_legacy_program(cfg: Any) -> bool:
    """Whether a model of config ``cfg`` (ppdet's loaded config, or a dict of the same keys) is one Paddle 3
    writes as the old program too (LEGACY_PROGRAM_MODELS): its architecture is listed and one of the
    architecture's parts (backbone, neck, head ...) is the head listed with it."""
    arch = cfg.get("architecture")
    head = LEGACY_PROGRAM_MODELS.get(arch)
    parts = cfg.get(arch) if head is not None else None
    return parts is not None and head in [parts[key] for key in parts]


def legacy_program_guard() -> Any:
    """Paddle 3: a context in which ``paddle.jit.to_static`` and ``paddle.jit.save`` build and write the old
    ProgramDesc (``model.pdmodel``) instead of a PIR ``model.json`` (``paddle.pir_utils.OldIrGuard``, the switch
    Paddle's own tests use). Only the export goes inside it: ppdet's Trainer built inside fails for ``use_ema``
    configs (ModelEMA's ``paddle.zeros_like`` refuses eager tensors there). Which models Paddle 3.3.1 writes this
    way, and why the others fail, is LEGACY_PROGRAM_MODELS. Paddle 2.6 writes the old program anyway: a no-op."""
    import paddle

    guard = getattr(getattr(paddle, "pir_utils", None), "OldIrGuard", None)
    return guard() if paddle3() and guard is not None else contextlib.nullcontext()


def cpu_predictor_config(model_dir: Path | str, threads: int = 1) -> Any:
    """A ``paddle.inference.Config`` that runs an exported model (``exported_program_name()`` and
    ``model.pdiparams`` in ``model_dir``) on the CPU. Paddle 3.3.1's oneDNN executor cannot run the necks'
    ``nearest_interp`` ("ConvertPirAttribute2RuntimeAttribute not support [pir::ArrayAttribute<pir::DoubleAttribute>]",
    Paddle issue #79749, open), so oneDNN is switched off on Paddle 3; Paddle 2.6.2 keeps its default."""
    import paddle.inference

    model_dir = Path(model_dir)
    config = paddle.inference.Config(str(model_dir / exported_program_name()), str(model_dir / "model.pdiparams"))
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(threads)
    if paddle3():
        config.disable_mkldnn()
    return config


# ONNX export through paddle2onnx: which release reads which Paddle's programs, and how each is called.

def paddle2onnx_wanted(version: tuple[int, ...] | None = None) -> str:
    """The paddle2onnx release that converts what Paddle ``version`` (default: the installed one) exports, as a
    pip requirement (setup.py's ``export`` extra pins the same): 1.3.1 reads Paddle 2.6's ``model.pdmodel``
    (2.x imports ``paddle.decomposition``, which Paddle 2.6 lacks); 2.1.0 reads Paddle 3's PIR ``model.json``
    (1.x knows no PIR)."""
    return "paddle2onnx==2.1.0" if paddle3(version) else "paddle2onnx==1.3.1"


def paddle2onnx_fits(p2o_version: tuple[int, ...], version: tuple[int, ...] | None = None) -> bool:
    """Whether paddle2onnx ``p2o_version`` reads the programs of Paddle ``version`` (see paddle2onnx_wanted)."""
    return (tuple(p2o_version) >= (2,)) == paddle3(version)


def pir_interp_scale_as_float(program: dict) -> int:
    """F4: Paddle 3.3.1 writes the ``scale`` attribute of its interpolation ops (the necks' nearest upsampling)
    into a PIR ``model.json`` as an array of doubles (type ``0.a_f64``); paddle2onnx 2.1.0 accepts floats only
    and stops: ``(Unimplemented) the 0th elementwise MUST be ir::FloatAttribute`` (pir_parser.cc:814); Paddle
    issue #79749 is the same attribute breaking the oneDNN predictor. Here, in a parsed ``model.json``, those
    elements become floats (``0.a_f32``; the values, 2.0, are exact in either). Returns how many changed."""
    changed = 0
    stack: list[Any] = [program]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if str(node.get("#", "")).endswith("_interp"):
                for attr in node.get("A", []):
                    if isinstance(attr, dict) and attr.get("N") == "scale":
                        for item in attr.get("AT", {}).get("D", []):
                            if isinstance(item, dict) and item.get("#") == "0.a_f64":
                                item["#"] = "0.a_f32"
                                changed += 1
            stack.extend(node.values())
    return changed


def paddle_to_onnx(model_dir: Path | str, opset: int) -> bytes:
    """Convert the inference model in ``model_dir`` (``exported_program_name()`` + ``model.pdiparams``) to an
    ONNX model with the installed paddle2onnx. 1.3.1 raises on failure; 2.1.0's ``export`` logs the error and
    calls ``sys.exit(-1)``, so any exception, that exit or an empty result becomes one RuntimeError here. 2.1.0 is
    called without ``save_file``: given one, it would run polygraphy, which may pip-install packages at run time."""
    import json
    import tempfile

    import paddle2onnx

    model_dir = Path(model_dir)
    program = model_dir / exported_program_name()
    with tempfile.TemporaryDirectory(prefix="ppmulti-onnx-") as tmp:
        if program.suffix == ".json":
            parsed = json.loads(program.read_text())
            if pir_interp_scale_as_float(parsed):
                program = Path(tmp) / program.name
                program.write_text(json.dumps(parsed))
        try:
            data = paddle2onnx.export(str(program), str(model_dir / "model.pdiparams"), save_file=None,
                                      opset_version=opset, auto_upgrade_opset=True, verbose=False,
                                      enable_onnx_checker=True)
        except (Exception, SystemExit) as exc:   # noqa: BLE001 - its C++ errors, and 2.1.0's sys.exit(-1) after them
            raise RuntimeError(f"paddle2onnx {paddle2onnx.__version__} could not convert {program}: {exc}") from exc
    if not data:
        raise RuntimeError(f"paddle2onnx {paddle2onnx.__version__} could not convert {program} (see its log above)")
    return data


def paddle_half_unavailable(version: tuple[int, ...] | None = None, cuda: bool | None = None) -> str | None:
    """Why this Paddle (``version``, a CUDA build or not; default: the installed one) cannot write a float16
    inference model, or None where ``paddle_model_to_half`` can. Paddle 3 writes PIR programs (``model.json``),
    which its ``convert_to_mixed_precision`` cannot parse ("Failed to parse program_desc"); its GPU predictor
    turns a float32 model to FP16 as it loads it. Paddle 2.6's converts ``model.pdmodel`` for a GPU only, and only
    a CUDA build does it (a CPU build logs an error and writes the weights float32); no CPU build has float16
    kernels for conv2d, sigmoid or batch_norm, so nothing float16 runs on a CPU (both seen, 2.6.2 and 3.3.1)."""
    if paddle3(version):
        return ("Paddle 3 keeps inference models float32 (model.json) and runs them in FP16 on a GPU as the "
                "predictor loads them: paddle.inference.Config.enable_use_gpu(256, 0, PrecisionType.Half)")
    if cuda is None:
        import paddle

        cuda = paddle.is_compiled_with_cuda()
    if not cuda:
        return ("Paddle 2.6 converts a model to float16 only in a GPU build (paddlepaddle-gpu), for a GPU; "
                "Paddle's CPU kernels have no float16 convolution")
    return None


def paddle_model_to_half(model_dir: Path | str) -> None:
    """Rewrite the Paddle 2.6 inference model in ``model_dir`` (``model.pdmodel`` + ``model.pdiparams``) in
    float16 for a GPU with ``paddle.inference.convert_to_mixed_precision`` (CUDA builds; see
    ``paddle_half_unavailable``): float16 weights and ops where the GPU has float16 kernels, float32 inputs and
    outputs (``keep_io_types``), so the same preprocessing feeds it."""
    import tempfile

    import paddle.inference as pi

    model_dir = Path(model_dir)
    names = (exported_program_name(), "model.pdiparams")
    with tempfile.TemporaryDirectory(prefix=".half-", dir=model_dir) as tmp:
        pi.convert_to_mixed_precision(*(str(model_dir / n) for n in names), *(str(Path(tmp) / n) for n in names),
                                      pi.PrecisionType.Half, pi.PlaceType.GPU, True)
        for name in names:
            os.replace(Path(tmp) / name, model_dir / name)


def set_num_threads(threads: int) -> None:
    """OpenMP and MKL threads of this process: Paddle 2.6.2 has no public API for it, only
    ``paddle.base.core.set_num_threads`` (``paddle.fluid.core`` before Paddle 2.5)."""
    import paddle

    paddle.base.core.set_num_threads(threads)



def quiet_opencv() -> None:
    """Silence OpenCV's and its FFmpeg's own log lines (a missing webcam, a refused connection), so that a source
    that cannot be opened is one line of ppmulti's. OpenCV 4.x has ``cv2.setLogLevel``, 5.x
    ``cv2.utils.logging.setLogLevel``; FFmpeg's level is an environment variable read when a capture opens (a user's
    own value is kept)."""
    import cv2

    from ppmulti.common.envvars import OPENCV_FFMPEG_LOGLEVEL

    os.environ.setdefault(OPENCV_FFMPEG_LOGLEVEL, "-8")
    set_level = getattr(cv2, "setLogLevel", None) or cv2.utils.logging.setLogLevel
    set_level(0)   # LOG_LEVEL_SILENT in both

def set_defined_flags(flags: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Set the Paddle flags this build defines: (set, absent). The cuDNN flags exist only in CUDA builds, and
    ``FLAGS_cpu_deterministic`` only before Paddle 3; ``paddle.set_flags`` raises ValueError for a flag it lacks."""
    import paddle

    done, absent = [], []
    for name, value in flags.items():
        try:
            paddle.set_flags({name: value})
        except ValueError:
            absent.append(name)
        else:
            done.append(name)
    return done, absent


def batch_sampler(loader: Any) -> Any:
    """The batch sampler of a ppdet reader (TrainReader, EvalReader ...), or None. ppdet 2.6.0's
    ``BaseDataLoader`` (ppdet/data/reader.py) keeps the sampler it built or was given in the private
    ``_batch_sampler``; the ``paddle.io.DataLoader`` it wraps calls its own public ``batch_sampler``."""
    return getattr(loader, "_batch_sampler", None)


def set_reader_num_classes(loader: Any, num_classes: int) -> list[str]:
    """A built ppdet reader's transforms told the new ``num_classes``, as its build told them the old one: ppdet
    2.6.0's ``Compose`` and ``BatchCompose`` (ppdet/data/reader.py:43-73) give every transform that has a
    ``num_classes`` attribute the reader's value when they build it, e.g. ``Gt2YoloTarget``'s targets (YOLOv3,
    PP-YOLO: one channel per class) and ``Gt2GFLTarget``'s background label (GFL). The reader is built before
    the data's classes are known (building it parses the annotations), so a ``num_classes`` taken from the data
    afterwards reaches them here; YOLOv3 failed otherwise in its first step on both stacks (``Input(X) and
    Input(Label) shall have the same shape``: 3 classes against 80). Returns the transforms it changed."""
    changed = []
    for compose in (getattr(loader, "_sample_transforms", None), getattr(loader, "_batch_transforms", None)):
        for op in getattr(compose, "transforms_cls", None) or ():
            if hasattr(op, "num_classes") and op.num_classes != num_classes:
                op.num_classes = num_classes
                changed.append(type(op).__name__)
    return changed


def epoch_batches(loader: Any) -> Any:
    """An iterator of one epoch's batches, made now, after the trainer's ``sampler.set_epoch``.

    ppdet's reader (``BaseDataLoader``) makes its first iterator when it is built and each next one when the
    last one ends, and Paddle's iterators start drawing batch indices as soon as they are made (at once with
    workers, in a thread without, on Paddle 2.6 and 3.x alike): a ``set_epoch`` after that reaches the
    following epoch, or, without workers, whichever epoch a race picks, so ranks could shuffle (or draw
    --image-weights) by different epochs. So each epoch iterates the reader's DataLoader through a new
    iterator; the one ppdet made ahead is stopped. Other loaders are iterated as they are."""
    dataloader = getattr(loader, "dataloader", None)
    if dataloader is None or not hasattr(loader, "loader"):
        return iter(loader)
    _drop_made_ahead(loader)
    return iter(dataloader)


def _drop_made_ahead(reader: Any) -> None:
    """Stop the iterator ppdet's reader made ahead (in ``loader``) and leave an empty one: dropping it alone
    does not stop its workers, as its prefetching thread keeps it alive. Were the empty one read, ppdet would
    make a new one."""
    made = getattr(reader, "loader", None)
    if made is not None:
        close_batches(made)
        reader.loader = iter(())


def loader_like(reader: Any, dataset: Any, batch_sampler: Any) -> Any:
    """A ``paddle.io.DataLoader`` built as a ppdet reader's (its collate function, workers, shared memory,
    prefetch) over another dataset and batch sampler (data.feed's run-long iterator). ppdet's reader keeps
    its DataLoader in ``dataloader`` and made an iterator ahead, which is stopped here.
    The DataLoader's public attributes are the same on Paddle 2.6 and 3.x."""
    import paddle

    made = reader.dataloader
    _drop_made_ahead(reader)
    return paddle.io.DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=made.collate_fn,
                                num_workers=made.num_workers, return_list=made.return_list,
                                use_shared_memory=made.use_shared_memory, prefetch_factor=made.prefetch_factor,
                                timeout=made.timeout, worker_init_fn=made.worker_init_fn)


def close_batches(batches: Any) -> None:
    """Stop a DataLoader iterator's workers and prefetching thread now, not when it is collected. Paddle 2.6's
    and 3.x's iterators (single- and multi-process) both shut down in ``_try_shutdown_all``, which their
    ``__del__`` calls. Batches the workers had made ahead and nobody took stay in /dev/shm as
    ``paddle_<worker pid>_*`` files; once the workers (``_workers``, both versions) have ended, they are removed."""
    from ppmulti.common.shm import remove_paddle_shm_of

    shutdown = getattr(batches, "_try_shutdown_all", None)
    workers = list(getattr(batches, "_workers", None) or [])
    if callable(shutdown):
        shutdown()
    ended = {w.pid for w in workers if w.pid is not None and not w.is_alive()}
    if ended:
        remove_paddle_shm_of(ended)


def distributed_model(model: Any, find_unused_parameters: bool = False) -> Any:
    """``fleet.distributed_model(model)`` with PaddleDetection's ``find_unused_parameters`` config key honoured.
    Fleet's collective data-parallel wrapper is a ``paddle.DataParallel`` built with the
    ``find_unused_parameters`` of the strategy ``fleet.init`` was given (fleet/model.py, Paddle 2.6 and 3.x), which
    ppmulti builds before the config is read; the strategy fleet keeps is ``fleet.fleet._user_defined_strategy``.
    A model whose parameters go unused in some steps only (Cascade R-CNN's later stages without positive RoIs)
    needs it, or Paddle's reducer stops with "parameter ... has been ready before"."""
    from paddle.distributed import fleet

    strategy = getattr(fleet.fleet, "_user_defined_strategy", None)
    if strategy is not None:
        strategy.find_unused_parameters = bool(find_unused_parameters)
    return fleet.distributed_model(model)


def no_grad_sync(model: Any) -> Any:
    """A context in which backward passes of ``model`` add to the local gradients without all-reducing them
    (the micro-steps of a gradient accumulation): ``paddle.DataParallel.no_sync()``, which
    ``fleet.distributed_model`` returns in collective data-parallel mode (the same on Paddle 2.6 and 3.x);
    a model not wrapped for several ranks never syncs, so nothing to do."""
    import contextlib

    no_sync = getattr(model, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()


def _inner_optimizer(optimizer: Any) -> Any:
    """The Paddle optimizer inside fleet's ``HybridParallelOptimizer`` (``_inner_opt``; itself otherwise)."""
    return getattr(optimizer, "_inner_opt", optimizer)


def optimizer_param_groups(optimizer: Any) -> list[list[Any]]:
    """The parameters an optimizer updates, by group: one list, or one per ``param_groups`` entry (a config's
    ``OptimizerBuilder.optimizer.param_groups``); Paddle keeps them in ``_param_groups`` (2.6 and 3.x)."""
    groups = getattr(_inner_optimizer(optimizer), "_param_groups", None) or []
    if groups and isinstance(groups[0], dict):
        return [list(g["params"]) for g in groups]
    return [list(groups)]


def take_global_norm_clip(optimizer: Any) -> Any:
    """Take the ``ClipGradByGlobalNorm`` off a Paddle optimizer (ppdet's OptimizerBuilder puts it there for a
    config's ``clip_grad_by_norm``) and return it, or None. Paddle keeps it in ``_grad_clip`` and, with param
    groups, in each group's ``grad_clip`` (copied at construction); both are cleared, so that the optimizer's
    step does not clip a second time. The same attributes on Paddle 2.6 and 3.x."""
    import paddle

    inner = _inner_optimizer(optimizer)
    clip = getattr(inner, "_grad_clip", None)
    groups = getattr(inner, "_param_groups", None) or []
    group_clips = [g.get("grad_clip") for g in groups if isinstance(g, dict)]
    if not isinstance(clip, paddle.nn.ClipGradByGlobalNorm):
        clip = next((c for c in group_clips if isinstance(c, paddle.nn.ClipGradByGlobalNorm)), None)
    if clip is None:
        return None
    if inner._grad_clip is clip:
        inner._grad_clip = None
    for group in groups:
        if isinstance(group, dict) and group.get("grad_clip") is clip:
            group["grad_clip"] = None
    if isinstance(getattr(inner, "_default_dict", None), dict) and inner._default_dict.get("grad_clip") is clip:
        inner._default_dict["grad_clip"] = None   # groups added later take their defaults from here
    return clip


def usable_gpu_count() -> int:
    """CUDA devices this process can use; 0 on a CPU-only build, where Paddle 2.6.2's
    ``paddle.device.cuda.device_count()`` is asked only after ``paddle.is_compiled_with_cuda()``."""
    import paddle

    return paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0


def set_device(kind: str) -> None:
    """Run this process's tensors on ``"cpu"`` or ``"gpu"``. Paddle 2.6.2's ``paddle.set_device("gpu")``
    without an index takes the card from FLAGS_selected_gpus, which its launcher sets per worker, so a rank
    never names its card itself."""
    import paddle

    paddle.set_device(kind)


# BatchNorm and Conv2D keep what they were built with in private attributes, read again at every forward.

def set_batchnorm_eps_momentum(layer: Any, eps: float, momentum: float) -> None:
    """Change a built BatchNorm's epsilon and (Paddle-convention) momentum. Paddle 2.6.2's BatchNorm layers
    (``_BatchNormBase`` in paddle/nn/layer/norm.py, SyncBatchNorm included) take them only in the
    constructor and keep them in ``_epsilon`` / ``_momentum``, which every forward reads."""
    layer._epsilon = eps
    layer._momentum = momentum


def batchnorm_eps_momentum(layer: Any) -> tuple[float, float]:
    """(epsilon, momentum) a BatchNorm computes with; see ``set_batchnorm_eps_momentum``."""
    return layer._epsilon, layer._momentum


def batchnorm_state_names() -> tuple[str, str]:
    """The state-dict leaf names of a BatchNorm's running mean and variance: Paddle 2.6.2 registers them as
    the buffers ``_mean`` and ``_variance`` (PyTorch's ``running_mean`` / ``running_var``)."""
    return "_mean", "_variance"


def batchnorm_data_format(layer: Any) -> str:
    """The layout a BatchNorm normalises in ("NCHW", "NHWC", "NCL", ...): Paddle 2.6.2 keeps it in ``_data_format``."""
    return layer._data_format


def batchnorm_running_stats(layer: Any) -> tuple[Any, Any]:
    """A BatchNorm's running mean and variance tensors (the buffers named by ``batchnorm_state_names``)."""
    return layer._mean, layer._variance


def share_batchnorm_running_stats(src: Any, dst: Any) -> None:
    """Make BatchNorm ``dst`` keep its running statistics in ``src``'s tensors, as Paddle's own
    ``SyncBatchNorm.convert_sync_batchnorm`` hands them over (assigning the ``_mean`` / ``_variance`` buffers)."""
    dst._mean, dst._variance = src._mean, src._variance


@dataclass
class Conv2DFacts:
    """What a ``paddle.nn.Conv2D`` was built with, in the form its forward uses (Paddle 2.6.2's ``_ConvNd``)."""

    groups: int
    stride: list[int]
    dilation: list[int]
    padding: list[int]        # resolved: [h, w] when symmetric, 4 values per side otherwise, zeros for SAME/VALID
    padding_algorithm: str    # "EXPLICIT", "SAME" or "VALID"
    padding_mode: str         # "zeros", "reflect", "replicate" or "circular"
    data_format: str          # "NCHW" or "NHWC"


def conv2d_facts(layer: Any) -> Conv2DFacts:
    """A Conv2D's settings. Paddle 2.6.2 has no public getters: they live in the private ``_groups``,
    ``_stride``, ``_dilation``, ``_updated_padding``, ``_padding_algorithm``, ``_padding_mode`` and
    ``_data_format`` (paddle/nn/layer/conv.py); the constructor's ``padding`` argument is resolved into
    ``_updated_padding`` and ``_padding_algorithm`` there."""
    return Conv2DFacts(groups=layer._groups, stride=layer._stride, dilation=layer._dilation,
                       padding=layer._updated_padding, padding_algorithm=layer._padding_algorithm,
                       padding_mode=layer._padding_mode, data_format=layer._data_format)


# C++ custom ops: where Paddle's wheel keeps things, how its JIT builder is called, how dygraph runs an op.

def paddle_package_dir() -> Path | None:
    """Paddle's package directory, found without importing paddle (which takes seconds); None when absent."""
    import importlib.util

    spec = importlib.util.find_spec("paddle")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def paddle_build_id(package_dir: Path) -> bytes:
    """Bytes that differ between Paddle builds, to tag what was compiled against one: Paddle 2.6.2's wheel
    writes its version, commit, CUDA/cuDNN versions and MKL choice into ``paddle/version/__init__.py``
    (b"" for a build without that package)."""
    version = package_dir / "version"
    return (version / "__init__.py").read_bytes() if version.is_dir() else b""


def paddle_onednn_library(package_dir: Path) -> Path:
    """Where Paddle's wheel keeps the oneDNN it runs on: ``paddle/libs/libdnnl.so.3`` in 2.6.2 (oneDNN 3.2.1,
    no headers) and in 3.3.1. The path is not checked: a build without it is the caller's to report."""
    return package_dir / "libs" / "libdnnl.so.3"


def custom_op_library(build_dir: Path, name: str) -> Path:
    """Where ``build_custom_op(name, ..., build_dir)`` leaves the shared library: Paddle 2.6.2's
    ``paddle.utils.cpp_extension.load`` builds ``<build_directory>/<name>/<name>.so``."""
    return Path(build_dir) / name / f"{name}.so"


def build_custom_op(name: str, sources: list[str], build_dir: Path, include_dirs: list[str],
                    cflags: list[str], ldflags: list[str]) -> None:
    """Compile a C++ custom op and register it in this process with Paddle 2.6.2's JIT builder,
    ``paddle.utils.cpp_extension.load`` (setuptools and the system compiler; a compiler error arrives as
    RuntimeError carrying the compiler's output)."""
    from paddle.utils.cpp_extension import load

    load(name=name, sources=sources, build_directory=str(build_dir), extra_include_paths=include_dirs,
         extra_cxx_cflags=cflags, extra_ldflags=ldflags, verbose=False)


def register_custom_op_library(library: Path) -> list[str]:
    """Register the ops of an already built custom-op library in this process; returns their names. Paddle
    2.6.2: ``paddle.utils.cpp_extension.load_op_meta_info_and_register_op``, what the Python module that
    ``load`` generates calls on import."""
    from paddle.utils.cpp_extension import load_op_meta_info_and_register_op

    return list(load_op_meta_info_and_register_op(str(library)))


def custom_op_runner(op_name: str) -> Callable[..., list]:
    """``run(*inputs, *attributes) -> outputs`` for a registered custom op in dygraph mode: Paddle 2.6.2's
    generated wrapper calls ``paddle.base.core.eager._run_custom_op(name, *inputs, *attributes)``."""
    import functools

    from paddle.base import core

    return functools.partial(core.eager._run_custom_op, op_name)


# ppdet: what its Trainer and LearningRate read that ppdet offers no registry for.

def _momentum_optimizer(optimizer: Any) -> Any:
    """The ``paddle.optimizer.Momentum`` inside ``optimizer``, None for another kind: fleet's wrappers keep the
    optimizer they wrap as ``_inner_opt`` (Paddle 2.6 and 3.x)."""
    import paddle

    for _ in range(8):
        if optimizer is None or isinstance(optimizer, paddle.optimizer.Momentum):
            return optimizer
        optimizer = getattr(optimizer, "_inner_opt", None)
    return None


def optimizer_momentum(optimizer: Any) -> float | None:
    """The momentum of a Momentum optimizer (possibly wrapped by fleet), None for another kind. Paddle's
    Momentum keeps it in ``_momentum`` and reads it at every step (Paddle 2.6 and 3.x), so
    ``set_optimizer_momentum`` takes effect from the next step: YOLOv5's warmup sets it per batch
    (engine.hooks.warmup; tests/test_warmup.py shows the effect on both Paddles)."""
    if getattr(optimizer, "is_momentum_optimizer", False):   # ppmulti's MuSGD (engine.musgd_run): its own
        return float(optimizer.momentum)
    inner = _momentum_optimizer(optimizer)
    return None if inner is None else float(inner._momentum)


def set_optimizer_momentum(optimizer: Any, momentum: float) -> None:
    if getattr(optimizer, "is_momentum_optimizer", False):
        optimizer.momentum = float(momentum)
        return
    inner = _momentum_optimizer(optimizer)
    if inner is not None:
        inner._momentum = float(momentum)


def add_trainer_callbacks(trainer: Any, *callbacks: Any) -> None:
    """Add ``ppdet.engine.callbacks.Callback`` objects to a built ppdet Trainer, after its own. ppdet 2.6.0
    builds the Trainer's list (``_callbacks``, called through one ``_compose_callback``) in its constructor
    from the config; ``Trainer.register_callbacks`` appends and rebuilds the composite."""
    trainer.register_callbacks(list(callbacks))


def register_lr_scheduler(cls: type) -> None:
    """Make ``cls`` usable as ``LearningRate.schedulers: [{name: <cls name>, ...}]`` in a config. ppdet 2.6.0's
    ``LearningRate`` looks each scheduler's name up with getattr on its own module,
    ``ppdet.optimizer.optimizer``, not in the workspace registry that ``@register`` fills."""
    import ppdet.optimizer.optimizer as ppdet_optimizer

    setattr(ppdet_optimizer, cls.__name__, cls)


# Mixed precision: Paddle's GradScaler internals that ppmulti reads.

def scaler_found_inf(scaler: Any) -> bool:
    """Whether the scaler's last ``step`` skipped the optimizer (inf/nan gradients). GradScaler keeps it in
    a private attribute that Paddle itself already read as a Python bool inside ``step``, so reading it
    costs no device sync: ``_cache_founf_inf`` (sic) in Paddle 2.6, ``_cache_found_inf`` in 3.x."""
    name = "_cache_found_inf" if paddle3() else "_cache_founf_inf"
    return bool(getattr(scaler, name, False))


def scaler_update(scaler: Any) -> None:
    """``scaler.update()``, quiet, and past a Paddle 3.3 bug: when it lowers the scale it prints
    ``float(self._scale)`` of a shape-[1] tensor, which numpy >= 2.5 refuses (``TypeError: only 0-dimensional
    arrays can be converted to Python scalars``): the first overflow would end the run. The scale is made
    0-d for that call and given back its shape [1]. Paddle 2.6 formats it with ``%s``, and prints the same
    line on every overflow; ppmulti counts skipped steps in its own epoch line instead."""
    shaped = paddle3() and getattr(scaler, "_scale", None) is not None and list(scaler._scale.shape) == [1]
    if shaped:
        scaler._scale = scaler._scale.reshape([])
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            scaler.update()
    finally:
        if shaped:
            scaler._scale = scaler._scale.reshape([1])


# PaddleDetection release/2.7's configs name some modules and reader ops that ppdet 2.6.0 registers with an older
# signature (DETR without a neck, ResNet without freeze_stem_only, DINOLoss without use_vfl, RandomDistort and
# RandomCrop without prob). The subclasses in ppmulti/rank/models/rtdetr/release27.py keep 2.6.0's behaviour for
# 2.6's keys; this puts them where ppdet looks the names up.
_OVERRIDE_MARK = "_ppmulti_release27"


def override_registered_module(cls: type) -> bool:
    """R27: make ppdet's workspace build ``cls`` for the name ``cls.__name__`` that ppdet 2.6.0 registered for its
    own class (ppdet's ``register`` refuses a second registration; ``create`` looks the class up by that name on
    the schema's module, which is now ``cls``'s). Values a loaded config set on the old schema are kept. False when
    ``cls`` is already the registered one."""
    from ppdet.core.config.schema import SchemaDict
    from ppdet.core.workspace import global_config, register

    name = cls.__name__
    existing = global_config.get(name)
    if isinstance(existing, SchemaDict) and getattr(existing.pymodule, "__name__", None) == cls.__module__:
        return False
    old = global_config.pop(name, None)
    register(cls)
    if isinstance(old, dict) and old:
        global_config[name].update(dict(old))
    return True


def override_transform(cls: type) -> bool:
    """R27: make ppdet's reader build ``cls`` for the op name ``cls.__name__`` (its Compose looks each name up on
    ``ppdet.data.transform``). ``ppdet.data.transform.operators`` keeps its own class under the name: 2.6.0's
    methods call ``super(RandomDistort, self)`` through that module's globals. False when already done."""
    import ppdet.data.transform as transform

    name = cls.__name__
    if getattr(transform, name, None) is cls:
        return False
    setattr(cls, _OVERRIDE_MARK, True)
    setattr(transform, name, cls)
    return True


def model_ema(model: Any, decay: float = 0.9998, ema_decay_type: str = "threshold", cycle_epoch: int = -1,
              ema_black_list: Any = None, ema_filter_no_grad: bool = False) -> Any:
    """ppdet's ModelEMA. F14: ppdet 2.6.0's ``ema_filter_no_grad`` (ppdet/optimizer/ema.py:71-74) appends each
    frozen parameter to its black list, which ``_match_ema_black_list`` made a set: ``AttributeError: 'set' object
    has no attribute 'append'`` as soon as one weight is frozen (release/2.7's RT-DETR configs set it, with a
    frozen stem). Here the frozen parameters join the black list as ppdet meant: kept as they are, not averaged."""
    from ppdet.optimizer import ModelEMA

    ema = ModelEMA(model, decay=decay, ema_decay_type=ema_decay_type, cycle_epoch=cycle_epoch,
                   ema_black_list=ema_black_list, ema_filter_no_grad=False)
    if ema_filter_no_grad:
        from ppdet.optimizer.ema import get_bn_running_state_names

        running = set(get_bn_running_state_names(model))
        state = model.state_dict()
        black = set(ema.ema_black_list)
        for name, param in model.named_parameters():
            if param.stop_gradient and name not in running:
                black.add(name)
                ema.state_dict[name] = state[name]
        ema.ema_black_list = black
    return ema


def export_refusal(architecture: str, exc: BaseException, version: tuple[int, ...] | None = None) -> str | None:
    """Why ppdet 2.6's exporter cannot write ``architecture`` on this Paddle (``version``; default the installed
    one), from the error its to_static raised, or None for an error not recognised here. Measured 2026-12-02 with
    tests/test_ppdet_export.py's zoo models: on Paddle 3.3.1, Deformable DETR and DINO stop in ppdet's
    MSDeformableAttention (deformable_transformer.py divides a float32 by an int64 shape, which Paddle 3's type
    promotion refuses; to_static converts ppdet's own source, so no patch of the eager function reaches it);
    Paddle 2.6.2 exports both, to ONNX too."""
    text = str(exc)
    if architecture == "DETR" and paddle3(version) and "Type promotion" in text:
        return ("ppdet 2.6's deformable attention (Deformable DETR, DINO) divides float32 by int64 in the "
                "exported graph, which Paddle 3 refuses: export it on the Paddle 2.6 stack "
                "(pip install with PPMULTI_PADDLE_VERSION=2.6.2), which writes both the Paddle model and ONNX")
    return None
