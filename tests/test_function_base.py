"""Every autograd Function of the library carries its ``forward``'s signature, so that
``Function.apply`` binds the arguments of a call without rebuilding it, and skips the binding
where every parameter is given by position (``softtopk.ops._function``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import ClassVar

import pytest
import torch

import softtopk
from softtopk.ops._function import Function


def _library_functions() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(softtopk.__path__, "softtopk."):
        if ".jax" in info.name or info.name.endswith("lapsum_kernels"):  # JAX; the Triton kernels themselves
            continue
        module = importlib.import_module(info.name)
        found += [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, torch.autograd.Function) and obj.__module__ == info.name
        ]
    return found


def test_every_autograd_function_derives_from_the_base():
    functions = _library_functions()
    assert len(functions) >= 17, [f.__name__ for f in functions]
    assert [f.__name__ for f in functions if not issubclass(f, Function)] == []
    for fn in functions:
        if "forward" in vars(fn):  # not the bases (this one, the networks' sweep)
            assert fn.forward.__signature__ == inspect.signature(fn.forward, follow_wrapped=False)


def test_every_library_function_may_skip_the_binding():
    """Each Function with a forward of its own (positional parameters only) takes the shortcut,
    also where ``setup_context`` is inherited (the networks' sweeps)."""
    for fn in _library_functions():
        if "forward" in vars(fn):
            assert fn._arity == len(inspect.signature(fn.forward).parameters), fn.__name__


def test_apply_does_not_rebuild_the_signature(monkeypatch):
    x = torch.randn(4, 9, requires_grad=True)
    # each call once first, forward and backward: numba's own start-up (compiling its kernels on
    # their first call, the backward's too) inspects functions; which kernels an earlier test on the
    # same worker compiled depends on the order the tests ran in
    softtopk.soft_topk(x, 3).sum().backward()
    softtopk.soft_rank(x).sum().backward()

    def rebuilt(*args, **kwargs):
        raise AssertionError("inspect rebuilt a signature during the call")

    monkeypatch.setattr(inspect, "_signature_from_function", rebuilt)
    softtopk.soft_topk(x, 3).sum().backward()
    softtopk.soft_rank(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_subclass_without_its_own_forward_is_left_alone():
    class Plain(Function):  # no forward of its own: nothing to compute, nothing to fail
        pass

    assert "forward" not in vars(Plain)
    with pytest.raises(NotImplementedError):
        Plain.forward(None)


class Scaled(Function):
    """``x * scale`` (``scale`` defaults to 2), recording how its ``setup_context`` saw the inputs."""

    seen: ClassVar[list[int]] = []

    @staticmethod
    def forward(x, scale=2.0):
        return x * scale

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        Scaled.seen.append(len(inputs))
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None

    generate_vmap_rule = True


def test_apply_binds_only_where_a_default_is_missing(monkeypatch):
    """All parameters by position: no binding (``bind`` is never called) and the same result; a
    missing default or a keyword: torch's binding, defaults filled in."""
    x = torch.randn(3, requires_grad=True)
    Scaled.seen.clear()
    calls = []
    bind = inspect.Signature.bind
    monkeypatch.setattr(inspect.Signature, "bind", lambda self, *a, **k: calls.append(1) or bind(self, *a, **k))
    out = Scaled.apply(x, 3.0)
    assert calls == [] and torch.equal(out, x * 3.0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.equal(grad, torch.full_like(x, 3.0))
    assert torch.equal(Scaled.apply(x), x * 2.0) and len(calls) == 1
    assert torch.equal(Scaled.apply(x, scale=5.0), x * 5.0) and len(calls) == 2
    assert Scaled.seen == [2, 2, 2]  # setup_context always sees every input


def test_apply_under_vmap_and_grad_takes_torchs_path():
    """Inside functorch transforms ``apply`` is torch's own (which routes to the transforms)."""
    x = torch.randn(4, 3)
    assert torch.equal(torch.vmap(lambda row: Scaled.apply(row, 3.0))(x), x * 3.0)
    grad = torch.func.grad(lambda v: Scaled.apply(v, 3.0).sum())(x)
    assert torch.equal(grad, torch.full_like(x, 3.0))
