"""Rows of scores with ``±inf``, ties and the ends of float32's range, on which a mask's kernels
must follow the extended reals as its torch path does (``softtopk._extended``); shared by the
kernel tests of the masks."""

INF = float("inf")

EXTENDED_ROWS = [
    [1.0, INF, -INF, 2, 0, -1, 3, INF],
    [INF, INF, INF, 1, 2, 3, 4, 5],  # more +inf entries than k: a degenerate row
    [-INF, -INF, 1, -INF, -INF, -INF, -INF, -INF],  # fewer finite entries than k
    [-INF, -INF, 1, 2, -INF, -INF, -INF, -INF],
    [0.0] * 8,
    [3.4e38, -3.4e38, 1, 2, 0, 0, 0, 0],
]

# for k = 3: ties beside ±inf; a row with at most k entries above -inf (rows 1 and 4); +inf entries
# sharing the first ranks; all tied
PERMUTATION_ROWS = [
    [-INF, -1.0, 0.0, 0.0, 2.0, INF, 3.0, 3.0],
    [-INF, -INF, -INF, -INF, -INF, -INF, 1.0, 2.0],
    [INF, INF, INF, INF, 0.0, 1.0, -INF, 2.0],
    [0.0] * 8,
    [-INF] * 8,
]


def sweep_rows(big: float) -> list[list[float]]:
    """Rows for the networks' sweeps (for k = 3): ties beside ``±inf``, all tied, ``-inf`` entries
    and ties, and the ends ``±big`` of a dtype's finite range (times a steepness, they overflow)."""
    return [
        [-INF, -1.0, 0.0, 0.0, 0.0, 2.0, INF, INF],
        [0.0] * 8,
        [-INF, -INF, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0],
        [-big, -1.0, 0.0, 1.0, 2.0, 3.0, big / 2, big],
    ]


# top-k cross-entropy's selection of m = 16 from rows of 40 classes (tests/test_label_select*.py)
SELECTION_ROWS = [
    [1.0, INF, -INF, 2, 0, -1, 3, INF] * 5,  # +inf entries beyond the stand-in
    [-INF] * 38 + [1.0, 2.0],  # fewer finite entries than m: -inf others are selected
    [0.5] * 40,  # all tied
    [3.4e38, -3.4e38, 1, 2, 0, 0, 0, 0] * 5,
    [1.0, float("nan"), 0.0, 2.0] * 10,  # NaN ranks first, as in topk
    list(range(40)),
]
SELECTION_LABELS = ([2, 0, 7, 1, 1, 39], [1, 39, 0, 0, 2, 5], [7, 5, 39, 3, 0, 0])

# top-k cross-entropy's rows: the label at -inf, +inf classes, a NaN (twice: the second row's target
# is ignored) and fewer finite classes than m = 4; LOSS_TARGETS (the second NaN row ignored)
LOSS_ROWS = [
    [-INF, 1.0, 2.0, 0.0, -1.0, 3.0, 0.5, 0.25],
    [INF, 1.0, 2.0, INF, -1.0, 3.0, 0.5, 0.25],
    [1.0, float("nan"), 2.0, 0.0, -1.0, 3.0, 0.5, 0.25],
    [1.0, float("nan"), 2.0, 0.0, -1.0, 3.0, 0.5, 0.25],
    [-INF] * 6 + [1.0, 2.0],
]
LOSS_TARGETS = [0, 1, 2, -100, 6]
