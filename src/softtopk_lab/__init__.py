"""Experiments and command-line tools built on softtopk (the demo for now)."""
