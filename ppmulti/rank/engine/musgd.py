"""MuSGD for Paddle: ultralytics 8.4's hybrid of Muon (Newton-Schulz orthogonalised momentum) and Nesterov SGD."""

from __future__ import annotations

from typing import Iterable

import paddle

__all__ = ["newton_schulz", "muon_update", "MuSGD", "NS_COEFFS"]

# The quintic iteration's coefficients (Keller Jordan's Muon): steepest slope at zero, five steps.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def _rounder(dtype: str):
    """Rounds float32 values to ``dtype`` and back: bfloat16 arithmetic as torch does it (each op accumulates in
    float32 and rounds its result), on CPUs where Paddle has no bfloat16 kernels for divide or matmul."""
    if dtype == "float32":
        return lambda x: x
    return lambda x: x.astype(dtype).astype("float32")


def newton_schulz(g: paddle.Tensor, steps: int = 5, eps: float = 1e-7, dtype: str = "bfloat16") -> paddle.Tensor:
    """An approximate orthogonalisation (U V^T of g's SVD, singular values pulled into about 0.5-1.5) of a matrix
    [m, n], by the quintic Newton-Schulz iteration in ``dtype`` (bfloat16 as Muon runs it); returns g's dtype."""
    if g.ndim != 2:
        raise ValueError(f"newton_schulz takes a matrix, got shape {list(g.shape)}")
    q = _rounder(dtype)
    x = q(g.astype("float32"))
    x = q(x / (q(paddle.linalg.norm(x)) + eps))
    tall = g.shape[0] > g.shape[1]
    if tall:   # iterate on the short side: X X^T is the smaller Gram matrix
        x = x.T
    a, b, c = NS_COEFFS
    for _ in range(steps):
        gram = q(paddle.matmul(x, x, transpose_y=True))
        poly = q(b * gram + c * q(paddle.matmul(gram, gram)))
        x = q(a * x + q(paddle.matmul(poly, x)))
    if tall:
        x = x.T
    return x.astype(g.dtype)


def muon_update(grad: paddle.Tensor, buf: paddle.Tensor, beta: float, nesterov: bool = True) -> paddle.Tensor:
    """One parameter's Muon direction: the momentum buffer (updated in place: beta x buf + (1 - beta) x grad),
    Nesterov's look-ahead, flattened to [out, rest] and orthogonalised, scaled by sqrt(max(1, rows / cols)) of
    the parameter's own last two dimensions (as ultralytics scales it: 1 for square conv kernels)."""
    paddle.assign(buf * beta + grad * (1 - beta), buf)
    update = buf * beta + grad * (1 - beta) if nesterov else buf
    flat = update.reshape([update.shape[0], -1]) if update.ndim > 2 else update
    scale = max(1.0, grad.shape[-2] / grad.shape[-1]) ** 0.5
    return (newton_schulz(flat) * scale).reshape(grad.shape)


def _lr_factor(p: paddle.Tensor) -> float:
    """A parameter's own lr factor, as Paddle's optimizers apply it (``optimize_attr['learning_rate']``, 1 unless a
    ParamAttr or YOLOv5's warmup set it)."""
    attr = getattr(p, "optimize_attr", None) or {}
    return float(attr.get("learning_rate", 1.0))


class MuSGD:
    """ultralytics' MuSGD over parameter groups (dicts with ``params``, ``lr``, ``momentum``, ``nesterov``,
    ``weight_decay``, ``use_muon``; any other keys, such as ``param_group`` or ``initial_lr``, are kept for the
    warmup and schedule): a Muon group moves by lr x ``muon`` along the orthogonalised momentum, then by
    lr x ``sgd`` along SGD's (with weight decay, on the Muon-moved weights, and its own buffer); the other
    groups take SGD's step alone. The groups' ``lr`` are absolute: a schedule sets them (``set_group_lrs``); a
    parameter's own Paddle lr factor (``optimize_attr['learning_rate']``) multiplies its group's."""

    def __init__(self, groups: Iterable[dict], muon: float = 0.2, sgd: float = 1.0):
        self.param_groups = []
        for g in groups:
            g = dict(g)
            g["params"] = list(g["params"])
            g.setdefault("momentum", 0.0)
            g.setdefault("nesterov", False)
            g.setdefault("weight_decay", 0.0)
            g.setdefault("use_muon", False)
            self.param_groups.append(g)
        self.muon = float(muon)
        self.sgd = float(sgd)
        self.state: dict[str, dict[str, paddle.Tensor]] = {}

    def _buffers(self, p: paddle.Tensor, use_muon: bool) -> dict[str, paddle.Tensor]:
        st = self.state.get(p.name)
        if st is None:
            st = {"momentum_buffer": paddle.zeros_like(p)}
            if use_muon:
                st["momentum_buffer_SGD"] = paddle.zeros_like(p)
            self.state[p.name] = st
        return st

    @paddle.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum, nesterov = float(group["lr"]), float(group["momentum"]), bool(group["nesterov"])
            wd = float(group["weight_decay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.astype(p.dtype)
                st = self._buffers(p, group["use_muon"])
                plr = lr * _lr_factor(p)
                sgd_lr = plr
                if group["use_muon"]:
                    update = muon_update(grad, st["momentum_buffer"], momentum, nesterov)
                    paddle.assign(p - update * (plr * self.muon), p)
                    buf = st["momentum_buffer_SGD"]
                    sgd_lr = plr * self.sgd
                else:
                    buf = st["momentum_buffer"]
                if wd:
                    grad = grad + p * wd
                paddle.assign(buf * momentum + grad, buf)
                step = grad + buf * momentum if nesterov else buf
                paddle.assign(p - step * sgd_lr, p)

    def clear_grad(self, set_to_zero: bool = False) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.clear_gradient(set_to_zero)

    def get_lr(self) -> float:
        return float(self.param_groups[0]["lr"]) if self.param_groups else 0.0

    def set_group_lrs(self, lrs: Iterable[float]) -> None:
        for group, lr in zip(self.param_groups, lrs):
            group["lr"] = float(lr)

    def state_dict(self) -> dict:
        return {"state": {name: dict(st) for name, st in self.state.items()},
                "groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def set_state_dict(self, state: dict) -> None:
        self.state = {name: dict(st) for name, st in state.get("state", {}).items()}
        for group, saved in zip(self.param_groups, state.get("groups", [])):
            group.update(saved)
