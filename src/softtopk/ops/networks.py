"""Sorting and selection network topologies (comparator layouts, and their index tensors: the
relaxed sweeps' :func:`network_plan`; no relaxation).

A network acts on ``n`` wires. Each layer is a set of comparators on disjoint wires; a comparator
``(hi, lo)`` leaves the larger of its two values on wire ``hi`` and the smaller on wire ``lo``.
After the last layer, the value of rank ``r`` (``r = 0`` the largest) sits on wire
``out_wires[r]``. Full sorters define ``out_wires`` for all ``n`` ranks, selection networks for the
top ``k`` only.

All three layouts follow difftopk/diffsort's orientation (ascending outputs, the maximum on the last
wire), so that the same relaxation gives the same numbers as the originals wherever their networks
are correct. Unlike the originals, every network here sorts (or selects) for every ``n``:

* ``bitonic`` — Batcher's bitonic sorter. For ``n`` a power of two it is the classic layout with
  alternating directions. For other ``n`` below 512 it is diffsort's layout wherever that sorts: the
  classic layout on ``2**ceil(log2 n)`` wires whose lowest wires are dropped together with every
  comparator touching them. That layout does not sort every ``n`` (among 3..69 it fails for 22, 38,
  42-46 and 54); whether it sorts is decided when the network is built, by running it with exact
  comparators on every 0-1 row with a single 1 or a single 0 and on 1024 seeded random rows (these
  find exactly the failing ``n`` that 200,000 random rows and, for n <= 16, all 0-1 rows find).
  Elsewhere it is the single-direction layout (first layer of each merge compares mirrored wires)
  on ``2**ceil(log2 n)`` wires with the top wires padded by ``+inf``: every comparator touching a
  padding wire is an identity, so dropping it is exact, and it sorts every ``n``.
* ``odd_even`` — odd-even transposition sort, ``n`` layers of neighbour comparators.
* ``splitter_selection`` — Borgelt's top-k selection network built from splitter cascades
  (Petersen et al., ICML 2022, appendix), ``O(log n)`` layers for small ``k``.

References: K. E. Batcher, "Sorting networks and their applications", 1968; F. Petersen et al.,
"Differentiable Top-k Classification Learning", ICML 2022.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

import torch

from .compute import constant_result

NETWORK_TYPES = ("bitonic", "odd_even", "splitter_selection")


@dataclass(frozen=True, eq=False)
class Network:
    """A comparator network: ``layers[l]`` is a tuple of ``(hi, lo)`` wire pairs.

    Compared and hashed by identity: :func:`build_network` returns one object per key, so the
    per-device tensor cache does not re-hash every comparator on each call.
    """

    kind: str
    n: int
    layers: tuple[tuple[tuple[int, int], ...], ...]
    out_wires: tuple[int, ...]

    @property
    def n_comparators(self) -> int:
        return sum(len(layer) for layer in self.layers)


_DIFFSORT_BELOW = 512


def _diffsort_bitonic_layers(n: int) -> list[list[tuple[int, int]]]:
    """diffsort's rule: the classic (alternating) layout on ``2**d`` wires without its lowest
    ``2**d - n`` wires and every comparator touching them."""
    depth = max(1, math.ceil(math.log2(n)))
    dropped = 2**depth - n
    layers = []
    for block in range(depth):
        for step in range(block + 1):
            dist = 2 ** (block - step)
            layer = []
            for start in range(0, 2**depth, 2 * dist):
                for a in range(start, start + dist):
                    lo, hi = (a + dist, a) if (a >> (block + 1)) & 1 else (a, a + dist)
                    if min(a, a + dist) >= dropped:
                        layer.append((hi - dropped, lo - dropped))
            layers.append(layer)
    return layers


def _sorts(n: int, layers: list[list[tuple[int, int]]]) -> bool:
    """Whether ``layers`` with exact comparators sort the 0-1 rows with a single 1 or a single 0 and
    1024 rows of uniform numbers from Python's ``random.Random(n)`` (ascending: the maximum on the
    last wire). No torch random numbers: a network may be built inside ``torch.func.vmap``."""
    rng = random.Random(n)
    eye = torch.eye(n, dtype=torch.float64)
    uniform = torch.tensor([rng.random() for _ in range(1024 * n)], dtype=torch.float64).view(1024, n)
    rows = torch.cat([eye, 1 - eye, uniform])
    wires = rows.clone()
    for layer in layers:
        if layer:
            hi, lo = torch.tensor(layer).T
            a, b = wires[:, hi], wires[:, lo]
            wires[:, hi], wires[:, lo] = torch.maximum(a, b), torch.minimum(a, b)
    return torch.equal(wires, rows.sort(-1).values)


def _bitonic_layers(n: int) -> list[list[tuple[int, int]]]:
    if n < 2:  # nothing to compare
        return []
    depth = max(1, math.ceil(math.log2(n)))
    size = 2**depth
    if size != n and n < _DIFFSORT_BELOW:
        original = _diffsort_bitonic_layers(n)
        if _sorts(n, original):
            return original
    layers: list[list[tuple[int, int]]] = []
    classic = size == n
    for block in range(depth):
        for step in range(block + 1):
            dist = 2 ** (block - step)
            layer = []
            for start in range(0, size, 2 * dist):
                for j in range(dist):
                    a, b = start + j, start + j + dist
                    if not classic and step == 0:
                        # mirrored comparator of the single-direction layout
                        b = start + 2 * dist - 1 - j
                    descending = classic and (a >> (block + 1)) & 1
                    hi, lo = (a, b) if descending else (b, a)
                    if max(a, b) < n:
                        layer.append((hi, lo))
            layers.append(layer)
    return layers


def _odd_even_layers(n: int) -> list[list[tuple[int, int]]]:
    return [[(i + 1, i) for i in range(t % 2, n - 1, 2)] for t in range(n)]


def _split_cascade(lanes: list[int]) -> list[list[tuple[int, int]]]:
    """Splitter cascade on ``lanes``: lane ``lanes[j]`` gains minimum rank ``2**popcount(j) - 1``.

    Level ``l`` compares lane ``j`` with lane ``j + h`` (``h = 2**(depth - 1 - l)``) for every ``j``
    in the lower half of its block of ``2h`` lanes; the lower-indexed lane takes the maximum.
    """
    if len(lanes) < 2:
        return []
    depth = (len(lanes) - 1).bit_length()
    halves = [1 << (depth - 1 - level) for level in range(depth)]
    return [[(lanes[j], lanes[j + h]) for j in range(len(lanes) - h) if not j & h] for h in halves]


def _splitter_selection_layers(n: int, k: int) -> list[list[tuple[int, int]]]:
    # Built descending (lane 0 = maximum, a comparator's first lane takes the max), then mirrored.
    min_rank = [0] * n
    free_at = [0] * n
    layers: list[list[tuple[int, int]]] = []
    rank_end = -1
    added = True
    while added:
        added = False
        for rank in range(k - 1, rank_end, -1):
            group = [lane for lane in range(n) if min_rank[lane] == rank]
            if len(group) < 2:
                continue
            cascade = _split_cascade(group)
            offset = max(free_at[lane] for lane in group)
            while len(layers) < offset + len(cascade):
                layers.append([])
            for i, comparators in enumerate(cascade):
                layers[offset + i].extend(comparators)
            for pos, lane in enumerate(group):
                min_rank[lane] += 2 ** bin(pos).count("1") - 1
                free_at[lane] = offset + len(cascade)
            added = True
        rank_end += 1
    return [[(n - 1 - a, n - 1 - b) for a, b in layer] for layer in layers]


@functools.lru_cache(maxsize=256)
def build_network(kind: str, n: int, k: int) -> Network:
    """The comparator network of type ``kind`` for ``n`` wires whose top ``k`` outputs are exact.

    Cached per ``(kind, n, k)``; ``k`` only shapes ``splitter_selection`` (sorters ignore it).
    """
    if kind == "bitonic":
        layers, out_len = _bitonic_layers(n), n
    elif kind == "odd_even":
        layers, out_len = _odd_even_layers(n), n
    elif kind == "splitter_selection":
        layers, out_len = _splitter_selection_layers(n, k), k
    else:  # validated by callers; kept for direct use
        raise ValueError(f"network type must be one of {NETWORK_TYPES}, got {kind!r}")
    layers = [layer for layer in layers if layer]
    return Network(
        kind=kind,
        n=n,
        layers=tuple(tuple(layer) for layer in layers),
        out_wires=tuple(n - 1 - r for r in range(out_len)),
    )


def layer_tensors(network: Network, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partner, sign)``, each ``(L, n)``: per layer, each wire's comparator partner (itself when
    idle) and ``+1`` on a comparator's max wire, ``-1`` on its min wire, ``0`` on an idle wire."""
    return _layer_tensors(network, str(device))


@functools.lru_cache(maxsize=256)
def _layer_tensors(network: Network, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    n, depth = network.n, len(network.layers)
    partner = torch.arange(n).repeat(depth, 1)
    sign = torch.zeros(depth, n)
    for index, layer in enumerate(network.layers):
        if layer:
            hi, lo = torch.tensor(layer).T
            partner[index, hi], partner[index, lo] = lo, hi
            sign[index, hi], sign[index, lo] = 1.0, -1.0
    return partner.to(device), sign.to(device)


@constant_result
def network_plan(kind: str, n: int, k: int, device: str, dtype: str) -> tuple:
    """``(depth, partner (L, n), sign (L, n, 1), out_wires[:k] (k,), half (1,), starts, flat)`` of a
    network, on ``device`` in ``dtype`` (constants of the traced graph under ``torch.compile``);
    ``starts`` (k + 1, n): the indicators of the wires of ranks ``0..k-1``, then of all of them (the
    mask's); ``flat`` (L n,): the partners as rows of the layers stacked (``l n + partner[l]``)."""
    return _cached_plan(kind, n, k, device, dtype)


@functools.lru_cache(maxsize=256)
def _cached_plan(kind: str, n: int, k: int, device: str, dtype: str) -> tuple:
    network = build_network(kind, n, k if kind == "splitter_selection" else n)
    partner, sign = layer_tensors(network, torch.device("cpu"))
    if not network.layers:  # one wire: an idle layer (every wire its own partner, sign 0) keeps it
        partner, sign = torch.arange(n).unsqueeze(0), torch.zeros(1, n)
    real = getattr(torch, dtype.removeprefix("torch."))
    out = torch.tensor(network.out_wires[:k], dtype=torch.long)
    half = torch.full((1,), 0.5, dtype=real)
    starts = torch.zeros(k + 1, n, dtype=real)
    starts[torch.arange(k), out] = starts[k, out] = 1.0
    flat = (partner + n * torch.arange(len(partner)).unsqueeze(-1)).flatten()
    tensors = (partner, sign.to(real).unsqueeze(-1), out, half, starts, flat)
    return (len(partner), *(t.to(device) for t in tensors))
