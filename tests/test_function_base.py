"""Every autograd Function of the library carries its ``forward``'s signature, so that
``Function.apply`` binds the arguments of a call without rebuilding it (``softtopk.ops._function``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

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


def test_apply_does_not_rebuild_the_signature(monkeypatch):
    x = torch.randn(4, 9, requires_grad=True)

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
