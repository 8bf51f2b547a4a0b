"""Score unique pairs through one ONNX graph: tokenize once → pack by length → fill padded arrays → run → softmax.

This is the engine's inner loop. The kernels own the array work (planning batches under the padded-token budget and
filling ``input_ids``/``attention_mask`` in compiled code); this module owns the ORT calls and the label order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from fastnli.engine.tokenize import PairTokenizer
from fastnli.kernels import fill_batch, plan_batches


@dataclass(frozen=True)
class BatchPolicy:
    """How unique pairs are packed into batches.

    Attributes:
        max_batch_tokens: cap on ``rows × padded length`` of one batch, in tokens. A pair longer than the budget
            gets a batch of its own.
        max_batch_size: cap on rows per batch.
        pad_multiple: the padded length is rounded up to a multiple of this (8 suits GPU tensor cores).
        max_batch_attention: cap on ``rows × padded length²`` of one batch (attention scores per head), which bounds
            the memory of a batch of long rows; 0 means no cap.
        batch_overhead_tokens: the fixed cost of one more batch, in padded tokens. Above 0, the length-sorted rows
            are split into the batches that minimise ``padded tokens + this × batches`` under the caps
            (:func:`fastnli.kernels.plan_batches`), so short rows are not padded to a long row's length to fill a
            batch; 0 fills each batch as far as the caps allow.
    """

    max_batch_tokens: int = 4096
    max_batch_size: int = 64
    pad_multiple: int = 1
    max_batch_attention: int = 0
    batch_overhead_tokens: int = 0


#: CPU batches: the cheapest split at 32 tokens of overhead per batch (docs/engine.md: the default model, INT8, 2-core
#: AMD EPYC Zen 1, 1.04-1.45x the pairs/s of full batches on snli/dev, MultiNLI and the bench's NCP workloads).
CPU_POLICY = BatchPolicy(max_batch_tokens=4096, max_batch_size=64, pad_multiple=1, max_batch_attention=512 * 512,
                         batch_overhead_tokens=32)
CUDA_POLICY = BatchPolicy(max_batch_tokens=32768, max_batch_size=512, pad_multiple=8)


@dataclass
class RunStats:
    """What one scoring pass did (counts; tokens include special tokens)."""

    unique_pairs: int = 0
    batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32, max-shifted for stability."""
    z = logits.astype(np.float32, copy=False)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def score_unique(
    run: Callable[[dict[str, np.ndarray]], np.ndarray] | Sequence[Callable[[dict[str, np.ndarray]], np.ndarray]],
    tokenizer: PairTokenizer,
    premises: Sequence[str],
    hypotheses: Sequence[str],
    input_names: Sequence[str],
    columns: Sequence[int],
    pad_id: int,
    policy: BatchPolicy,
    stats: RunStats | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Probabilities ``(U, len(columns))`` float32 in canonical order (contradiction, neutral, entailment; a 2-way
    head: not_entailment, entailment) for U pairs.

    ``run`` maps a feed dict to logits ``(rows, num_labels)``; a list of them (one per stream: separate ORT
    sessions) runs batches concurrently, each stream taking the next unstarted batch. ``columns`` picks the
    canonical label columns; ``progress`` is called with ``(pairs in the finished batch, pairs to score in all)``,
    from one thread at a time.
    """
    n = len(premises)
    out = np.empty((n, len(columns)), dtype=np.float32)
    if n == 0:
        return out
    runs = [run] if callable(run) else list(run)
    want_types = "token_type_ids" in input_names
    flat, offsets, flat_types = tokenizer.encode(premises, hypotheses, with_type_ids=want_types)
    plan = plan_batches(np.diff(offsets), policy.max_batch_tokens, policy.max_batch_size, policy.pad_multiple,
                        policy.max_batch_attention, policy.batch_overhead_tokens)
    cols = np.asarray(columns, dtype=np.int64)
    lock = threading.Lock()

    def one_batch(b: int, stream: Callable[[dict[str, np.ndarray]], np.ndarray]) -> None:
        rows = plan.batch_rows(b)
        ids, mask, types = fill_batch(flat, offsets, rows, int(plan.seq_lens[b]), pad_id, flat_types)
        feed = {"input_ids": ids, "attention_mask": mask}
        if want_types and types is not None:
            feed["token_type_ids"] = types
        logits = stream({k: v for k, v in feed.items() if k in input_names})
        out[rows] = softmax(logits)[:, cols]  # batches own disjoint rows
        if progress is not None:
            with lock:
                progress(len(rows), n)

    if len(runs) == 1 or plan.num_batches == 1:
        for b in range(plan.num_batches):
            one_batch(b, runs[0])
    else:
        todo = iter(range(plan.num_batches))
        failed = threading.Event()

        def worker(stream: Callable[[dict[str, np.ndarray]], np.ndarray]) -> None:
            while not failed.is_set():
                with lock:
                    b = next(todo, None)
                if b is None:
                    return
                try:
                    one_batch(b, stream)
                except BaseException:
                    failed.set()  # the other streams stop taking batches
                    raise

        with ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix="fastnli-stream") as pool:
            for f in [pool.submit(worker, r) for r in runs[: plan.num_batches]]:
                f.result()  # re-raises a stream's error
    if stats is not None:
        stats.unique_pairs += n
        stats.batches += plan.num_batches
        stats.real_tokens += plan.real_tokens
        stats.padded_tokens += plan.padded_tokens
    return out
