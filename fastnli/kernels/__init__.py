"""Pair scheduling kernels: deduplicate NLI pairs, plan length-sorted batches, fill padded batches, scatter results.

The functions come from the compiled extension ``fastnli.kernels._schedule`` when it is built, and from the
pure-Python reference ``fastnli.kernels.reference`` (same results, much slower) otherwise; the fallback logs one
warning on the ``fastnli`` logger saying how to build the extension. :data:`IMPLEMENTATION` says which is in use.

Environment:
    ``FASTNLI_KERNELS``: ``auto`` (default: compiled if built, else reference with a warning), ``compiled`` (raise
    ImportError if the extension is not built) or ``reference`` (always the pure-Python reference).

Typical use by the engine::

    first, inverse = dedup_pairs(premises, hypotheses)
    flat, offsets = flatten_token_lists(token_lists_of_unique_pairs)
    plan = plan_batches(np.diff(offsets), max_batch_tokens=8192, max_batch_size=64, pad_multiple=8)
    for b in range(plan.num_batches):
        ids, mask, _ = fill_batch(flat, offsets, plan.batch_rows(b), int(plan.seq_lens[b]), pad_id)
        probs[plan.batch_rows(b)] = run_model(ids, mask)
    per_pair = scatter_rows(probs, inverse)
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from fastnli._env import env_choice
from fastnli.kernels import reference
from fastnli.kernels.reference import Plan

__all__ = [
    "IMPLEMENTATION",
    "Plan",
    "dedup_pairs",
    "fill_batch",
    "flatten_token_lists",
    "plan_batches",
    "scatter_rows",
]

logger = logging.getLogger("fastnli")

BUILD_HINT = "build it with `pip install -e .` or `python setup.py build_ext --inplace` in the source tree"


def _select() -> tuple[ModuleType, Literal["compiled", "reference"]]:
    choice = env_choice("FASTNLI_KERNELS", "auto", ("auto", "compiled", "reference"))
    if choice == "reference":
        return reference, "reference"
    try:
        import fastnli.kernels._schedule as _schedule
    except ImportError as exc:
        if choice == "compiled":
            raise ImportError(
                f"FASTNLI_KERNELS=compiled but the extension fastnli.kernels._schedule cannot be imported ({exc}); "
                f"{BUILD_HINT}"
            ) from exc
        logger.warning(
            "fastnli.kernels: the compiled scheduler fastnli.kernels._schedule is not available (%s); using the "
            "pure-Python reference, which is much slower. To fix it, %s.",
            exc,
            BUILD_HINT,
        )
        return reference, "reference"
    return _schedule, "compiled"


_impl, IMPLEMENTATION = _select()

if TYPE_CHECKING:  # type checkers see the annotated reference signatures; both modules have the same API
    from fastnli.kernels.reference import dedup_pairs, fill_batch, flatten_token_lists, plan_batches, scatter_rows
else:
    dedup_pairs = _impl.dedup_pairs
    flatten_token_lists = _impl.flatten_token_lists
    plan_batches = _impl.plan_batches
    fill_batch = _impl.fill_batch
    scatter_rows = _impl.scatter_rows
