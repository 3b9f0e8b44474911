"""The base class of the library's ``torch.autograd.Function`` kernels.

``Function.apply`` of a class that defines ``setup_context`` binds every call's arguments to
``forward``'s signature (to fill in defaults), which costs the host more than a small kernel: the
signature is rebuilt from the code object at each call unless the function carries it as
``__signature__``, and the binding itself walks it in Python. A subclass of :class:`Function`
carries the signature, computed once when the class is made, and skips the binding where it
changes nothing: every parameter of ``forward`` given by position, no keyword, outside the
functorch transforms (``vmap``, ``grad``; there ``torch.autograd.Function.apply`` runs as it is).
``torch.compile`` never runs ``apply`` (Dynamo traces the Function itself)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch._functorch.utils import unwrap_dead_wrappers
from torch.autograd.function import _is_setup_context_defined

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD


class Function(torch.autograd.Function):
    """``torch.autograd.Function`` whose ``forward`` carries its signature, and whose ``apply``
    binds arguments only where a default is missing (module doc)."""

    _arity: int | None = None  # forward's parameter count, where they are all positional

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if isinstance(forward, staticmethod):
            signature = inspect.signature(forward.__func__)
            forward.__func__.__signature__ = signature  # type: ignore[attr-defined]
            plain = all(p.kind is _POSITIONAL for p in signature.parameters.values())
            # (a class without setup_context takes ctx first and is never bound: torch's apply then)
            cls._arity = len(signature.parameters) if plain and _is_setup_context_defined(cls.setup_context) else None

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != cls._arity or torch._C._are_functorch_transforms_active():
            return super().apply(*args, **kwargs)
        # what torch.autograd.Function.apply does once its binding has returned the arguments as given
        return super(torch.autograd.Function, cls).apply(*unwrap_dead_wrappers(args))  # type: ignore[misc]


def once_differentiable_unless(exact: Callable[[Any], bool]) -> Callable:
    """Decorator of a ``backward``: where ``exact(ctx)`` holds, the graph it records (under
    ``create_graph``) is its exact derivative and a second derivative goes through it; elsewhere it
    uses tensors saved without their graph, and runs as ``torch.autograd.function.once_differentiable``
    (differentiating through its result raises instead of being wrong)."""

    def decorate(backward: Callable) -> Callable:
        once = torch.autograd.function.once_differentiable(backward)

        @functools.wraps(backward)
        def wrapper(ctx: Any, *grads: Any) -> Any:
            return (backward if exact(ctx) else once)(ctx, *grads)

        return wrapper

    return decorate
