"""Collection of the whole suite: the JAX front-end's doctests need the ``jax`` extra, the Triton
kernels' module needs triton (without a GPU its kernels run in Triton's interpreter, which must be
chosen before anything imports triton), and XLA compiles the JAX tests' functions without LLVM's
optimisation passes (chosen before anything imports jax)."""

import importlib.util
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# nearly every JAX test compiles functions it runs once or twice, so XLA's optimising backend costs
# more than it saves; the tests check values, which do not depend on the optimisation level. A level
# the user's own XLA_FLAGS name is kept.
_xla_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _xla_flags:
    os.environ["XLA_FLAGS"] = f"{_xla_flags} --xla_backend_optimization_level=0".strip()

collect_ignore_glob = [] if importlib.util.find_spec("jax") else ["src/softtopk/jax/*"]
if importlib.util.find_spec("triton") is None:
    collect_ignore_glob.append("src/softtopk/ops/lapsum_kernels.py")
