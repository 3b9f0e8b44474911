"""The base class of the library's ``torch.autograd.Function`` kernels.

``Function.apply`` of a class that defines ``setup_context`` binds every call's arguments to
``forward``'s signature, which ``inspect.signature`` rebuilds from the code object at each call
unless the function carries it as ``__signature__`` (the attribute it returns first). A subclass
of :class:`Function` carries it, computed once when the class is made: the same binding, without
the per-call rebuild (the host time of every call, on any device)."""

from __future__ import annotations

import inspect
from typing import Any

import torch


class Function(torch.autograd.Function):
    """``torch.autograd.Function`` whose ``forward`` carries its signature (module doc)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if isinstance(forward, staticmethod):
            forward.__func__.__signature__ = inspect.signature(forward.__func__)  # type: ignore[attr-defined]
