"""Compiles recorded launches of softtopk's Triton kernels for a Hopper GPU (sm_90) without one:
``python tests/compile_kernels.py LAUNCHES.json`` reads ``[{"module", "kernel", "signature",
"constexprs", "options"}, ...]`` (options: the launch's own, e.g. ``num_warps``) and prints a
JSON list of the failures (``{"module", "kernel", "error"}``).

Run by ``tests/test_triton_compile.py`` in a process of its own, outside Triton's interpreter
(there the kernels are interpreted functions, which ``triton.compile`` does not take)."""

from __future__ import annotations

import importlib
import json
import sys


def compile_all(launches: list[dict]) -> list[dict]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target, failures = GPUTarget("cuda", 90, 32), []
    for launch in launches:
        kernel = getattr(importlib.import_module(f"softtopk.ops.{launch['module']}"), launch["kernel"])
        source = ASTSource(fn=kernel, signature=launch["signature"], constexprs=launch["constexprs"])
        try:
            triton.compile(source, target=target, options=launch["options"])
        except Exception as error:  # noqa: BLE001 - every failure is reported, not the first
            failures.append({"module": launch["module"], "kernel": launch["kernel"], "error": str(error)[-2000:]})
    return failures


if __name__ == "__main__":
    with open(sys.argv[1]) as file:
        print(json.dumps(compile_all(json.load(file))))
