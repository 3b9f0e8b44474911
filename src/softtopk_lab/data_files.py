"""Reading the lab's pickled data files safely: a restricted unpickler.

The CIFAR-100 and MNIST files are Python pickles of numpy arrays. :func:`unpickle` accepts only the
numpy-array globals these files contain, so a malformed or hostile file raises
:class:`~softtopk_lab.errors.DataError` instead of running code.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from .errors import DataError

_NUMPY_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy-array globals (old ``numpy.core`` names map to ``numpy._core``)."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("numpy.core"):
            module = "numpy._core" + module[len("numpy.core") :]
        if (module, name) not in _NUMPY_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return super().find_class(module, name)


def unpickle(data: bytes, where: str, encoding: str) -> Any:
    """The object pickled in ``data``, built from numpy-array globals only; :class:`DataError` naming
    ``where`` if the bytes are not such a pickle."""
    try:
        return _ArrayUnpickler(io.BytesIO(data), encoding=encoding).load()
    except Exception as error:  # any failure inside pickle means the file is malformed
        raise DataError(f"{where}: not a valid pickle ({type(error).__name__}: {error})") from error
