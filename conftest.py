"""Collection of the whole suite: the JAX front-end's doctests need the ``jax`` extra, the Triton
kernels' module needs triton (without a GPU its kernels run in Triton's interpreter, which must be
chosen before anything imports triton)."""

import importlib.util
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

collect_ignore_glob = [] if importlib.util.find_spec("jax") else ["src/softtopk/jax/*"]
if importlib.util.find_spec("triton") is None:
    KERNELS = ("lapsum", "sparse", "networks", "neuralsort", "softsort", "svm")
    collect_ignore_glob += [f"src/softtopk/ops/{name}_kernels.py" for name in KERNELS]
