"""Bad arguments raise ``ValueError``/``TypeError`` whose message names the argument and shows the
bad value (never an ``AssertionError`` or a deep shape error). One test per message."""

from __future__ import annotations

import math
import re

import pytest
import torch

import softtopk
from softtopk.functional import topk_cross_entropy

OPERATORS = {
    "soft_topk": lambda x, k=2, **kw: softtopk.soft_topk(x, k, **kw),
    "soft_topk_ranks": lambda x, k=2, **kw: softtopk.soft_topk_ranks(x, k, **kw),
    "soft_permutation": lambda x, k=None, **kw: softtopk.soft_permutation(x, **kw),
}
K_OPERATORS = ("soft_topk", "soft_topk_ranks")
X = torch.randn(3, 5)


def _match(*parts: str) -> str:
    """A regex requiring the literal ``parts`` in this order."""
    return ".*".join(re.escape(part) for part in parts)


# ------------------------------------------------------------------- operators: k, dim, x


@pytest.mark.parametrize("operator", K_OPERATORS)
@pytest.mark.parametrize("k", [0, 6, -1])
def test_k_out_of_range(operator, k):
    with pytest.raises(ValueError, match=_match("k must satisfy 1 <= k <= n = 5", f"got {k}")):
        OPERATORS[operator](X, k, method="bitonic")


@pytest.mark.parametrize("operator", K_OPERATORS)
@pytest.mark.parametrize(
    "k,shown", [(2.5, "float 2.5"), (True, "bool True"), (torch.tensor(2), "Tensor tensor(2)"), ("2", "str '2'")]
)
def test_k_not_an_int(operator, k, shown):
    with pytest.raises(TypeError, match=_match("k must be an int", shown)):
        OPERATORS[operator](X, k, method="neuralsort")


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("dim", [2, -3, 10])
def test_dim_out_of_range(operator, dim):
    with pytest.raises(ValueError, match=_match("dim must be in [-2, 1] for a 2-d input", f"got {dim}")):
        OPERATORS[operator](X, method="softsort", dim=dim)


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize(
    "dim,shown", [(1.0, "float 1.0"), ("0", "str '0'"), (True, "bool True"), (None, "NoneType None")]
)
def test_dim_not_an_int(operator, dim, shown):
    with pytest.raises(TypeError, match=_match("dim must be an int", shown)):
        OPERATORS[operator](X, method="odd_even", dim=dim)


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_scores(operator, dtype):
    with pytest.raises(TypeError, match=_match("x must have a floating dtype", f"got {dtype}")):
        OPERATORS[operator](torch.ones(2, 4, dtype=dtype), method="bitonic")


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("x,shown", [([1.0, 2.0, 3.0], "list"), (None, "NoneType")])
def test_x_not_a_tensor(operator, x, shown):
    import numpy as np

    with pytest.raises(TypeError, match=_match("x must be a torch.Tensor", f"got {shown}")):
        OPERATORS[operator](x, 1, method="bitonic")
    with pytest.raises(TypeError, match=_match("x must be a torch.Tensor", "got ndarray")):
        OPERATORS[operator](np.ones(3), 1, method="bitonic")


@pytest.mark.parametrize("operator", OPERATORS)
def test_zero_dimensional_x(operator):
    with pytest.raises(ValueError, match=_match("x must have at least one dimension", "0-d")):
        OPERATORS[operator](torch.tensor(1.0), 1, method="bitonic")


# ------------------------------------------------------------------- methods and parameters


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("method", ["quicksort", "Bitonic", None, 3])
def test_unknown_method_lists_the_valid_ones(operator, method):
    valid = str(sorted(softtopk.methods()))
    with pytest.raises(ValueError, match=_match("method must be one of", valid, f"got {method!r}")):
        OPERATORS[operator](X, method=method)


def test_unknown_method_in_loss_and_module():
    valid = str(sorted(softtopk.methods()))
    with pytest.raises(ValueError, match=_match("method must be one of", valid, "got 'sinkhorn'")):
        topk_cross_entropy(X, torch.tensor([0, 1, 2]), [0.5, 0.5], method="sinkhorn")
    with pytest.raises(ValueError, match=_match("method must be one of", valid, "got 'sinkhorn'")):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], method="sinkhorn")


@pytest.mark.parametrize(
    "method,params,bad",
    [
        ("bitonic", {"tau": 1.0}, "['tau']"),
        ("neuralsort", {"steepness": 1.0}, "['steepness']"),
        ("neuralsort", {"power": 2.0}, "['power']"),  # only SoftSort has power
        ("softsort", {"temperature": 1.0, "beta": 2}, "['beta', 'temperature']"),
    ],
)
def test_unknown_method_parameter(method, params, bad):
    with pytest.raises(TypeError, match=_match(f"method {method!r} got unexpected parameter(s) {bad}", "it takes")):
        softtopk.soft_topk(X, 2, method=method, **params)
    with pytest.raises(TypeError, match=_match(f"method {method!r} got unexpected parameter(s) {bad}")):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], method=method, **params)


@pytest.mark.parametrize("distribution", ["laplace", "Cauchy", None])
def test_unknown_distribution(distribution):
    with pytest.raises(ValueError, match=_match("distribution must be one of", "'cauchy'", f"got {distribution!r}")):
        softtopk.soft_topk_ranks(X, 2, method="splitter_selection", distribution=distribution)
    with pytest.raises(ValueError, match=_match("distribution must be one of", f"got {distribution!r}")):
        softtopk.TopKCrossEntropyLoss([1.0], method="bitonic", distribution=distribution)


@pytest.mark.parametrize(
    "method,name", [("bitonic", "steepness"), ("odd_even", "steepness"), ("neuralsort", "tau"), ("softsort", "tau")]
)
@pytest.mark.parametrize("value", [-1.0, 0, 0.0, math.inf, -math.inf, math.nan])
def test_temperature_not_positive_finite(method, name, value):
    with pytest.raises(ValueError, match=_match(f"{name} must be a positive finite number", f"got {value!r}")):
        softtopk.soft_topk(X, 2, method=method, **{name: value})
    with pytest.raises(ValueError, match=_match(f"{name} must be a positive finite number", f"got {value!r}")):
        topk_cross_entropy(X, torch.tensor([0, 1, 2]), [1.0], method=method, **{name: value})


@pytest.mark.parametrize("value,shown", [("1.0", "str '1.0'"), (True, "bool True"), (None, "NoneType None")])
def test_temperature_not_a_number(value, shown):
    with pytest.raises(TypeError, match=_match("steepness must be a real number", shown)):
        softtopk.soft_topk(X, 2, method="bitonic", steepness=value)
    with pytest.raises(TypeError, match=_match("tau must be a real number", shown)):
        softtopk.soft_topk(X, 2, method="softsort", tau=value)


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, math.nan])
def test_art_lambda_outside_unit_interval(value):
    with pytest.raises(ValueError, match=_match("art_lambda must be in [0, 1)", f"got {value!r}")):
        softtopk.soft_topk(X, 2, method="bitonic", distribution="logistic_phi", art_lambda=value)


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
@pytest.mark.parametrize("value,shown", [(1, "int 1"), ("yes", "str 'yes'"), (None, "NoneType None")])
def test_hard_not_bool(method, value, shown):
    with pytest.raises(TypeError, match=_match("hard must be a bool", shown)):
        softtopk.soft_topk_ranks(X, 2, method=method, hard=value)


@pytest.mark.parametrize("value", [0.5, 0.0, -2.0, math.inf, math.nan])
def test_power_below_one(value):
    with pytest.raises(ValueError, match=_match("power must be a finite number >= 1", f"got {value!r}")):
        softtopk.soft_permutation(X, method="softsort", power=value)


# ------------------------------------------------------------------- loss arguments

INPUT = torch.randn(4, 10)
TARGET = torch.tensor([0, 3, 9, 5])


def _loss(input=INPUT, target=TARGET, p_k=(0.5, 0.5), **kwargs):
    return topk_cross_entropy(input, target, list(p_k) if isinstance(p_k, tuple) else p_k, **kwargs)


@pytest.mark.parametrize("bad", [-5, -1, 10, 1000])
def test_label_out_of_range(bad):
    target = TARGET.clone()
    target[2] = bad
    with pytest.raises(
        ValueError, match=_match("target values must be in [0, 9] (or ignore_index=-100)", f"got {bad}")
    ):
        _loss(target=target)
    with pytest.raises(ValueError, match=_match("target values must be in [0, 9]", f"got {bad}")):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5])(INPUT, target)


def test_label_equal_to_a_different_ignore_index_is_still_out_of_range():
    target = TARGET.clone()
    target[0] = -100
    with pytest.raises(ValueError, match=_match("(or ignore_index=-1)", "got -100")):
        _loss(target=target, ignore_index=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_float_labels(dtype):
    with pytest.raises(TypeError, match=_match("target must hold integer class indices", f"got dtype {dtype}")):
        _loss(target=TARGET.to(dtype))


def test_target_not_a_tensor():
    with pytest.raises(TypeError, match=_match("target must be a torch.Tensor", "got list")):
        _loss(target=[0, 3, 9, 5])


@pytest.mark.parametrize("shape", [(4, 1), (3,), (4, 10), ()])
def test_wrong_target_shape(shape):
    target = torch.zeros(shape, dtype=torch.long)
    with pytest.raises(
        ValueError, match=_match("target must have shape (4,) for input of shape (4, 10)", f"got {shape}")
    ):
        _loss(target=target)


def test_wrong_target_shape_with_extra_dimensions():
    with pytest.raises(
        ValueError, match=_match("target must have shape (2, 3) for input of shape (2, 5, 3)", "got (2, 5)")
    ):
        _loss(input=torch.randn(2, 5, 3), target=torch.zeros(2, 5, dtype=torch.long))


def test_input_without_class_dimension():
    with pytest.raises(ValueError, match=_match("input must have shape (N, C) or (N, C, d1, ...)", "got (10,)")):
        _loss(input=torch.randn(10), target=torch.zeros((), dtype=torch.long))


def test_zero_dimensional_input():
    with pytest.raises(ValueError, match=_match("input must have at least one dimension", "0-d")):
        _loss(input=torch.tensor(1.0), target=torch.zeros((), dtype=torch.long))


def test_integer_input():
    with pytest.raises(TypeError, match=_match("input must have a floating dtype", "got torch.int64")):
        _loss(input=torch.ones(4, 10, dtype=torch.long))


@pytest.mark.parametrize("p_k,total", [([0.5, 0.2], "0.7"), ([0.6, 0.6], "1.2"), ([0.0, 0.0], "0.0")])
def test_p_k_not_summing_to_one(p_k, total):
    with pytest.raises(ValueError, match=_match("p_k must sum to 1", f"got {p_k}", f"summing to {total}")):
        _loss(p_k=p_k)
    with pytest.raises(ValueError, match=_match("p_k must sum to 1", f"got {p_k}")):
        softtopk.TopKCrossEntropyLoss(p_k)


@pytest.mark.parametrize("p_k", [[1.5, -0.5], [-0.0001, 1.0001], [math.nan, 1.0], [math.inf, 0.0]])
def test_negative_or_non_finite_p_k_entry(p_k):
    with pytest.raises(ValueError, match=_match("p_k entries must be finite and >= 0", f"got {p_k}")):
        _loss(p_k=p_k)
    with pytest.raises(ValueError, match=_match("p_k entries must be finite and >= 0", f"got {p_k}")):
        softtopk.TopKCrossEntropyLoss(p_k)


def test_p_k_longer_than_number_of_classes():
    with pytest.raises(ValueError, match=_match("p_k must not be longer than the number of classes 4", "got length 5")):
        _loss(input=torch.randn(3, 4), target=torch.tensor([0, 1, 3]), p_k=[0.2] * 5)


@pytest.mark.parametrize("p_k,shown", [([], "[]"), ((), "()")])
def test_empty_p_k(p_k, shown):
    with pytest.raises(TypeError, match=_match("p_k must be a non-empty sequence of floats", f"got {shown}")):
        topk_cross_entropy(INPUT, TARGET, p_k)
    with pytest.raises(TypeError, match=_match("p_k must be a non-empty sequence of floats", f"got {shown}")):
        softtopk.TopKCrossEntropyLoss(p_k)


@pytest.mark.parametrize("p_k", ["1", "0.5,0.5", b"1"])
def test_p_k_a_string(p_k):
    with pytest.raises(TypeError, match=_match("p_k must be a non-empty sequence of floats", f"got {p_k!r}")):
        topk_cross_entropy(INPUT, TARGET, p_k)


@pytest.mark.parametrize("p_k", [[0.5, "0.5"], [True, 0.0], [None, 1.0]])
def test_p_k_entries_not_numbers(p_k):
    with pytest.raises(TypeError, match=_match("p_k must hold real numbers", f"got {p_k!r}")):
        _loss(p_k=p_k)


@pytest.mark.parametrize("m", [5, 3, 0, -2])
def test_m_not_larger_than_k(m):
    with pytest.raises(ValueError, match=_match("m must be >= 6 (larger than k = len(p_k) = 5)", f"got {m}")):
        _loss(p_k=[0.2] * 5, m=m)
    with pytest.raises(ValueError, match=_match("m must be >= 6 (larger than k = len(p_k) = 5)", f"got {m}")):
        softtopk.TopKCrossEntropyLoss([0.2] * 5, m=m)


@pytest.mark.parametrize("m", [10, 11, 100])
def test_m_not_smaller_than_number_of_classes(m):
    with pytest.raises(ValueError, match=_match("m must be <= 9 (smaller than the number of classes 10)", f"got {m}")):
        _loss(m=m)
    with pytest.raises(ValueError, match=_match("m must be <= 9 (smaller than the number of classes 10)", f"got {m}")):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], m=m)(INPUT, TARGET)


@pytest.mark.parametrize("m,shown", [(8.0, "float 8.0"), ("8", "str '8'"), (True, "bool True")])
def test_m_not_an_int(m, shown):
    with pytest.raises(TypeError, match=_match("m must be an int or None", shown)):
        _loss(m=m)
    with pytest.raises(TypeError, match=_match("m must be an int or None", shown)):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], m=m)


@pytest.mark.parametrize("mode", ["softmax", "SM", None, ""])
def test_bad_top1_mode(mode):
    with pytest.raises(ValueError, match=_match("top1_mode must be one of ('sm', 'smce', 'sort')", f"got {mode!r}")):
        _loss(top1_mode=mode)
    with pytest.raises(ValueError, match=_match("top1_mode must be one of", f"got {mode!r}")):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], top1_mode=mode)


@pytest.mark.parametrize("reduction", ["avg", "elementwise_mean", None, "MEAN"])
def test_bad_reduction(reduction):
    with pytest.raises(
        ValueError, match=_match("reduction must be one of ('mean', 'sum', 'none')", f"got {reduction!r}")
    ):
        _loss(reduction=reduction)
    with pytest.raises(ValueError, match=_match("reduction must be one of", f"got {reduction!r}")):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], reduction=reduction)


@pytest.mark.parametrize("shape", [(9,), (11,), (1, 10), ()])
def test_weight_wrong_shape(shape):
    weight = torch.ones(shape)
    expected = "(10,)" if len(shape) == 1 else "(C,)"
    with pytest.raises(ValueError, match=_match("weight must have shape (10,)", f"got {shape}")):
        _loss(weight=weight)
    if len(shape) == 1:  # any length is accepted at construction; checked at forward
        module = softtopk.TopKCrossEntropyLoss([0.5, 0.5], weight=weight)
        with pytest.raises(ValueError, match=_match(f"weight must have shape {expected}", f"got {shape}")):
            module(INPUT, TARGET)
    else:
        with pytest.raises(ValueError, match=_match("weight must have shape (C,)", f"got {shape}")):
            softtopk.TopKCrossEntropyLoss([0.5, 0.5], weight=weight)


@pytest.mark.parametrize("weight", [torch.ones(10, dtype=torch.long), [1.0] * 10, torch.ones(10, dtype=torch.bool)])
def test_weight_wrong_dtype(weight):
    with pytest.raises(TypeError, match=_match("weight must be a floating torch.Tensor of shape (C,) or None", "got")):
        _loss(weight=weight)
    with pytest.raises(TypeError, match=_match("weight must be a floating torch.Tensor", f"got {weight!r}")):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], weight=weight)


@pytest.mark.parametrize("ignore_index", [1.5, "-100", True, None])
def test_ignore_index_must_be_an_int(ignore_index):
    shown = f"{type(ignore_index).__name__} {ignore_index!r}"
    with pytest.raises(TypeError, match=_match("ignore_index must be an int", shown)):
        _loss(ignore_index=ignore_index)
    with pytest.raises(TypeError, match=_match("ignore_index must be an int", shown)):
        softtopk.SmoothTopKSVM(k=2, ignore_index=ignore_index)


def test_vocabulary_messages():
    """The shared checkers: one message shape for every bound (each family composes them)."""
    from softtopk import _validation as v

    with pytest.raises(ValueError, match=_match("n must be >= 2 (at least a pair)", "got 1")):
        v.check_int("n", 1, low=2, why=" (at least a pair)")
    with pytest.raises(ValueError, match=_match("n must be <= 3", "got 4")):
        v.check_int("n", 4, high=3)
    with pytest.raises(ValueError, match=_match("n must satisfy 1 <= n <= 3", "got 0")):
        v.check_int("n", 0, low=1, high=3)
    assert v.check_int("n", -7) == -7 and v.check_int("n", torch.tensor(3).item(), low=1) == 3
    with pytest.raises(ValueError, match=_match("a must be in [0, 1)", "got 1.0")):
        v.check_real("a", 1.0, low=0.0, below=1.0)
    with pytest.raises(ValueError, match=_match("b must be a finite number >= 0.5", "got 0.25")):
        v.check_real("b", 0.25, low=0.5)
    with pytest.raises(ValueError, match=_match("c must be a finite number", "got inf")):
        v.check_real("c", math.inf)
    with pytest.raises(ValueError, match=_match("p must be one of (2.0, 1.5)", "got True")):
        v.check_choice("p", True, (2.0, 1.5))  # a bool never equals a number here
    assert v.check_choice("p", 2, (2.0, 1.5)) == 2
    with pytest.raises(ValueError, match=_match("input has 4 classes", "built with n_classes = 5")):
        v.check_classes_match(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match=_match("noise must have shape (2, 3, 4): one noise draw", "got (2, 3, 5)")):
        v.check_noise("noise", torch.zeros(2, 3, 5), torch.Size([2, 3]), samples=4)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_class_weights_must_be_finite_and_non_negative(bad):
    """A negative weight made 'mean' a sum of signed terms (-21.9 where the loss is positive)."""
    weight = torch.ones(10)
    weight[3] = bad
    with pytest.raises(ValueError, match=_match("weight must hold finite values >= 0 (class weights)", f"got {bad!r}")):
        _loss(weight=weight)
    with pytest.raises(ValueError, match=_match("weight must hold finite values >= 0", f"got {bad!r}")):
        softtopk.SmoothTopKSVM(weight=weight)


@pytest.mark.parametrize(
    "method, name", [("lapsum", "tau"), ("sparse", "l"), ("bitonic", "steepness"), ("neuralsort", "tau")]
)
def test_a_tensor_parameter_on_another_device_is_named(method, name):
    x = torch.randn(2, 5, device="meta")
    with pytest.raises(ValueError, match=rf"^{name} must be on the same device as x \(meta\), got a tensor on cpu$"):
        softtopk.soft_topk(x, 2, method=method, **{name: torch.full((2,), 0.5)})
    with pytest.raises(ValueError, match=r"^k must be on the same device as x \(meta\), got a tensor on cpu$"):
        softtopk.soft_topk(x, torch.tensor([1.0, 2.0]))
    # a 0-d CPU tensor is accepted on any device, as in PyTorch's own ops
    assert softtopk.soft_topk(x, 2, method=method, **{name: torch.tensor(0.5)}).device.type == "meta"


@pytest.mark.parametrize(
    "method, name",
    [("neuralsort", "tau"), ("bitonic", "steepness"), ("softsort", "tau"), ("splitter_selection", "steepness")],
)
def test_a_loss_tensor_parameter_on_another_device_is_named_or_moved(method, name):
    """Top-k CE's tensor scales follow the operators' rule: a 0-d CPU tensor is moved to the
    input's device (run 15 on a GPU: it reached the kernels' launchers on the CPU), others raise."""
    x, target = torch.randn(4, 10, device="meta"), torch.zeros(4, dtype=torch.long, device="meta")
    loss = softtopk.topk_cross_entropy(x, target, [0.5, 0.5], method=method, **{name: torch.tensor(0.5)})
    assert loss.device.type == "meta"
    moved = rf"^{name} must be on the same device as input \(meta\), got a tensor on cpu$"
    with pytest.raises(ValueError, match=moved):
        softtopk.topk_cross_entropy(x, target, [0.5, 0.5], method=method, **{name: torch.full((1,), 0.5)})
