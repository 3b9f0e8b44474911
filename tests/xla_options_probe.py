"""Values and vector-Jacobian products of :mod:`softtopk.jax`'s three solvers (the sparse mask's
threshold, the Laplace mask's closed form, the isotonic regression of soft ranks), float64 and
float32, on fixed inputs: run as a script (``python tests/xla_options_probe.py out.npz``) it saves
them, so that tests/test_jax.py can compare a process with XLA's default compiler options to the
suite's own (tests/conftest.py)."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

import softtopk.jax as sj

# the programs probed per dtype: the sparse threshold and the isotonic regression in float64, the
# closed form in float32
CASES = {
    "float64": {
        "mask": lambda v: sj.sparse_topk_mask(v, 4, l=0.3),
        "rank": lambda v: sj.soft_rank(v, strength=0.3),
    },
    "float32": {"laplace": lambda v: sj.soft_topk(v, 4, tau=0.3)},
}


def values() -> dict[str, np.ndarray]:
    """``{"<family> <dtype> value" | "... grad": array}`` on rows at scales 1e-3, 1 and 30, one with a tie."""
    out = {}
    for dtype, cases in CASES.items():
        with jax.enable_x64(dtype == "float64"):
            rng = np.random.default_rng(21)
            rows = rng.standard_normal((4, 13)) * np.array([[1e-3], [1.0], [30.0], [1.0]])
            rows[3, 2] = rows[3, 5]
            x = jnp.asarray(rows.astype(dtype))
            g = jnp.asarray(rng.standard_normal((4, 13)).astype(dtype))
            for name, fn in cases.items():
                value, vjp = jax.vjp(fn, x)
                out[f"{name} {dtype} value"] = np.asarray(value)
                out[f"{name} {dtype} grad"] = np.asarray(vjp(g)[0])
    return out


if __name__ == "__main__":
    np.savez(sys.argv[1], **values())
