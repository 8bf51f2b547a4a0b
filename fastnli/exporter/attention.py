"""DeBERTa v1's relative-position terms exported as a relative shift instead of gathers (build time).

HF's DeBERTa v1 computes each layer's content→position (c2p) and position→content (p2c) terms as a product with
all ``2L`` relative positions, ``(B, H, L, 2L)``, and then picks ``L`` of them per row with ``GatherElements`` over
an int64 index expanded to ``(B, H, L, L)`` (8 bytes per entry, written and read again in every layer). When the
relative positions of a self-attention layer are ``i - j`` and the span is the sequence length (no clamping), the
picked entries lie on a diagonal band: row ``i`` reads columns ``i - j + L`` (c2p) and ``j - i + L`` (p2c, then
transposed). Flattened, that band is one contiguous slice read with a row stride of ``2L - 1``, so the gather
becomes ``Reshape → Slice → Reshape → Slice`` (the c2p term reverses its ``2L`` position rows first, a slice of a
``(H, 2L, d)`` tensor) — the same values, no index tensor.

:func:`relative_shift_export` patches the attention of ``transformers``' DeBERTa (v1) for the duration of an ONNX
export, only for checkpoints where the shift is exact (:func:`applies`); PyTorch references run unpatched. Opt-in
(``export(relative_shift=True)``): it removes the gathers' share of the profile on long pairs, but ORT's ``Slice``
takes much of it back and the INT8 graph was not measured faster end to end (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("fastnli")


def applies(config: dict[str, Any]) -> bool:
    """True for a DeBERTa v1 config whose relative positions never clamp: relative attention with c2p/p2c terms
    and a relative span at least the longest input (``max_relative_positions`` < 1 means
    ``max_position_embeddings``)."""
    if config.get("model_type") != "deberta" or not config.get("relative_attention"):
        return False
    span = int(config.get("max_relative_positions", -1) or -1)
    longest = int(config.get("max_position_embeddings", 512))
    span = longest if span < 1 else span
    kinds = config.get("pos_att_type") or []
    kinds = kinds.split("|") if isinstance(kinds, str) else kinds
    return span >= longest and bool({"c2p", "p2c"} & set(kinds))


def _band(att: Any, length: Any, offset: Any) -> Any:
    """The ``(..., L, L)`` band of ``att`` (``(..., L, 2L)``) with ``out[i, j] = flat[offset + i(2L - 1) + j]``, where
    ``flat`` is ``att`` with its last two axes flattened: row ``i`` read from column ``offset - i + j``."""
    lead = att.shape[:-2]
    flat = att.reshape(*lead, -1)
    width = 2 * length - 1
    flat = flat[..., offset:offset + length * width]
    return flat.reshape(*lead, length, width)[..., :length]


def _disentangled_att_bias(self: Any, query_layer: Any, key_layer: Any, relative_pos: Any, rel_embeddings: Any,
                           scale_factor: int) -> Any:
    """DeBERTa v1's ``disentangled_att_bias`` with the relative shift (self-attention, relative position ``i - j``,
    span ``L``; see the module docstring)."""
    import torch

    length = query_layer.size(-2)
    rel = rel_embeddings[self.max_relative_positions - length:self.max_relative_positions + length, :].unsqueeze(0)
    score: Any = 0
    if "c2p" in self.pos_att_type:
        pos_key = self.transpose_for_scores(self.pos_proj(rel))  # (1, H, 2L, d)
        # c2p[i, j] = q_i . pos_key[i - j + L] = reversed[i, L - 1 - i + j], reversed[i, k] = q_i . pos_key[2L-1-k]
        reversed_att = torch.matmul(query_layer, torch.flip(pos_key, dims=[-2]).transpose(-1, -2))
        score = score + _band(reversed_att, length, length - 1)
    if "p2c" in self.pos_att_type:
        pos_query = self.transpose_for_scores(self.pos_q_proj(rel))
        pos_query = pos_query / torch.sqrt(torch.tensor(pos_query.size(-1), dtype=torch.float) * scale_factor)
        # p2c[i, j] = k_j . pos_query[i - j + L]: per key row a, band[a, b] = att[a, b - a + L], transposed
        att = torch.matmul(key_layer, pos_query.transpose(-1, -2).to(dtype=key_layer.dtype))
        score = score + _band(att, length, length).transpose(-1, -2)
    return score


@contextmanager
def relative_shift_export(config: dict[str, Any]) -> Iterator[bool]:
    """Within the block, ``transformers``' DeBERTa v1 attention computes its position terms with the relative shift
    when :func:`applies` to ``config``; yields whether it does. Outside the block nothing is changed."""
    if not applies(config):
        yield False
        return
    from transformers.models.deberta import modeling_deberta

    cls = modeling_deberta.DisentangledSelfAttention
    original = cls.disentangled_att_bias
    setattr(cls, "disentangled_att_bias", _disentangled_att_bias)  # noqa: B010  (a method: mypy refuses `=`)
    try:
        yield True
    finally:
        setattr(cls, "disentangled_att_bias", original)  # noqa: B010
