"""Collection of the whole suite: the JAX front-end's doctests need the ``jax`` extra."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("jax") else ["src/softtopk/jax/*"]
