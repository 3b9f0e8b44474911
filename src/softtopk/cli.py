"""The ``softtopk`` console script."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="softtopk", description="Differentiable top-k for PyTorch.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="soft top-k of an example input and a short training comparison")
    demo.add_argument("--steps", type=int, default=150, help="training steps per loss (default 150)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--out", type=Path, default=None, help="write the results as JSON to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.steps < 1:
        print("softtopk demo: error: --steps must be >= 1", file=sys.stderr)
        return 2
    from .experiments.demo import run_demo

    run_demo(steps=args.steps, seed=args.seed, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
