"""Tests of the pair scheduler: the compiled module and the pure-Python reference, against each other and the spec."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastnli.kernels import reference

try:
    from fastnli.kernels import _schedule
except ImportError:  # not built: the compiled half of the suite is skipped, with the reason shown by -ra
    _schedule = None  # type: ignore[assignment]

HAS_COMPILED = _schedule is not None
needs_compiled = pytest.mark.skipif(
    not HAS_COMPILED, reason="fastnli.kernels._schedule is not built (python setup.py build_ext --inplace)"
)

IMPLS = [
    pytest.param(reference, id="reference"),
    pytest.param(_schedule, id="compiled", marks=needs_compiled),
]

# Hypothesis budget: small, the machine is shared; no deadline (timings are noisy there).
PROPS = settings(max_examples=60, deadline=None)

# Few distinct strings, so that duplicates and (a, b) / (b, a) pairs are frequent.
texts = st.sampled_from(["", "a", "b", "A", "a ", "é", "e\u0301", "日本", "😀", "x" * 30])
pair_lists = st.lists(st.tuples(texts, texts), max_size=40)
length_arrays = st.lists(st.integers(0, 60), max_size=60).map(lambda v: np.asarray(v, dtype=np.int64))
token_lists = st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8), max_size=20)


def _dedup(impl: ModuleType, pairs: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    return impl.dedup_pairs([p for p, _ in pairs], [h for _, h in pairs])


def _check_dedup(pairs: list[tuple[str, str]], first: np.ndarray, inverse: np.ndarray) -> None:
    n = len(pairs)
    assert first.dtype == np.int64 and inverse.dtype == np.int64
    assert first.shape == (len(set(pairs)),) and inverse.shape == (n,)
    uniques = [pairs[i] for i in first]
    assert len(set(uniques)) == len(uniques)  # each unique pair computed once
    assert [uniques[u] for u in inverse] == pairs  # every input gets its own result back
    # first occurrence order, and first_index really is the first occurrence
    assert list(first) == sorted(first)
    assert all(pairs.index(uniques[u]) == first[u] for u in range(len(uniques)))


def _check_plan(plan: reference.Plan, lengths: np.ndarray, budget: int, cap: int, multiple: int,
                attention: int = 0) -> None:
    n = lengths.shape[0]
    assert plan.order.dtype == plan.bounds.dtype == plan.seq_lens.dtype == np.int64
    assert sorted(plan.order.tolist()) == list(range(n))  # every unique index exactly once
    expected_order = sorted(range(n), key=lambda i: (-int(lengths[i]), i))
    assert plan.order.tolist() == expected_order
    assert plan.bounds[0] == 0 and plan.bounds[-1] == n
    assert np.all(np.diff(plan.bounds) >= 1)
    assert plan.num_batches == plan.seq_lens.shape[0] == plan.bounds.shape[0] - 1
    padded = 0
    for b in range(plan.num_batches):
        rows = plan.batch_rows(b)
        s = int(plan.seq_lens[b])
        assert s % multiple == 0
        assert s == -(-int(lengths[rows].max()) // multiple) * multiple
        assert np.all(lengths[rows] <= s)
        if len(rows) > 1:  # only a lone over-long row may exceed the budget
            assert len(rows) * s <= budget and len(rows) <= cap
            assert not attention or len(rows) * s * s <= attention
        else:
            assert len(rows) <= cap
        padded += len(rows) * s
    assert plan.padded_tokens == padded
    assert plan.real_tokens == int(lengths.sum())


# ----------------------------------------------------------------------------------------------------------------------
# dedup_pairs
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@PROPS
@given(pairs=pair_lists)
def test_dedup_properties(impl: ModuleType, pairs: list[tuple[str, str]]) -> None:
    first, inverse = _dedup(impl, pairs)
    _check_dedup(pairs, first, inverse)


@needs_compiled
@PROPS
@given(pairs=pair_lists)
def test_dedup_compiled_matches_reference(pairs: list[tuple[str, str]]) -> None:
    a = _dedup(reference, pairs)
    b = _dedup(_schedule, pairs)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("pairs", "expected_first", "expected_inverse"),
    [
        ([], [], []),
        ([("p", "h")], [0], [0]),
        ([("p", "h")] * 5, [0], [0, 0, 0, 0, 0]),
        ([("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")], [0, 1], [0, 1, 0, 1]),
        ([("", ""), ("", "x"), ("x", ""), ("", "")], [0, 1, 2], [0, 1, 2, 0]),
        # no normalisation: composed vs decomposed é, case, trailing space, emoji
        (
            [("é", "😀"), ("e\u0301", "😀"), ("É", "😀"), ("é ", "😀"), ("é", "😀")],
            [0, 1, 2, 3],
            [0, 1, 2, 3, 0],
        ),
        # the concatenation is the same, the pair is not
        ([("ab", "c"), ("a", "bc")], [0, 1], [0, 1]),
    ],
)
def test_dedup_edge_cases(
    impl: ModuleType, pairs: list[tuple[str, str]], expected_first: list[int], expected_inverse: list[int]
) -> None:
    first, inverse = _dedup(impl, pairs)
    assert first.dtype == inverse.dtype == np.int64
    assert first.tolist() == expected_first
    assert inverse.tolist() == expected_inverse


@pytest.mark.parametrize("impl", IMPLS)
def test_dedup_all_distinct_and_equal_but_not_identical_strings(impl: ModuleType) -> None:
    n = 2000
    premises = [f"premise {i}" for i in range(n)]
    hypotheses = [f"hypothesis {i % 7}" for i in range(n)]
    first, inverse = impl.dedup_pairs(premises, hypotheses)
    assert first.tolist() == list(range(n)) and inverse.tolist() == list(range(n))
    # equal content in distinct str objects (no identity short-cut) still deduplicates
    copies = ["".join(list(p)) for p in premises]
    assert all(c is not p for c, p in zip(copies, premises, strict=True))
    first, inverse = impl.dedup_pairs(premises + copies, hypotheses + hypotheses)
    assert first.tolist() == list(range(n)) and inverse.tolist() == list(range(n)) * 2


@pytest.mark.parametrize("impl", IMPLS)
def test_dedup_accepts_tuples_and_numpy_strings(impl: ModuleType) -> None:
    first, inverse = impl.dedup_pairs(("a", "b", "a"), np.array(["x", "y", "x"]))
    assert first.tolist() == [0, 1] and inverse.tolist() == [0, 1, 0]


class _Text(str):
    """A str subclass, as some callers pass (numpy.str_ is one too)."""


@pytest.mark.parametrize("impl", IMPLS)
def test_dedup_str_subclasses(impl: ModuleType) -> None:
    premises = [_Text("a"), "a", _Text("b"), np.str_("a")]
    hypotheses = ["x", _Text("x"), "x", "x"]
    first, inverse = impl.dedup_pairs(premises, hypotheses)
    assert first.tolist() == [0, 2] and inverse.tolist() == [0, 0, 1, 0]


@needs_compiled
@pytest.mark.parametrize("key_space", [1, 2, 3])
def test_dedup_forced_hash_collisions(key_space: int) -> None:
    """Distinct pairs that share a key must stay distinct; equal pairs must still merge."""
    rng = np.random.default_rng(0)
    pool = ["a", "b", "ab", "", "é", "ba"]
    pairs = [(pool[i], pool[j]) for i, j in rng.integers(0, len(pool), size=(300, 2))]
    premises, hypotheses = [p for p, _ in pairs], [h for _, h in pairs]
    uid = {pair: k for k, pair in enumerate(dict.fromkeys(pairs))}
    keys = np.asarray([uid[pair] % key_space for pair in pairs], dtype=np.int64)  # equal pairs, equal keys
    first, inverse = _schedule._dedup_with_keys(premises, hypotheses, keys)
    ref_first, ref_inverse = reference.dedup_pairs(premises, hypotheses)
    np.testing.assert_array_equal(first, ref_first)
    np.testing.assert_array_equal(inverse, ref_inverse)
    _check_dedup(pairs, first, inverse)


@needs_compiled
@PROPS
@given(pairs=pair_lists, key_space=st.integers(1, 4))
def test_dedup_colliding_keys_property(pairs: list[tuple[str, str]], key_space: int) -> None:
    keys = np.asarray([hash(p) % key_space for p in pairs], dtype=np.int64)
    first, inverse = _schedule._dedup_with_keys([p for p, _ in pairs], [h for _, h in pairs], keys)
    _check_dedup(pairs, first, inverse)


@pytest.mark.parametrize("impl", IMPLS)
def test_dedup_errors(impl: ModuleType) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "premises and hypotheses must have the same length, got 2 premises and 1 hypotheses; "
            "pass one hypothesis per premise"
        ),
    ):
        impl.dedup_pairs(["a", "b"], ["c"])
    with pytest.raises(TypeError, match=re.escape("premises must be a sequence of str, got a single str 'abc'")):
        impl.dedup_pairs("abc", ["a", "b", "c"])
    with pytest.raises(TypeError, match=re.escape("hypotheses[1] must be str, got int 5; convert it with str()")):
        impl.dedup_pairs(["a", "b"], ["c", 5])
    with pytest.raises(TypeError, match=re.escape("premises[0] must be str, got NoneType None")):
        impl.dedup_pairs([None], ["c"])
    # pair by pair: the hypothesis of pair 0 is reported before the premise of pair 1
    with pytest.raises(TypeError, match=re.escape("hypotheses[0] must be str, got bytes b'x'")):
        impl.dedup_pairs(["a", 1], [b"x", "b"])
    with pytest.raises(TypeError, match=re.escape("premises must be a sequence of str (list, tuple), got int")):
        impl.dedup_pairs(3, ["c"])


# ----------------------------------------------------------------------------------------------------------------------
# flatten_token_lists
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@PROPS
@given(rows=token_lists)
def test_flatten_properties(impl: ModuleType, rows: list[list[int]]) -> None:
    flat, offsets = impl.flatten_token_lists(rows)
    assert flat.dtype == offsets.dtype == np.int64
    assert offsets.shape == (len(rows) + 1,) and offsets[0] == 0
    assert [flat[offsets[u] : offsets[u + 1]].tolist() for u in range(len(rows))] == rows


@needs_compiled
@PROPS
@given(rows=token_lists)
def test_flatten_compiled_matches_reference(rows: list[list[int]]) -> None:
    a, b = reference.flatten_token_lists(rows), _schedule.flatten_token_lists(rows)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("impl", IMPLS)
def test_flatten_mixed_row_types(impl: ModuleType) -> None:
    rows = [[1, 2], (3,), np.array([4, 5], dtype=np.int32), range(6, 8), [], np.array([], dtype=np.int64),
            [np.int64(9), True], np.array([10], dtype=np.uint64)]
    flat, offsets = impl.flatten_token_lists(rows)
    assert flat.tolist() == [1, 2, 3, 4, 5, 6, 7, 9, 1, 10]
    assert offsets.tolist() == [0, 2, 3, 5, 7, 7, 7, 9, 10]
    flat, offsets = impl.flatten_token_lists([])
    assert flat.shape == (0,) and offsets.tolist() == [0]


@pytest.mark.parametrize("impl", IMPLS)
def test_flatten_errors(impl: ModuleType) -> None:
    with pytest.raises(TypeError, match=re.escape("token_lists[1][0] must be an int token id, got float 1.5")):
        impl.flatten_token_lists([[1], [1.5]])
    with pytest.raises(TypeError, match=re.escape("token_lists[0][1] must be an int token id, got str '7'")):
        impl.flatten_token_lists([[1, "7"]])
    with pytest.raises(OverflowError, match=re.escape(f"token_lists[0][0] = {2**63} does not fit in int64")):
        impl.flatten_token_lists([[2**63]])
    with pytest.raises(OverflowError, match=re.escape(f"token_lists[1][0] = {2**64 - 1} does not fit in int64")):
        impl.flatten_token_lists([[], np.array([2**64 - 1], dtype=np.uint64)])
    with pytest.raises(TypeError, match=re.escape("token_lists must be a sequence of token-id sequences, got str")):
        impl.flatten_token_lists("123")


@needs_compiled
def test_flatten_row_changed_by_index_raises() -> None:
    row: list[object] = [1, 2, 3]

    class Shrinker:
        def __index__(self) -> int:
            row.clear()  # a hostile __index__ that shrinks the row being read
            return 7

    row[0] = Shrinker()
    with pytest.raises(RuntimeError, match=re.escape("token_lists[0] changed size while it was being flattened")):
        _schedule.flatten_token_lists([row])


# ----------------------------------------------------------------------------------------------------------------------
# plan_batches
# ----------------------------------------------------------------------------------------------------------------------


def _cheapest_split(lengths: np.ndarray, budget: int, cap: int, multiple: int, attention: int, overhead: int) -> int:
    """The least ``padded tokens + overhead × batches`` over every split of the length-sorted rows into runs that
    respect the caps (a lone row always may form a batch), by exhaustive recursion."""
    lens = sorted((int(v) for v in lengths), reverse=True)

    @functools.cache
    def cost(i: int) -> int:
        if i == len(lens):
            return 0
        seq = -(-lens[i] // multiple) * multiple
        options = [r * seq + overhead + cost(i + r) for r in range(1, len(lens) - i + 1)
                   if r == 1 or (r * seq <= budget and r <= cap and (not attention or r * seq * seq <= attention))]
        return min(options)

    return cost(0)


OVERHEADS = st.sampled_from([0, 1, 7, 32, 500])


@pytest.mark.parametrize("impl", IMPLS)
@PROPS
@given(
    lengths=length_arrays,
    budget=st.integers(1, 200),
    cap=st.integers(1, 10),
    multiple=st.sampled_from([1, 2, 8]),
    attention=st.sampled_from([0, 1, 50, 400, 3000]),
    overhead=OVERHEADS,
)
def test_plan_properties(impl: ModuleType, lengths: np.ndarray, budget: int, cap: int, multiple: int,
                         attention: int, overhead: int) -> None:
    plan = impl.plan_batches(lengths, budget, cap, multiple, attention, overhead)
    _check_plan(plan, lengths, budget, cap, multiple, attention)
    greedy = impl.plan_batches(lengths, budget, cap, multiple, attention)
    # the split minimises padded tokens + overhead per batch, so it never costs more than the greedy plan
    assert plan.padded_tokens + overhead * plan.num_batches <= greedy.padded_tokens + overhead * greedy.num_batches


@pytest.mark.parametrize("impl", IMPLS)
@PROPS
@given(
    lengths=st.lists(st.integers(0, 40), max_size=9).map(lambda v: np.asarray(v, dtype=np.int64)),
    budget=st.integers(1, 120),
    cap=st.integers(1, 6),
    multiple=st.sampled_from([1, 3]),
    attention=st.sampled_from([0, 50, 3000]),
    overhead=st.integers(1, 200),
)
def test_plan_with_overhead_is_the_cheapest_split(impl: ModuleType, lengths: np.ndarray, budget: int, cap: int,
                                                  multiple: int, attention: int, overhead: int) -> None:
    plan = impl.plan_batches(lengths, budget, cap, multiple, attention, overhead)
    assert plan.padded_tokens + overhead * plan.num_batches == _cheapest_split(lengths, budget, cap, multiple,
                                                                              attention, overhead)


@needs_compiled
@PROPS
@given(
    lengths=length_arrays,
    budget=st.integers(1, 200),
    cap=st.integers(1, 10),
    multiple=st.sampled_from([1, 3, 8]),
    attention=st.sampled_from([0, 1, 50, 400, 3000]),
    overhead=OVERHEADS,
)
def test_plan_compiled_matches_reference(lengths: np.ndarray, budget: int, cap: int, multiple: int,
                                         attention: int, overhead: int) -> None:
    a = reference.plan_batches(lengths, budget, cap, multiple, attention, overhead)
    b = _schedule.plan_batches(lengths, budget, cap, multiple, attention, overhead)
    for field in ("order", "bounds", "seq_lens"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert (a.real_tokens, a.padded_tokens) == (b.real_tokens, b.padded_tokens)
    assert type(a) is type(b)


@pytest.mark.parametrize("impl", IMPLS)
def test_plan_edge_cases(impl: ModuleType) -> None:
    empty = impl.plan_batches(np.zeros(0, dtype=np.int64), 100, 4)
    assert empty.num_batches == 0 and empty.bounds.tolist() == [0] and empty.order.shape == (0,)
    assert empty.padding_efficiency == 1.0 and empty.real_tokens == empty.padded_tokens == 0

    one = impl.plan_batches(np.array([7]), 100, 4)
    assert one.order.tolist() == [0] and one.bounds.tolist() == [0, 1] and one.seq_lens.tolist() == [7]

    # a single row longer than the budget gets its own batch; nothing is dropped
    plan = impl.plan_batches(np.array([5, 600, 5, 5]), 100, 8)
    assert plan.order.tolist() == [1, 0, 2, 3]
    assert plan.bounds.tolist() == [0, 1, 4] and plan.seq_lens.tolist() == [600, 5]
    assert plan.padded_tokens == 615 and plan.real_tokens == 615 and plan.padding_efficiency == 1.0

    # pad_multiple 8: seq_len rounded up; the budget counts padded tokens
    plan = impl.plan_batches(np.array([9, 16, 3, 1, 8]), 48, 8, pad_multiple=8)
    assert plan.order.tolist() == [1, 0, 4, 2, 3]
    assert plan.seq_lens.tolist() == [16, 8]
    assert plan.bounds.tolist() == [0, 3, 5]
    assert plan.padded_tokens == 3 * 16 + 2 * 8 and plan.real_tokens == 37

    # all identical: ties by index, batches capped by max_batch_size
    plan = impl.plan_batches(np.full(10, 4), 1000, 4)
    assert plan.order.tolist() == list(range(10)) and plan.bounds.tolist() == [0, 4, 8, 10]

    # zero-length rows cost nothing and are capped by rows only
    plan = impl.plan_batches(np.zeros(5, dtype=np.int32), 1, 2)
    assert plan.bounds.tolist() == [0, 2, 4, 5] and plan.seq_lens.tolist() == [0, 0, 0]

    # the attention cap (rows * seq_len ** 2) splits long rows that the token budget would batch together
    lengths = np.array([512, 512, 512, 128, 128, 128, 128, 128, 64])
    plan = impl.plan_batches(lengths, 4096, 64, max_batch_attention=512 * 512)
    assert plan.bounds.tolist() == [0, 1, 2, 3, 9] and plan.seq_lens.tolist() == [512, 512, 512, 128]
    plan = impl.plan_batches(lengths, 4096, 64, max_batch_attention=2 * 128 * 128)
    assert plan.bounds.tolist() == [0, 1, 2, 3, 5, 7, 9] and plan.seq_lens.tolist() == [512, 512, 512, 128, 128, 128]
    with pytest.raises(ValueError, match="max_batch_attention must be >= 0, got -1"):
        impl.plan_batches(lengths, 4096, 64, max_batch_attention=-1)

    # a batch overhead splits off the short rows that greedy packing pads to the long row's length
    lengths = np.array([10, 100, 10, 10])
    greedy = impl.plan_batches(lengths, 4096, 64)
    assert greedy.bounds.tolist() == [0, 4] and greedy.padded_tokens == 400
    plan = impl.plan_batches(lengths, 4096, 64, batch_overhead_tokens=32)
    assert plan.order.tolist() == [1, 0, 2, 3] and plan.bounds.tolist() == [0, 1, 4]
    assert plan.seq_lens.tolist() == [100, 10] and plan.padded_tokens == 130 == plan.real_tokens
    # ... unless a batch costs more than the padding it saves (100 + 30 + 2 x 300 > 400 + 300)
    assert impl.plan_batches(lengths, 4096, 64, batch_overhead_tokens=300).bounds.tolist() == [0, 4]
    # equal lengths: every split pads the same, so the fewest batches the caps allow
    assert impl.plan_batches(np.full(10, 4), 1000, 4, batch_overhead_tokens=5).bounds.tolist() == [0, 4, 8, 10]
    with pytest.raises(ValueError, match="batch_overhead_tokens must be >= 0, got -1"):
        impl.plan_batches(lengths, 4096, 64, batch_overhead_tokens=-1)


@needs_compiled
def test_plan_large_lengths_take_the_argsort_path() -> None:
    lengths = np.array([3, 10**9, 7, 10**9, 0], dtype=np.int64)  # beyond the counting-sort limit
    a = reference.plan_batches(lengths, 10**9, 2)
    b = _schedule.plan_batches(lengths, 10**9, 2)
    assert b.order.tolist() == a.order.tolist() == [1, 3, 2, 0, 4]
    np.testing.assert_array_equal(a.bounds, b.bounds)
    np.testing.assert_array_equal(a.seq_lens, b.seq_lens)


@pytest.mark.parametrize("impl", IMPLS)
def test_plan_errors(impl: ModuleType) -> None:
    lengths = np.array([3, 4])
    with pytest.raises(ValueError, match=re.escape("lengths must be >= 0, got lengths[1] = -2")):
        impl.plan_batches(np.array([3, -2]), 10, 2)
    with pytest.raises(
        TypeError, match=re.escape("lengths must hold integers, got dtype float64; pass lengths.astype(np.int64)")
    ):
        impl.plan_batches(np.array([1.0]), 10, 2)
    with pytest.raises(ValueError, match=re.escape("lengths must be 1-D, got an array of shape (1, 2)")):
        impl.plan_batches(np.array([[1, 2]]), 10, 2)
    with pytest.raises(ValueError, match=re.escape("max_batch_tokens must be >= 1, got 0")):
        impl.plan_batches(lengths, 0, 2)
    with pytest.raises(ValueError, match=re.escape("max_batch_size must be >= 1, got -1")):
        impl.plan_batches(lengths, 10, -1)
    with pytest.raises(ValueError, match=re.escape("pad_multiple must be >= 1, got 0")):
        impl.plan_batches(lengths, 10, 2, pad_multiple=0)
    with pytest.raises(
        TypeError, match=re.escape("max_batch_tokens must be an int, got float 10.5; pass int(max_batch_tokens)")
    ):
        impl.plan_batches(lengths, 10.5, 2)


# ----------------------------------------------------------------------------------------------------------------------
# fill_batch
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@PROPS
@given(rows=st.lists(st.lists(st.integers(1, 1000), max_size=12), min_size=1, max_size=15), data=st.data())
def test_fill_properties(impl: ModuleType, rows: list[list[int]], data: st.DataObject) -> None:
    flat, offsets = reference.flatten_token_lists(rows)
    types = -flat  # distinguishable type ids
    picked = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=10))
    seq_len = max([len(rows[u]) for u in picked], default=0) + data.draw(st.integers(0, 3))
    ids, mask, tt = impl.fill_batch(flat, offsets, np.asarray(picked, dtype=np.int64), seq_len, -7, types)
    for arr in (ids, mask, tt):
        assert arr is not None
        assert arr.dtype == np.int64 and arr.shape == (len(picked), seq_len) and arr.flags.c_contiguous
    assert tt is not None
    for k, u in enumerate(picked):
        n = len(rows[u])
        assert ids[k].tolist() == rows[u] + [-7] * (seq_len - n)
        assert mask[k].tolist() == [1] * n + [0] * (seq_len - n)
        assert tt[k].tolist() == [-t for t in rows[u]] + [0] * (seq_len - n)
    ref = reference.fill_batch(flat, offsets, np.asarray(picked, dtype=np.int64), seq_len, -7, types)
    for x, y in zip(ref, (ids, mask, tt), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("impl", IMPLS)
def test_fill_without_types_and_empty(impl: ModuleType) -> None:
    flat, offsets = reference.flatten_token_lists([[5, 6, 7], [8]])
    ids, mask, tt = impl.fill_batch(flat, offsets, np.array([1, 0]), 4, 0)
    assert tt is None
    assert ids.tolist() == [[8, 0, 0, 0], [5, 6, 7, 0]] and mask.tolist() == [[1, 0, 0, 0], [1, 1, 1, 0]]
    ids, mask, tt = impl.fill_batch(flat, offsets, np.zeros(0, dtype=np.int64), 4, 0)
    assert ids.shape == mask.shape == (0, 4)
    # int32 inputs and a Python list of rows are converted
    ids, _, _ = impl.fill_batch(flat.astype(np.int32), offsets.astype(np.int32), [0], 3, 1)
    assert ids.tolist() == [[5, 6, 7]]


@pytest.mark.parametrize("impl", IMPLS)
def test_fill_errors(impl: ModuleType) -> None:
    flat, offsets = reference.flatten_token_lists([[5, 6, 7], [8]])
    with pytest.raises(IndexError, match=re.escape("rows[1] = 2 is out of range for offsets describing 2 rows")):
        impl.fill_batch(flat, offsets, np.array([0, 2]), 4, 0)
    with pytest.raises(IndexError, match=re.escape("rows[0] = -1 is out of range for offsets describing 2 rows")):
        impl.fill_batch(flat, offsets, np.array([-1]), 4, 0)
    with pytest.raises(
        ValueError,
        match=re.escape("rows[1] = 0 has 3 tokens, more than seq_len=2; pass the batch's plan.seq_lens[b]"),
    ):
        impl.fill_batch(flat, offsets, np.array([1, 0]), 2, 0)
    with pytest.raises(
        ValueError, match=re.escape("offsets[1]..offsets[2] = 3..9 is not a valid slice of flat_ids (length 4)")
    ):
        impl.fill_batch(flat, np.array([0, 3, 9]), np.array([1]), 9, 0)
    with pytest.raises(ValueError, match=re.escape("flat_type_ids must have the same length as flat_ids, got 1 and 4")):
        impl.fill_batch(flat, offsets, np.array([0]), 4, 0, np.array([0]))
    with pytest.raises(ValueError, match=re.escape("seq_len must be >= 0, got -1")):
        impl.fill_batch(flat, offsets, np.array([0]), -1, 0)
    with pytest.raises(TypeError, match=re.escape("flat_ids must hold integers, got dtype float32")):
        impl.fill_batch(flat.astype(np.float32), offsets, np.array([0]), 4, 0)


# ----------------------------------------------------------------------------------------------------------------------
# scatter_rows and the whole pipeline
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@PROPS
@given(pairs=pair_lists, k=st.integers(0, 4))
def test_scatter_reconstructs_inputs(impl: ModuleType, dtype: type, pairs: list[tuple[str, str]], k: int) -> None:
    first, inverse = _dedup(impl, pairs)
    # a result row that identifies its unique pair: scatter must hand pair i exactly its own unique result
    values: np.ndarray = np.arange(len(first) * k, dtype=dtype).reshape(len(first), k)
    out = impl.scatter_rows(values, inverse)
    assert out.dtype == dtype and out.shape == (len(pairs), k)
    np.testing.assert_array_equal(out, values[inverse])
    np.testing.assert_array_equal(out, reference.scatter_rows(values, inverse))


@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_errors(impl: ModuleType) -> None:
    values = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(IndexError, match=re.escape("inverse[2] = 2 is out of range for values with 2 rows")):
        impl.scatter_rows(values, np.array([0, 1, 2]))
    with pytest.raises(IndexError, match=re.escape("inverse[0] = -1 is out of range for values with 2 rows")):
        impl.scatter_rows(values, np.array([-1]))
    with pytest.raises(TypeError, match=re.escape("values must be float32 or float64, got dtype int64")):
        impl.scatter_rows(np.zeros((2, 3), dtype=np.int64), np.array([0]))
    with pytest.raises(ValueError, match=re.escape("values must be 2-D (U, K), got shape (2,)")):
        impl.scatter_rows(np.zeros(2, dtype=np.float32), np.array([0]))
    with pytest.raises(TypeError, match=re.escape("values must be a numpy array, got list")):
        impl.scatter_rows([[0.0]], np.array([0]))
    # non-contiguous values are accepted
    v = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(impl.scatter_rows(v, np.array([2, 0])), v[[2, 0]])


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=30, deadline=None)
@given(pairs=pair_lists, budget=st.integers(1, 64), cap=st.integers(1, 6), multiple=st.sampled_from([1, 8]))
def test_pipeline_end_to_end(
    impl: ModuleType, pairs: list[tuple[str, str]], budget: int, cap: int, multiple: int
) -> None:
    """dedup -> tokenize unique -> plan -> fill -> fake model -> scatter: every input gets its own pair's result."""
    first, inverse = _dedup(impl, pairs)
    uniques = [pairs[i] for i in first]
    tokens = [[ord(c) for c in p] + [0] + [ord(c) for c in h] for p, h in uniques]  # fake tokenizer
    flat, offsets = impl.flatten_token_lists(tokens)
    plan = impl.plan_batches(np.diff(offsets), budget, cap, multiple)
    _check_plan(plan, np.diff(offsets), budget, cap, multiple)
    results = np.full((len(uniques), 2), np.nan)
    for b in range(plan.num_batches):
        rows = plan.batch_rows(b)
        ids, mask, _ = impl.fill_batch(flat, offsets, rows, int(plan.seq_lens[b]), -1)
        assert np.isnan(results[rows]).all()  # computed once
        results[rows, 0] = (ids * mask).sum(axis=1)  # fake model: a function of the real tokens only
        results[rows, 1] = mask.sum(axis=1)
    out = impl.scatter_rows(results, inverse)
    for i, (p, h) in enumerate(pairs):
        expected = [sum(map(ord, p)) + sum(map(ord, h)), len(p) + len(h) + 1]
        assert out[i].tolist() == expected


# ----------------------------------------------------------------------------------------------------------------------
# fastnli.kernels: implementation selection
# ----------------------------------------------------------------------------------------------------------------------

_PROBE = """
import logging, sys
records = []
class H(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger("fastnli").addHandler(H())
if sys.argv[1] == "hide":
    sys.modules["fastnli.kernels._schedule"] = None  # makes the import fail like an unbuilt extension
import fastnli.kernels as k
import fastnli.kernels
print(k.IMPLEMENTATION, k.dedup_pairs.__module__, len(records))
for r in records:
    print(r.levelname, r.getMessage())
"""


def _probe(mode: str, env_value: str | None, ok: bool = True) -> list[str]:
    env = dict(os.environ)
    env.pop("FASTNLI_KERNELS", None)
    if env_value is not None:
        env["FASTNLI_KERNELS"] = env_value
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (proc.returncode == 0) == ok, proc.stderr
    return (proc.stdout + proc.stderr).splitlines()


@needs_compiled
def test_selects_compiled_by_default() -> None:
    assert _probe("normal", None)[0] == "compiled fastnli.kernels._schedule 0"


def test_env_forces_reference_without_warning() -> None:
    assert _probe("normal", "reference")[0] == "reference fastnli.kernels.reference 0"


def test_fallback_logs_one_warning_with_build_instructions() -> None:
    lines = _probe("hide", None)
    assert lines[0] == "reference fastnli.kernels.reference 1"
    assert lines[1].startswith("WARNING fastnli.kernels: the compiled scheduler fastnli.kernels._schedule is not")
    assert "`pip install -e .`" in lines[1] and "`python setup.py build_ext --inplace`" in lines[1]


def test_env_compiled_raises_when_missing_and_bad_value_raises() -> None:
    out = "\n".join(_probe("hide", "compiled", ok=False))
    assert "ImportError: FASTNLI_KERNELS=compiled but the extension fastnli.kernels._schedule cannot be" in out
    out = "\n".join(_probe("normal", "fast", ok=False))
    assert ("ValueError: FASTNLI_KERNELS='fast' is not one of 'auto', 'compiled', 'reference'; set it to one of them, "
            "or unset it (default 'auto')") in out


def test_public_api() -> None:
    import fastnli.kernels as k

    assert k.IMPLEMENTATION in ("compiled", "reference")
    assert k.Plan is reference.Plan
    built = importlib.util.find_spec("fastnli.kernels._schedule") is not None
    expected = "compiled" if built else "reference"
    assert expected == k.IMPLEMENTATION
