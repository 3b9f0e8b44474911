"""Drop-in replacements, on JAX arrays, for the JAX packages softtopk supersedes."""
