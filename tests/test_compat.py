"""The rank side's version seam (ppmulti/rank/compat.py): its facts hold on the installed Paddle and ppdet, and no
other module reaches for them."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import paddle
import pytest

from ppmulti.rank import compat
from ppmulti.common.envvars import PADDLE_SOT_SWITCH

PACKAGE = Path(__file__).resolve().parents[1] / "ppmulti"
SEAM = PACKAGE / "rank" / "compat.py"


# ---------------------------------------------------------------- the facts, read from the installed Paddle

def test_installed_version_is_the_imported_one():
    want = tuple(int(p) for p in paddle.__version__.split("+")[0].split(".")[:3] if p.isdigit())
    assert compat.installed_version() == want


def test_set_num_threads_sets_paddle_threads():
    compat.set_num_threads(2)
    compat.set_num_threads(1)   # back to what `import paddle` gives a test process


def test_plain_conv_facts():
    facts = compat.conv2d_facts(paddle.nn.Conv2D(3, 8, 3, stride=2, padding=1, bias_attr=False))
    assert facts == compat.Conv2DFacts(groups=1, stride=[2, 2], dilation=[1, 1], padding=[1, 1],
                                       padding_algorithm="EXPLICIT", padding_mode="zeros", data_format="NCHW")


@pytest.mark.parametrize("kwargs,field,value", [
    ({"groups": 2}, "groups", 2),
    ({"dilation": 2, "padding": 2}, "dilation", [2, 2]),
    ({"stride": (1, 2)}, "stride", [1, 2]),
    ({"padding": [1, 0, 1, 0]}, "padding", [1, 0, 1, 0]),      # per side: not the op's [h, w] form
    ({"padding": "SAME"}, "padding_algorithm", "SAME"),
    ({"padding": 1, "padding_mode": "reflect"}, "padding_mode", "reflect"),
    ({"data_format": "NHWC"}, "data_format", "NHWC"),
])
def test_conv_facts_follow_the_constructor(kwargs, field, value):
    facts = compat.conv2d_facts(paddle.nn.Conv2D(8, 8, 3, **kwargs))
    assert getattr(facts, field) == value


def test_conv_with_bias_changes_no_fact():
    biased = compat.conv2d_facts(paddle.nn.Conv2D(4, 4, 1, bias_attr=True))
    plain = compat.conv2d_facts(paddle.nn.Conv2D(4, 4, 1, bias_attr=False))
    assert biased == plain


@pytest.mark.parametrize("cls", [paddle.nn.BatchNorm1D, paddle.nn.BatchNorm2D, paddle.nn.SyncBatchNorm])
def test_batchnorm_eps_and_momentum_are_set(cls):
    bn = cls(4)
    assert compat.batchnorm_eps_momentum(bn) == pytest.approx((1e-5, 0.9))   # Paddle's defaults
    compat.set_batchnorm_eps_momentum(bn, 1e-3, 0.97)
    assert compat.batchnorm_eps_momentum(bn) == pytest.approx((1e-3, 0.97))


def test_batchnorm_momentum_reaches_the_running_mean():
    bn = paddle.nn.BatchNorm1D(1)
    compat.set_batchnorm_eps_momentum(bn, 1e-5, 0.5)
    bn.train()
    bn(paddle.full([4, 1], 2.0))
    mean_name, _ = compat.batchnorm_state_names()
    # a 1-element buffer of shape [1]: numpy 2 refuses float() of it, so take the element
    assert float(bn.state_dict()[mean_name].numpy()[0]) == pytest.approx(1.0)   # 0.5 * 0 + 0.5 * 2


def test_batchnorm_state_names_are_its_buffers():
    keys = set(paddle.nn.BatchNorm2D(4).state_dict())
    assert set(compat.batchnorm_state_names()) <= keys


def test_batch_sampler_of_a_ppdet_reader():
    from ppdet.data.reader import BaseDataLoader
    from ppdet.data.source.dataset import DetDataset

    class Tiny(DetDataset):
        def check_or_download_dataset(self):
            pass

        def parse_dataset(self):
            self.roidbs = [{"im_id": i} for i in range(5)]

    loader = BaseDataLoader(batch_size=2, shuffle=True)(Tiny(), 0)
    sampler = compat.batch_sampler(loader)
    assert isinstance(sampler, paddle.io.DistributedBatchSampler) and len(sampler) == 3
    assert hasattr(sampler, "set_epoch")   # what the trainer reshuffles with
    assert compat.batch_sampler(object()) is None


def test_a_built_reader_takes_num_classes_from_the_data():
    """YOLOv3's reader as PaddleDetection writes it, built with coco_detection.yml's 80 classes: after
    ``set_reader_num_classes(3)`` its Gt2YoloTarget makes targets of 3 classes, what the 3-class model's loss
    compares them with."""
    import numpy as np
    from ppdet.data.reader import TrainReader

    anchors = [[10, 13], [16, 30], [33, 23]]
    reader = TrainReader(sample_transforms=[{"Decode": {}}], batch_size=1, num_classes=80, batch_transforms=[
        {"Gt2YoloTarget": {"anchor_masks": [[0, 1, 2]], "anchors": anchors, "downsample_ratios": [32]}}])
    sample = {"image": np.zeros((3, 64, 64), "float32"), "gt_bbox": np.array([[0.5, 0.5, 0.2, 0.3]], "float32"),
              "gt_class": np.array([1], "int32"), "gt_score": np.ones(1, "float32")}

    def target_channels() -> int:
        out = reader._batch_transforms.transforms_cls[0]([dict(sample)])
        return out[0]["target0"].shape[1]

    assert target_channels() == 6 + 80
    assert compat.set_reader_num_classes(reader, 3) == ["Gt2YoloTarget"]
    assert target_channels() == 6 + 3
    assert compat.set_reader_num_classes(reader, 3) == []   # already told


def test_device_and_gpus_on_this_build():
    if not paddle.is_compiled_with_cuda():
        assert compat.usable_gpu_count() == 0
    compat.set_device("cpu")
    assert paddle.get_device() == "cpu"


def test_full_graph_to_static_restores_the_switch(monkeypatch):
    monkeypatch.delenv(PADDLE_SOT_SWITCH, raising=False)
    with compat.full_graph_to_static():
        assert os.environ[PADDLE_SOT_SWITCH] == "False"
    assert PADDLE_SOT_SWITCH not in os.environ
    monkeypatch.setenv(PADDLE_SOT_SWITCH, "True")
    with compat.full_graph_to_static():
        pass
    assert os.environ[PADDLE_SOT_SWITCH] == "True"


def test_exported_program_name_is_what_jit_save_writes(tmp_path):
    from paddle.static import InputSpec

    layer = paddle.nn.Linear(4, 2)
    with compat.full_graph_to_static():
        paddle.jit.save(layer, str(tmp_path / "model"), input_spec=[InputSpec([None, 4], "float32", "x")])
    assert (tmp_path / compat.exported_program_name()).is_file()
    assert (tmp_path / "model.pdiparams").is_file()


def test_paddle_wheel_layout():
    package_dir = compat.paddle_package_dir()
    assert package_dir == Path(paddle.__file__).parent
    assert paddle.__version__.encode() in compat.paddle_build_id(package_dir)
    assert compat.paddle_build_id(Path("/nonexistent")) == b""
    assert compat.paddle_onednn_library(package_dir).is_file()


def test_custom_op_library_is_where_the_builder_puts_it():
    from ppmulti.rank.ops import conv as ops_conv

    library = ops_conv.build_op()   # built here unless a slow test's session start built it
    assert library == compat.custom_op_library(library.parents[1], ops_conv.LIBRARY_NAME)
    assert library.is_file()


def test_custom_op_runner_runs_the_registered_op():
    from ppmulti.rank.ops import conv as ops_conv

    ops_conv.load_op()   # registers it
    x, w = paddle.randn([1, 2, 6, 6]), paddle.randn([3, 2, 3, 3])
    y = compat.custom_op_runner(ops_conv.OP_NAME)(x, w, [1, 1], [1, 1], 1)[0]   # strides, paddings, groups
    ref = paddle.nn.functional.conv2d(x, w, padding=1)
    assert float((y - ref).abs().max()) < 1e-4


def test_trainer_callbacks_are_called_after_ppdet_own():
    from ppdet.engine import Trainer
    from ppdet.engine.callbacks import Callback, ComposeCallback

    seen = []

    class Mark(Callback):
        def __init__(self, model, name):
            super().__init__(model)
            self.name = name

        def on_step_end(self, status):
            seen.append(self.name)

    trainer = Trainer.__new__(Trainer)   # what ppdet 2.6.0's _init_callbacks leaves, without building a model
    trainer._callbacks = [Mark(trainer, "ppdet")]
    trainer._compose_callback = ComposeCallback(trainer._callbacks)
    compat.add_trainer_callbacks(trainer, Mark(trainer, "ours"))
    trainer._compose_callback.on_step_end({})
    assert seen == ["ppdet", "ours"]


def test_lr_scheduler_is_found_by_name():
    import ppdet.optimizer.optimizer as ppdet_optimizer
    from ppdet.optimizer.optimizer import LearningRate

    class SeamTestDecay:
        use_warmup = False

        def __init__(self, factor: float = 1.0):
            self.factor = factor

    compat.register_lr_scheduler(SeamTestDecay)
    try:
        lr = LearningRate(base_lr=0.1, schedulers=[{"name": "SeamTestDecay", "factor": 0.5}])
    finally:
        delattr(ppdet_optimizer, "SeamTestDecay")
    assert isinstance(lr.schedulers[0], SeamTestDecay) and lr.schedulers[0].factor == 0.5


# ---------------------------------------------------------------- the guard: no version facts outside the seam

INTERNAL_MODULES = ("paddle.base", "paddle.fluid")
PRIVATE_NAMES = frozenset({
    # Paddle's custom-op machinery: what its generated op wrappers call, not an API
    "_run_custom_op", "load_op_meta_info_and_register_op",
    # Paddle 2.6.2 layers' private state: BatchNorm's settings and buffers, Conv2D's settings
    "_epsilon", "_momentum", "_mean", "_variance",
    "_groups", "_stride", "_dilation", "_data_format", "_padding", "_padding_mode", "_padding_algorithm",
    "_updated_padding",
    # ppdet 2.6.0 private state: a reader's batch sampler, the Trainer's callback list and its composite
    "_batch_sampler", "_callbacks", "_compose_callback",
    # Paddle 3's phi ops called directly, and the PIR-mode probe: what the Paddle-3 fix of ppdet's NMS needs
    "_C_ops", "in_pir_mode",
})
FILES = {str(p.relative_to(PACKAGE.parent)): p for p in sorted(PACKAGE.rglob("*.py")) if p != SEAM}
_MODULE_RE = re.compile(r"\bpaddle\.(base|fluid)\b")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _internal(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in INTERNAL_MODULES)


def violations(path: Path) -> list[str]:
    """``line: what`` for each use of a Paddle/ppdet version fact in one file. Code only: comments and
    docstrings may name the facts (they explain why the seam exists); string literals count, since
    ``getattr(x, "_batch_sampler")`` or ``import_module("paddle.base")`` reach the same facts."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found |= {(line, f"import {a.name}") for a in node.names if _internal(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            for a in node.names:
                if _internal(module) or _internal(f"{module}.{a.name}") or a.name in PRIVATE_NAMES:
                    found.add((line, f"from {module} import {a.name}"))
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_NAMES:
                found.add((line, f".{node.attr}"))
            dotted = _dotted(node)
            if dotted and _internal(dotted):
                found.add((line, next(m for m in INTERNAL_MODULES if dotted.startswith(m))))
        elif isinstance(node, ast.Name) and node.id in PRIVATE_NAMES:
            found.add((line, node.id))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if _MODULE_RE.search(node.value):
                found.add((line, repr(node.value)))
            found |= {(line, repr(node.value)) for w in _WORD_RE.findall(node.value) if w in PRIVATE_NAMES}
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_no_version_facts_outside_the_seam():
    """Only ppmulti/rank/compat.py may use what changes between Paddle or ppdet versions.

    The list is explicit: ``paddle.base`` / ``paddle.fluid`` (Paddle's internal package, renamed once already
    and reorganised again in 3.x); ``_run_custom_op`` and ``load_op_meta_info_and_register_op`` (the custom-op
    calls Paddle's generated wrappers make); BatchNorm's ``_epsilon``, ``_momentum`` and its ``_mean`` /
    ``_variance`` buffers; Conv2D's ``_groups``, ``_stride``, ``_dilation``, ``_data_format``, ``_padding*``
    and ``_updated_padding``; ppdet's reader ``_batch_sampler`` and Trainer ``_callbacks`` /
    ``_compose_callback``; Paddle's ``_C_ops`` and ``in_pir_mode`` (the Paddle-3 fixes of ppdet). A new fact
    joins the seam and this list together.
    """
    bad = {name: v for name, path in FILES.items() if (v := violations(path))}
    assert not bad, f"Paddle/ppdet version facts outside ppmulti/rank/compat.py (move them there): {bad}"


def test_the_seam_itself_is_seen_by_the_scanner():
    """The scanner reads the real spellings: the seam, which must hold them, is full of them."""
    text = "\n".join(violations(SEAM))
    for expected in ("paddle.base", "._run_custom_op", "._epsilon", "._updated_padding", "_batch_sampler", "._C_ops"):
        assert expected in text


def test_the_guard_catches_a_planted_violation(monkeypatch, tmp_path):
    fake = tmp_path / "planted.py"
    fake.write_text('"""Planted: ``paddle.base`` and ``layer._epsilon`` in a docstring are fine."""\n\n'
                    "import paddle.base.core  # noqa\n"
                    "from paddle.utils.cpp_extension import load_op_meta_info_and_register_op  # noqa\n\n\n"
                    "def f(layer, loader, trainer):\n"
                    "    layer._epsilon = 1e-3\n"
                    "    trainer._callbacks.append(None)\n"
                    "    return paddle.fluid.core, getattr(loader, '_batch_sampler')\n")
    found = "\n".join(violations(fake))
    assert "docstring" not in found
    for expected in ("import paddle.base.core", "load_op_meta_info_and_register_op", "._epsilon", "._callbacks",
                     "paddle.fluid", "'_batch_sampler'"):
        assert expected in found, (expected, found)
    monkeypatch.setitem(FILES, "ppmulti/planted.py", fake)
    with pytest.raises(AssertionError, match="planted"):
        test_no_version_facts_outside_the_seam()
