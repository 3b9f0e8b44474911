"""Topology tests for :func:`softtopk.ops.networks.build_network`.

Every network is simulated *hard* here, with exact ``max``/``min`` comparators written in numpy and
independent of the library's relaxation code:

* the 0-1 principle, checked exhaustively (all ``2**n`` inputs, bit-parallel) for every ``n`` in
  2..20 (and the bitonic sorter up to n = 23, past difftopk's first failing size n = 22);
* random inputs (distinct values and heavy ties) for every ``n`` in 2..300 and a few large sizes,
  checking the full top-k set *and* order on ``out_wires``;
* layer validity, the comparator/layer counts of REFERENCE.md §1.3, caching and device placement.

A comparator ``(hi, lo)`` leaves the larger value on wire ``hi``; after the last layer the value of
rank ``r`` (0 = largest) sits on ``out_wires[r]``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from softtopk.ops.networks import NETWORK_TYPES, Network, build_network, layer_tensors

SORTERS = ("bitonic", "odd_even")


# --------------------------------------------------------------------------------------------
# Hard simulation helpers
# --------------------------------------------------------------------------------------------


def _layer_arrays(network: Network) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.array([c[0] for c in layer]), np.array([c[1] for c in layer])) for layer in network.layers]


def simulate_hard(network: Network, x: np.ndarray) -> np.ndarray:
    """Run ``network`` with exact comparators on the rows of ``x`` (B, n); return the wires (B, n)."""
    wires = np.array(x, copy=True)
    for hi, lo in _layer_arrays(network):
        a, b = wires[:, hi], wires[:, lo]
        wires[:, hi], wires[:, lo] = np.maximum(a, b), np.minimum(a, b)
    return wires


def simulate_all_01_inputs(network: Network) -> list[np.ndarray]:
    """Bit-parallel run on all ``2**n`` 0-1 inputs: input ``m`` has bit ``w`` of ``m`` on wire ``w``.

    Returns one packed ``uint8`` array per wire (bit ``m`` = the wire's value for input ``m``);
    a comparator is ``(hi, lo) <- (a | b, a & b)``.
    """
    n = network.n
    inputs = np.arange(2**n, dtype=np.uint32)
    wires = [np.packbits(((inputs >> w) & 1).astype(bool)) for w in range(n)]
    for layer in network.layers:
        for hi, lo in layer:
            a, b = wires[hi], wires[lo]
            wires[hi], wires[lo] = a | b, a & b
    return wires


def expected_01_ranks(n: int, ranks: int) -> list[np.ndarray]:
    """Packed truth for all 0-1 inputs: the value of rank ``r`` is 1 iff the input has > r ones."""
    ones = np.bitwise_count(np.arange(2**n, dtype=np.uint32))
    return [np.packbits(ones > r) for r in range(ranks)]


def assert_01_principle(network: Network, k: int) -> None:
    wires = simulate_all_01_inputs(network)
    truth = expected_01_ranks(network.n, k)
    for r in range(k):
        got = wires[network.out_wires[r]]
        if not np.array_equal(got, truth[r]):
            bad = int(np.flatnonzero(np.unpackbits(got ^ truth[r]))[0])
            pattern = [(bad >> w) & 1 for w in range(network.n)]
            raise AssertionError(f"{network.kind} n={network.n} k={k}: rank {r} wrong for 0-1 input {pattern}")


def assert_selects_topk(network: Network, k: int, x: np.ndarray) -> None:
    """The values on ``out_wires[:k]`` are the k largest of each row, in descending order."""
    wires = simulate_hard(network, x)
    got = wires[:, list(network.out_wires[:k])]
    want = -np.sort(-x, axis=1)[:, :k]
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, (
        f"{network.kind} n={network.n} k={k}: {bad.size}/{len(x)} rows wrong, e.g. input "
        f"{x[bad[0]].tolist()} gave {got[bad[0]].tolist()}, expected {want[bad[0]].tolist()}"
    )


def random_inputs(n: int, rows: int, seed: int) -> np.ndarray:
    """Distinct values (random permutations) plus rows with heavy ties (few distinct values)."""
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((rows, n)), axis=1).astype(np.float64)
    ties = rng.integers(0, 3, size=(rows // 4, n)).astype(np.float64)
    return np.concatenate([perms, ties])


def splitter_ks(n: int) -> list[int]:
    return sorted({k for k in (1, 2, 3, 5, n - 1, n) if 1 <= k <= n})


# --------------------------------------------------------------------------------------------
# (a) 0-1 principle, exhaustive
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SORTERS)
def test_sorters_pass_the_01_principle_exhaustively_for_n_up_to_20(kind):
    """Every 0-1 input of every size 2..20 comes out fully sorted (so every input does)."""
    for n in range(2, 21):
        net = build_network(kind, n, n)
        assert len(net.out_wires) == n
        assert_01_principle(net, n)


def test_bitonic_passes_the_01_principle_exhaustively_for_n_21_to_23():
    """n = 22 is difftopk's smallest failing size (ones at wires 0 and 2 → ones at 19 and 21)."""
    for n in range(21, 24):
        assert_01_principle(build_network("bitonic", n, n), n)


def test_splitter_selection_passes_the_01_principle_exhaustively_for_n_up_to_20():
    """The top-k outputs are exact for every 0-1 input, n in 2..20, k in {1, 2, 3, 5, n-1, n}."""
    for n in range(2, 21):
        for k in splitter_ks(n):
            net = build_network("splitter_selection", n, k)
            assert len(net.out_wires) == k
            assert_01_principle(net, k)


def test_difftopk_counterexample_for_n_22_is_sorted():
    """REFERENCE.md §7.1: difftopk's bitonic n = 22 maps ones at wires 0, 2 to wires 19, 21."""
    x = np.zeros((1, 22))
    x[0, [0, 2]] = 1.0
    net = build_network("bitonic", 22, 22)
    out = simulate_hard(net, x)[0, list(net.out_wires)]
    assert out.tolist() == [1.0, 1.0] + [0.0] * 20


def test_hard_simulation_detects_a_broken_network():
    """The checker itself can fail: dropping the last layer of a sorter breaks both checks."""
    good = build_network("bitonic", 8, 8)
    broken = Network(good.kind, good.n, good.layers[:-1], good.out_wires)
    with pytest.raises(AssertionError):
        assert_01_principle(broken, 8)
    with pytest.raises(AssertionError):
        assert_selects_topk(broken, 8, random_inputs(8, 64, seed=0))


# --------------------------------------------------------------------------------------------
# (b) random inputs, every n in 2..300 and a few large sizes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SORTERS)
def test_sorters_sort_random_inputs_for_every_n_up_to_300(kind):
    """Full sorted order on all n outputs (distinct values and ties), every n in 2..300."""
    rows = 32 if kind == "odd_even" else 64
    for n in range(2, 301):
        assert_selects_topk(build_network(kind, n, n), n, random_inputs(n, rows, seed=n))


@pytest.mark.parametrize("k", [1, 5])
def test_splitter_selection_selects_random_inputs_for_every_n_up_to_300(k):
    """Top-k set and order exact on ``out_wires[:k]`` for every n in max(k, 2)..300."""
    for n in range(max(k, 2), 301):
        assert_selects_topk(build_network("splitter_selection", n, k), k, random_inputs(n, 64, seed=n))


@pytest.mark.parametrize("n", [500, 1000, 1023, 1025])
def test_large_bitonic_sorts_random_inputs(n):
    assert_selects_topk(build_network("bitonic", n, n), n, random_inputs(n, 32, seed=n))


@pytest.mark.parametrize("n", [500, 1000, 1023, 1025])
@pytest.mark.parametrize("k", [1, 5, 16])
def test_large_splitter_selection_selects_random_inputs(n, k):
    assert_selects_topk(build_network("splitter_selection", n, k), k, random_inputs(n, 32, seed=n + k))


# --------------------------------------------------------------------------------------------
# (c) structure and sizes
# --------------------------------------------------------------------------------------------


def _all_networks():
    for n in list(range(2, 70)) + [100, 127, 128, 129, 255, 256, 257, 1000]:
        yield build_network("bitonic", n, n)
        if n <= 300:
            yield build_network("odd_even", n, n)
        for k in splitter_ks(n) if n <= 300 else (1, 5, 16):
            yield build_network("splitter_selection", n, k)


def test_layers_are_valid():
    """Each layer: comparators on distinct in-range wires, no wire used twice; no empty layer;
    ``out_wires`` distinct and in range."""
    for net in _all_networks():
        assert net.kind in NETWORK_TYPES
        assert len(set(net.out_wires)) == len(net.out_wires)
        assert all(0 <= w < net.n for w in net.out_wires)
        for index, layer in enumerate(net.layers):
            assert layer, f"{net.kind} n={net.n}: empty layer {index}"
            wires = [w for comparator in layer for w in comparator]
            assert all(len(c) == 2 for c in layer)
            assert all(isinstance(w, int) and 0 <= w < net.n for w in wires), (net.kind, net.n, index)
            assert len(set(wires)) == len(wires), f"{net.kind} n={net.n}: layer {index} reuses a wire"
        assert net.n_comparators == sum(len(layer) for layer in net.layers)


@pytest.mark.parametrize(
    "kind, n, k, layers, comparators",
    [
        ("bitonic", 16, 16, 10, 80),
        ("bitonic", 64, 64, 21, 672),
        ("bitonic", 256, 256, 36, 4608),
        ("odd_even", 16, 16, 16, 120),
        ("odd_even", 64, 64, 64, 2016),
        ("odd_even", 100, 100, 100, 4950),
        ("splitter_selection", 16, 5, 10, 50),
        ("splitter_selection", 64, 5, 15, 240),
        ("splitter_selection", 100, 5, 17, 385),
        ("splitter_selection", 256, 5, 18, 1118),
        ("splitter_selection", 1000, 5, 22, 5085),
        ("splitter_selection", 16, 1, 4, 32),
        ("splitter_selection", 64, 1, 6, 192),
        ("splitter_selection", 100, 1, 7, 316),
        ("splitter_selection", 256, 1, 8, 1024),
        ("splitter_selection", 1000, 1, 10, 4932),
    ],
)
def test_sizes_match_reference_table(kind, n, k, layers, comparators):
    """REFERENCE.md §1.3 (measured on difftopk). Bitonic only for powers of two: for other n our
    padded construction intentionally differs from difftopk's (which does not sort)."""
    net = build_network(kind, n, k)
    assert (len(net.layers), net.n_comparators) == (layers, comparators)


@pytest.mark.parametrize("n", [3, 5, 22, 100, 1000, 1025])
def test_bitonic_for_non_powers_of_two_is_no_deeper_than_the_padded_sorter(n):
    """Padding to 2**B wires and dropping the padding comparators: B(B+1)/2 layers at most and
    fewer comparators than the full power-of-two network."""
    depth = int(np.ceil(np.log2(n)))
    net = build_network("bitonic", n, n)
    assert len(net.layers) <= depth * (depth + 1) // 2
    assert net.n_comparators < depth * (depth + 1) // 2 * 2 ** (depth - 1)


def test_odd_even_uses_only_neighbour_comparators():
    net = build_network("odd_even", 9, 9)
    assert all(abs(hi - lo) == 1 and hi > lo for layer in net.layers for hi, lo in layer)


def test_unknown_network_type_raises():
    with pytest.raises(ValueError, match="network type"):
        build_network("bubble", 8, 8)


# --------------------------------------------------------------------------------------------
# (d) caching and layer tensors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", NETWORK_TYPES)
def test_build_network_is_cached(kind):
    first = build_network(kind, 37, 5)
    assert build_network(kind, 37, 5) is first
    assert build_network(kind, 38, 5) is not first


def test_layer_tensors_encode_the_layers():
    """``partner`` is an involution pairing each comparator's wires (idle wires map to themselves);
    ``sign`` is +1 on the max wire, -1 on the min wire, 0 when idle."""
    for net in [
        build_network("bitonic", 13, 13),
        build_network("splitter_selection", 20, 3),
        build_network("odd_even", 6, 6),
    ]:
        partner, sign = layer_tensors(net, torch.device("cpu"))
        depth = len(net.layers)
        assert partner.shape == sign.shape == (depth, net.n)
        assert partner.dtype == torch.int64 and sign.is_floating_point()
        wires = torch.arange(net.n)
        for index, layer in enumerate(net.layers):
            assert torch.equal(partner[index][partner[index]], wires)
            want_partner, want_sign = wires.clone(), torch.zeros(net.n)
            for hi, lo in layer:
                want_partner[hi], want_partner[lo] = lo, hi
                want_sign[hi], want_sign[lo] = 1.0, -1.0
            assert torch.equal(partner[index], want_partner)
            assert torch.equal(sign[index], want_sign)


def _devices():
    devices = ["cpu", "meta"]
    if torch.cuda.is_available():
        devices.append("cuda")
    return devices


@pytest.mark.parametrize("device", _devices())
def test_layer_tensors_respect_device_and_are_cached(device):
    net = build_network("bitonic", 12, 12)
    partner, sign = layer_tensors(net, torch.device(device))
    assert partner.device.type == device and sign.device.type == device
    again = layer_tensors(net, torch.device(device))
    assert again[0] is partner and again[1] is sign
    if device != "cpu":
        cpu_partner, _ = layer_tensors(net, torch.device("cpu"))
        assert cpu_partner.device.type == "cpu"
