"""Pure-Python/numpy reference of the pair scheduler: the oracle the compiled ``_schedule`` module is tested against.

Every function here has the same signature, outputs and error messages as its compiled twin in
``fastnli/kernels/_schedule.pyx``. The code favours the obviously correct over the fast: plain Python loops, a
``dict`` for deduplication. ``fastnli.kernels`` only falls back to it when the extension is not built (or when
``FASTNLI_KERNELS=reference``).

This module also holds what both implementations share, so that they cannot drift apart: the :class:`Plan`
result type and the argument validators (the ``_check_*`` / ``_as_*`` helpers), which the compiled module imports.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Plan", "dedup_pairs", "fill_batch", "flatten_token_lists", "plan_batches", "scatter_rows"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


# ----------------------------------------------------------------------------------------------------------------------
# Shared result type
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A batching plan over ``U`` unique token rows.

    Attributes:
        order: int64 ``(U,)``: unique row indices sorted by length descending, ties by index ascending.
        bounds: int64 ``(B+1,)``: batch ``b`` holds rows ``order[bounds[b]:bounds[b+1]]``; ``bounds[0] == 0``.
        seq_lens: int64 ``(B,)``: padded sequence length (tokens) of batch ``b``: its longest row rounded up to
            ``pad_multiple``.
        real_tokens: sum of all row lengths (tokens).
        padded_tokens: sum over batches of ``rows * seq_len`` (tokens fed to the model).
    """

    order: np.ndarray
    bounds: np.ndarray
    seq_lens: np.ndarray
    real_tokens: int
    padded_tokens: int

    @property
    def num_batches(self) -> int:
        """Number of batches ``B``."""
        return int(self.seq_lens.shape[0])

    @property
    def padding_efficiency(self) -> float:
        """``real_tokens / padded_tokens`` (1.0 for an empty plan or one whose rows are all empty)."""
        return 1.0 if self.padded_tokens == 0 else self.real_tokens / self.padded_tokens

    def batch_rows(self, b: int) -> np.ndarray:
        """Unique row indices of batch ``b`` (a view into :attr:`order`)."""
        return self.order[self.bounds[b] : self.bounds[b + 1]]


# ----------------------------------------------------------------------------------------------------------------------
# Shared validators (imported by the compiled module, so both implementations raise identical errors)
# ----------------------------------------------------------------------------------------------------------------------


def _check_str_sequence(seq: Any, name: str) -> None:
    """Raise TypeError unless ``seq`` is a sized sequence that is not itself a string."""
    if isinstance(seq, (str, bytes)):
        raise TypeError(
            f"{name} must be a sequence of str, got a single {type(seq).__name__} {seq[:20]!r}; wrap it in a list"
        )
    if not hasattr(seq, "__len__") or not hasattr(seq, "__getitem__"):
        raise TypeError(f"{name} must be a sequence of str (list, tuple), got {type(seq).__name__}; pass list({name})")


def _check_pair_lengths(premises: Sequence[str], hypotheses: Sequence[str]) -> int:
    """Validate the two pair sequences and return their common length."""
    _check_str_sequence(premises, "premises")
    _check_str_sequence(hypotheses, "hypotheses")
    n, m = len(premises), len(hypotheses)
    if n != m:
        raise ValueError(
            f"premises and hypotheses must have the same length, got {n} premises and {m} hypotheses; "
            "pass one hypothesis per premise"
        )
    return n


def _not_str_error(name: str, index: int, value: object) -> TypeError:
    return TypeError(f"{name}[{index}] must be str, got {type(value).__name__} {value!r:.40}; convert it with str()")


def _token_error(u: int, j: int, value: object) -> TypeError:
    return TypeError(
        f"token_lists[{u}][{j}] must be an int token id, got {type(value).__name__} {value!r:.40}"
    )


def _token_overflow_error(u: int, j: int, value: object) -> OverflowError:
    return OverflowError(f"token_lists[{u}][{j}] = {value} does not fit in int64")


def _as_count(value: Any, name: str, minimum: int) -> int:
    """Return ``value`` as a Python int ``>= minimum``, or raise TypeError/ValueError naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.40}; pass int({name})") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _as_int64_1d(arr: Any, name: str) -> np.ndarray:
    """Return ``arr`` as a C-contiguous 1-D int64 array (no copy if it already is one)."""
    a = np.asarray(arr)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got an array of shape {a.shape}; pass {name}.ravel() or fix the caller")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}; pass {name}.astype(np.int64)")
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and int(a.max()) > _INT64_MAX:
        raise ValueError(f"{name} holds {int(a.max())}, which does not fit in int64")
    return np.ascontiguousarray(a, dtype=np.int64)


def _check_lengths(lengths: Any) -> np.ndarray:
    a = _as_int64_1d(lengths, "lengths")
    if a.size and int(a.min()) < 0:
        i = int(np.argmin(a))
        raise ValueError(f"lengths must be >= 0, got lengths[{i}] = {int(a[i])}")
    return a


def _check_fill_args(
    flat_ids: Any, offsets: Any, rows: Any, seq_len: Any, pad_id: Any, flat_type_ids: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, np.ndarray | None]:
    flat = _as_int64_1d(flat_ids, "flat_ids")
    offs = _as_int64_1d(offsets, "offsets")
    rws = _as_int64_1d(rows, "rows")
    s = _as_count(seq_len, "seq_len", 0)
    p = _as_count(pad_id, "pad_id", _INT64_MIN)
    if p > _INT64_MAX:
        raise ValueError(f"pad_id must fit in int64, got {p}")
    if offs.shape[0] == 0:
        raise ValueError("offsets must have U+1 >= 1 entries (offsets[0] == 0), got an empty array")
    types = None
    if flat_type_ids is not None:
        types = _as_int64_1d(flat_type_ids, "flat_type_ids")
        if types.shape[0] != flat.shape[0]:
            raise ValueError(
                f"flat_type_ids must have the same length as flat_ids, got {types.shape[0]} and {flat.shape[0]}"
            )
    return flat, offs, rws, s, p, types


def _row_index_error(k: int, row: int, n_rows: int) -> IndexError:
    return IndexError(f"rows[{k}] = {row} is out of range for offsets describing {n_rows} rows")


def _bad_slice_error(row: int, start: int, stop: int, n_tokens: int) -> ValueError:
    return ValueError(
        f"offsets[{row}]..offsets[{row + 1}] = {start}..{stop} is not a valid slice of flat_ids "
        f"(length {n_tokens}); offsets must be non-decreasing and end at len(flat_ids)"
    )


def _row_too_long_error(k: int, row: int, length: int, seq_len: int) -> ValueError:
    return ValueError(
        f"rows[{k}] = {row} has {length} tokens, more than seq_len={seq_len}; "
        "pass the batch's plan.seq_lens[b] (or a larger seq_len)"
    )


def _check_scatter_args(values: Any, inverse: Any) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(values, np.ndarray):
        raise TypeError(f"values must be a numpy array, got {type(values).__name__}; pass np.asarray(values)")
    if values.ndim != 2:
        raise ValueError(
            f"values must be 2-D (U, K), got shape {values.shape}; reshape it, e.g. values.reshape(-1, 1)"
        )
    if values.dtype != np.float32 and values.dtype != np.float64:
        raise TypeError(f"values must be float32 or float64, got dtype {values.dtype}; pass values.astype(np.float32)")
    inv = _as_int64_1d(inverse, "inverse")
    return np.ascontiguousarray(values), inv


def _inverse_index_error(i: int, u: int, n_rows: int) -> IndexError:
    return IndexError(f"inverse[{i}] = {u} is out of range for values with {n_rows} rows")


# ----------------------------------------------------------------------------------------------------------------------
# Reference implementations
# ----------------------------------------------------------------------------------------------------------------------


def dedup_pairs(premises: Sequence[str], hypotheses: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Find the unique directed (premise, hypothesis) pairs.

    Pairs are directed (``(a, b) != (b, a)``) and compared by exact string equality (no normalisation).

    Args:
        premises: ``N`` premise strings.
        hypotheses: ``N`` hypothesis strings, one per premise.

    Returns:
        ``(first_index, inverse)``: ``first_index`` int64 ``(U,)`` holds the position of each unique pair's first
        occurrence, in order of first occurrence; ``inverse`` int64 ``(N,)`` maps every input pair to its unique pair.

    Raises:
        ValueError: the two sequences differ in length.
        TypeError: an argument is not a sequence of str.
    """
    n = _check_pair_lengths(premises, hypotheses)
    seen: dict[tuple[str, str], int] = {}
    first: list[int] = []
    inverse = np.empty(n, dtype=np.int64)
    for i in range(n):
        p, h = premises[i], hypotheses[i]
        if not isinstance(p, str):
            raise _not_str_error("premises", i, p)
        if not isinstance(h, str):
            raise _not_str_error("hypotheses", i, h)
        u = seen.get((p, h))
        if u is None:
            u = len(first)
            seen[(p, h)] = u
            first.append(i)
        inverse[i] = u
    return np.asarray(first, dtype=np.int64), inverse


def flatten_token_lists(token_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``U`` token-id lists into one flat array.

    Returns:
        ``(flat, offsets)``: ``flat`` int64 ``(T,)``; ``offsets`` int64 ``(U+1,)`` with ``offsets[0] == 0``;
        row ``u`` is ``flat[offsets[u]:offsets[u+1]]``.

    Raises:
        TypeError: a token id is not an int.
        OverflowError: a token id does not fit in int64.
    """
    if isinstance(token_lists, (str, bytes)):
        raise TypeError(f"token_lists must be a sequence of token-id sequences, got {type(token_lists).__name__}")
    flat: list[int] = []
    offsets = [0]
    for u, row in enumerate(token_lists):
        for j, tok in enumerate(row):
            try:
                v = operator.index(tok)
            except TypeError:
                raise _token_error(u, j, tok) from None
            if not _INT64_MIN <= v <= _INT64_MAX:
                raise _token_overflow_error(u, j, tok)
            flat.append(v)
        offsets.append(len(flat))
    return np.asarray(flat, dtype=np.int64), np.asarray(offsets, dtype=np.int64)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plan_batches(lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int, pad_multiple: int = 1,
                 max_batch_attention: int = 0, batch_overhead_tokens: int = 0) -> Plan:
    """Plan length-sorted batches under a token budget and a row cap.

    Rows are taken longest first (ties by index) and every batch is a run of consecutive sorted rows. A batch's
    ``seq_len`` is its first (longest) row rounded up to ``pad_multiple``; it may hold ``rows`` rows while
    ``rows * seq_len <= max_batch_tokens``, ``rows <= max_batch_size`` and, when ``max_batch_attention > 0``,
    ``rows * seq_len ** 2 <= max_batch_attention``. A row whose padded length alone exceeds a budget gets a batch of
    its own.

    With ``batch_overhead_tokens == 0`` each batch takes as many rows as the budgets allow (greedy). With
    ``batch_overhead_tokens > 0`` the runs are the split that minimises ``padded_tokens + batch_overhead_tokens ×
    batches`` under the same budgets (exact, by dynamic programming over the sorted rows; among equally cheap
    choices a batch takes the most rows), so a short row is not padded to a long one's length only because the
    budget had room for it.

    Args:
        lengths: int ``(U,)``: token count of each unique row, ``>= 0``.
        max_batch_tokens: padded tokens per batch (``rows * seq_len``), ``>= 1``.
        max_batch_size: rows per batch, ``>= 1``.
        pad_multiple: round each batch's ``seq_len`` up to a multiple of this (default 1: no rounding).
        max_batch_attention: attention scores per head per batch (``rows * seq_len ** 2``), which bound the memory
            of a batch of long rows (default 0: no cap).
        batch_overhead_tokens: the fixed cost of one more batch, in padded tokens, ``>= 0`` (default 0: greedy).

    Raises:
        TypeError: ``lengths`` is not integral, or a budget is not an int.
        ValueError: ``lengths`` is not 1-D or holds a negative value, or a budget is < 1 (``max_batch_attention``
            and ``batch_overhead_tokens``: < 0).
    """
    lens = _check_lengths(lengths)
    budget = _as_count(max_batch_tokens, "max_batch_tokens", 1)
    cap = _as_count(max_batch_size, "max_batch_size", 1)
    multiple = _as_count(pad_multiple, "pad_multiple", 1)
    attention = _as_count(max_batch_attention, "max_batch_attention", 0)
    overhead = _as_count(batch_overhead_tokens, "batch_overhead_tokens", 0)
    n = lens.shape[0]
    order = np.argsort(-lens, kind="stable").astype(np.int64)
    seq = [_round_up(int(length), multiple) for length in lens[order]]
    take = [_max_rows(seq[i], budget, cap, attention, n - i) for i in range(n)]  # greedy: the most rows allowed
    if overhead:
        best = [0] * (n + 1)  # best[i]: the cheapest cost of rows i.. of the sorted order
        for i in range(n - 1, -1, -1):
            costs = [r * seq[i] + best[i + r] for r in range(1, take[i] + 1)]
            cheapest = min(costs)
            take[i] = max(r for r in range(1, take[i] + 1) if costs[r - 1] == cheapest)
            best[i] = cheapest + overhead
    bounds = [0]
    seq_lens: list[int] = []
    padded = 0
    i = 0
    while i < n:
        rows = take[i]
        seq_lens.append(seq[i])
        padded += rows * seq[i]
        i += rows
        bounds.append(i)
    return Plan(
        order=order,
        bounds=np.asarray(bounds, dtype=np.int64),
        seq_lens=np.asarray(seq_lens, dtype=np.int64),
        real_tokens=int(lens.sum()),
        padded_tokens=padded,
    )


def _max_rows(seq_len: int, budget: int, cap: int, attention: int, left: int) -> int:
    """The most rows a batch of padded length ``seq_len`` may hold under the budgets, at least 1, at most ``left``."""
    rows = cap if seq_len == 0 else min(cap, budget // seq_len)
    if attention and seq_len:
        rows = min(rows, attention // (seq_len * seq_len))
    return min(max(rows, 1), left)


def fill_batch(
    flat_ids: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    seq_len: int,
    pad_id: int,
    flat_type_ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Build one right-padded model batch from flat token rows.

    Args:
        flat_ids: int64 ``(T,)`` token ids, as from :func:`flatten_token_lists`.
        offsets: int64 ``(U+1,)`` row offsets into ``flat_ids``.
        rows: int64 ``(r,)`` unique row indices of this batch (e.g. ``plan.batch_rows(b)``).
        seq_len: padded length in tokens (e.g. ``plan.seq_lens[b]``); every row must fit.
        pad_id: token id written into padding positions.
        flat_type_ids: optional int64 ``(T,)`` token type (segment) ids aligned with ``flat_ids``; padded with 0.

    Returns:
        ``(input_ids, attention_mask, token_type_ids)``: C-contiguous int64 ``(r, seq_len)`` arrays (mask 1 on real
        tokens, 0 on padding); ``token_type_ids`` is None when ``flat_type_ids`` is None.

    Raises:
        IndexError: a row index is out of range.
        ValueError: a row is longer than ``seq_len``, or the offsets of a row are not a valid slice.
    """
    flat, offs, rws, s, p, types = _check_fill_args(flat_ids, offsets, rows, seq_len, pad_id, flat_type_ids)
    n_rows = offs.shape[0] - 1
    n_tokens = flat.shape[0]
    r = rws.shape[0]
    ids = np.full((r, s), p, dtype=np.int64)
    mask = np.zeros((r, s), dtype=np.int64)
    tt = np.zeros((r, s), dtype=np.int64) if types is not None else None
    for k in range(r):
        row = int(rws[k])
        if not 0 <= row < n_rows:
            raise _row_index_error(k, row, n_rows)
        start, stop = int(offs[row]), int(offs[row + 1])
        if not 0 <= start <= stop <= n_tokens:
            raise _bad_slice_error(row, start, stop, n_tokens)
        length = stop - start
        if length > s:
            raise _row_too_long_error(k, row, length, s)
        ids[k, :length] = flat[start:stop]
        mask[k, :length] = 1
        if tt is not None and types is not None:
            tt[k, :length] = types[start:stop]
    return ids, mask, tt


def scatter_rows(values: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """Expand per-unique results back to every input pair: ``out[i] = values[inverse[i]]``.

    Args:
        values: float32 or float64 ``(U, K)``: one result row per unique pair.
        inverse: int64 ``(N,)``, as from :func:`dedup_pairs`.

    Returns:
        ``(N, K)`` array of ``values.dtype``.

    Raises:
        IndexError: an ``inverse`` entry is outside ``[0, U)``.
    """
    vals, inv = _check_scatter_args(values, inverse)
    n_rows = vals.shape[0]
    out = np.empty((inv.shape[0], vals.shape[1]), dtype=vals.dtype)
    for i in range(inv.shape[0]):
        u = int(inv[i])
        if not 0 <= u < n_rows:
            raise _inverse_index_error(i, u, n_rows)
        out[i] = vals[u]
    return out
