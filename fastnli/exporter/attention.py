"""DeBERTa's relative-position terms exported for less work than ``transformers`` writes them (build time).

Export-time patches of ``transformers``' attention, each the same function as HF's (PyTorch references run
unpatched):

- The **position window** (:func:`position_window_export`, on by default where the shift does not apply: v2/v3, and
  v1 with a clamped span). HF projects the relative-position embeddings inside every layer after slicing them to the
  input's span, so the projections run at every call (v1: two products of ``2L`` rows per layer, a third of the
  content GEMMs' work on a batch of one 512-token pair). The patch projects the whole table, which depends on the
  weights only (ORT folds it into constants), and slices the projected rows. On v2/v3 HF also multiplies every
  layer's queries and keys with all ``2k`` rows (``k = position_buckets``, 256 in the v3 checkpoints) whatever the
  input's length, repeats them once per batch row (``Tile``) and then gathers the ``L`` columns each row needs. A
  sequence of ``L`` tokens only reaches the buckets ``k ± r``, ``r`` the largest |bucket| of its relative positions
  (``r = L - 1`` below ``k / 2`` tokens), so the patch takes those ``2r + 1`` projected rows, multiplies them with
  every batch row by broadcasting (no ``Tile``) and shifts the gather index by the window's start: on 24-token
  inputs, 47 of 512 rows.
- The **relative shift** (:func:`relative_shift_export`, on by default, v1 where positions never clamp, as
  deberta-large-mnli), below; it projects the whole table too.

HF's DeBERTa v1 computes each layer's content→position (c2p) and position→content (p2c) terms as a product with
all ``2L`` relative positions, ``(B, H, L, 2L)``, and then picks ``L`` of them per row with ``GatherElements`` over
an int64 index expanded to ``(B, H, L, L)`` (8 bytes per entry, written and read again in every layer). When the
relative positions of a self-attention layer are ``i - j`` and the span is the sequence length (no clamping), the
picked entries lie on a diagonal band: row ``i`` reads columns ``i - j + L`` (c2p) and ``j - i + L`` (p2c, then
transposed). Flattened, that band is one contiguous slice read with a row stride of ``2L - 1``, so the gather
becomes ``Reshape → Slice → Reshape → Slice`` (the c2p term reverses its ``2L`` position rows first, a slice of a
``(H, 2L, d)`` tensor) — the same values, no index tensor.

:func:`relative_shift_export` patches the attention of ``transformers``' DeBERTa (v1) for the duration of an ONNX
export, only for checkpoints where the shift is exact (:func:`applies`). With the whole table projected once, long
pairs take 0.87-0.89x the time of HF's graph on INT8 and 0.80x on fp32, short ones the same (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("fastnli")

SHIFT_RECIPE = "relative shift (fastnli.exporter.attention)"
WINDOW_RECIPE = "position window (fastnli.exporter.attention)"


def applies(config: dict[str, Any]) -> bool:
    """True for a DeBERTa v1 config whose relative positions never clamp: relative attention with c2p/p2c terms
    and a relative span at least the longest input (``max_relative_positions`` < 1 means
    ``max_position_embeddings``)."""
    if config.get("model_type") != "deberta" or not config.get("relative_attention"):
        return False
    span = int(config.get("max_relative_positions", -1) or -1)
    longest = int(config.get("max_position_embeddings", 512))
    span = longest if span < 1 else span
    return span >= longest and _has_position_terms(config)


def _has_position_terms(config: dict[str, Any]) -> bool:
    """True when the config's ``pos_att_type`` (a list, or ``"c2p|p2c"`` in older configs) has c2p or p2c."""
    kinds = config.get("pos_att_type") or []
    kinds = kinds.split("|") if isinstance(kinds, str) else kinds
    return bool({"c2p", "p2c"} & set(kinds))


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
    start, stop = self.max_relative_positions - length, self.max_relative_positions + length
    rel = rel_embeddings.unsqueeze(0)  # projected whole (constant: ORT folds it), then windowed
    score: Any = 0
    if "c2p" in self.pos_att_type:
        pos_key = self.transpose_for_scores(self.pos_proj(rel)[:, start:stop])  # (1, H, 2L, d)
        # c2p[i, j] = q_i . pos_key[i - j + L] = reversed[i, L - 1 - i + j], reversed[i, k] = q_i . pos_key[2L-1-k]
        reversed_att = torch.matmul(query_layer, torch.flip(pos_key, dims=[-2]).transpose(-1, -2))
        score = score + _band(reversed_att, length, length - 1)
    if "p2c" in self.pos_att_type:
        pos_query = self.transpose_for_scores(self.pos_q_proj(rel)[:, start:stop])
        pos_query = pos_query / torch.sqrt(torch.tensor(pos_query.size(-1), dtype=torch.float) * scale_factor)
        # p2c[i, j] = k_j . pos_query[i - j + L]: per key row a, band[a, b] = att[a, b - a + L], transposed
        att = torch.matmul(key_layer, pos_query.transpose(-1, -2).to(dtype=key_layer.dtype))
        score = score + _band(att, length, length).transpose(-1, -2)
    return score


def attention_recipe(config: dict[str, Any], relative_shift: bool = True, position_window: bool = True) -> str | None:
    """The fp32 recipe's ``attention`` entry an export of a checkpoint with ``config`` writes with these options
    (:func:`fastnli.exporter.export`'s defaults by default); None where the graph is HF's."""
    if relative_shift and applies(config):
        return SHIFT_RECIPE
    if position_window and window_applies(config):
        return WINDOW_RECIPE
    return None


def _four_dims(relative_pos: Any) -> Any:
    """HF's relative positions as ``(B, 1, Lq, Lk)`` (given ``(Lq, Lk)``, ``(B, Lq, Lk)`` or 4-dimensional)."""
    if relative_pos.dim() == 2:
        return relative_pos.unsqueeze(0).unsqueeze(0)
    if relative_pos.dim() == 3:
        return relative_pos.unsqueeze(1)
    if relative_pos.dim() != 4:
        raise ValueError(f"Relative position ids must be of dim 2 or 3 or 4. {relative_pos.dim()}")
    return relative_pos


def window_applies(config: dict[str, Any]) -> bool:
    """True for a DeBERTa (v1, v2 or v3) config with relative attention and c2p or p2c position terms."""
    if config.get("model_type") not in ("deberta", "deberta-v2") or not config.get("relative_attention"):
        return False
    return _has_position_terms(config)


def _windowed_attention_bias(self: Any, query_layer: Any, key_layer: Any, relative_pos: Any, rel_embeddings: Any,
                             scale_factor: int) -> Any:
    """DeBERTa v2's ``disentangled_attention_bias`` on the window of relative-position rows the input reaches (see
    the module docstring); query and key layers are ``(B * H, L, d)``."""
    import torch
    from transformers.models.deberta_v2 import modeling_deberta_v2 as hf

    if relative_pos is None:
        relative_pos = hf.build_relative_position(query_layer, key_layer, bucket_size=self.position_buckets,
                                                  max_position=self.max_relative_positions)
    relative_pos = _four_dims(relative_pos)
    span = self.pos_ebd_size
    heads = self.num_attention_heads
    relative_pos = relative_pos.to(device=query_layer.device, dtype=torch.long)
    r_pos = hf.build_rpos(query_layer, key_layer, relative_pos, self.max_relative_positions, self.position_buckets)
    reach = torch.maximum(relative_pos.abs().max(), r_pos.abs().max())
    start: Any = torch.clamp(span - reach, min=0)  # 0-dim tensors: the trace keeps them dynamic
    stop: Any = torch.clamp(span + reach + 1, max=2 * span)
    rows = torch.arange(start, stop, device=rel_embeddings.device)
    rel = rel_embeddings[0:span * 2, :].unsqueeze(0)  # projected whole (constant: ORT folds it), then windowed

    def window(proj: Any) -> Any:  # (H, 2r + 1, d)
        return self.transpose_for_scores(proj(rel).index_select(1, rows), heads)

    pos_key = pos_query = None
    if "c2p" in self.pos_att_type:
        pos_key = window(self.key_proj if self.share_att_key else self.pos_key_proj)
    if "p2c" in self.pos_att_type:
        pos_query = window(self.query_proj if self.share_att_key else self.pos_query_proj)

    def by_heads(layer: Any) -> Any:  # (B * H, L, d) -> (B, H, L, d): broadcasts against the (H, 2r + 1, d) rows
        return layer.view(-1, heads, layer.size(-2), layer.size(-1))

    score: Any = 0
    if pos_key is not None:
        scale = hf.scaled_size_sqrt(pos_key, scale_factor)
        c2p_att = torch.matmul(by_heads(query_layer), pos_key.transpose(-1, -2))
        c2p_att = c2p_att.view(-1, c2p_att.size(-2), c2p_att.size(-1))
        c2p_pos = torch.clamp(relative_pos + span, 0, span * 2 - 1) - start
        c2p_att = torch.gather(c2p_att, dim=-1, index=c2p_pos.squeeze(0).expand(
            [query_layer.size(0), query_layer.size(1), relative_pos.size(-1)]))
        score = score + c2p_att / scale.to(dtype=c2p_att.dtype)
    if pos_query is not None:
        scale = hf.scaled_size_sqrt(pos_query, scale_factor)
        p2c_pos = torch.clamp(-r_pos + span, 0, span * 2 - 1) - start
        p2c_att = torch.matmul(by_heads(key_layer), pos_query.transpose(-1, -2))
        p2c_att = p2c_att.view(-1, p2c_att.size(-2), p2c_att.size(-1))
        p2c_att = torch.gather(p2c_att, dim=-1, index=p2c_pos.squeeze(0).expand(
            [query_layer.size(0), key_layer.size(-2), key_layer.size(-2)])).transpose(-1, -2)
        score = score + p2c_att / scale.to(dtype=p2c_att.dtype)
    return score


def _v1_windowed_att_bias(self: Any, query_layer: Any, key_layer: Any, relative_pos: Any, rel_embeddings: Any,
                          scale_factor: int) -> Any:
    """DeBERTa v1's ``disentangled_att_bias`` with the position projections of the whole table, then HF's window of
    ``2 * span`` rows (see the module docstring); query and key layers are ``(B, H, L, d)``."""
    import torch
    from transformers.models.deberta import modeling_deberta as hf

    if relative_pos is None:
        relative_pos = hf.build_relative_position(query_layer, key_layer, query_layer.device)
    relative_pos = _four_dims(relative_pos)
    att_span = hf.compute_attention_span(query_layer, key_layer, self.max_relative_positions)
    relative_pos = relative_pos.long()
    start, stop = self.max_relative_positions - att_span, self.max_relative_positions + att_span
    rel = rel_embeddings.unsqueeze(0)  # projected whole (constant: ORT folds it), then windowed
    score: Any = 0
    if "c2p" in self.pos_att_type:
        pos_key_layer = self.transpose_for_scores(self.pos_proj(rel)[:, start:stop])
        c2p_att = torch.matmul(query_layer, pos_key_layer.transpose(-1, -2))
        c2p_pos = torch.clamp(relative_pos + att_span, 0, att_span * 2 - 1)
        score = score + torch.gather(c2p_att, dim=-1,
                                     index=hf.c2p_dynamic_expand(c2p_pos, query_layer, relative_pos))
    if "p2c" in self.pos_att_type:
        pos_query_layer = self.transpose_for_scores(self.pos_q_proj(rel)[:, start:stop])
        pos_query_layer = pos_query_layer / hf.scaled_size_sqrt(pos_query_layer, scale_factor)
        r_pos = hf.build_rpos(query_layer, key_layer, relative_pos)
        p2c_pos = torch.clamp(-r_pos + att_span, 0, att_span * 2 - 1)
        p2c_att = torch.matmul(key_layer, pos_query_layer.transpose(-1, -2).to(dtype=key_layer.dtype))
        p2c_att = torch.gather(p2c_att, dim=-1,
                               index=hf.p2c_dynamic_expand(p2c_pos, query_layer, key_layer)).transpose(-1, -2)
        score = score + hf.uneven_size_corrected(p2c_att, query_layer, key_layer, relative_pos)
    return score


@contextmanager
def position_window_export(config: dict[str, Any]) -> Iterator[bool]:
    """Within the block, ``transformers``' DeBERTa attention (v1, or v2/v3) computes its position terms on the window
    of projected relative-position rows the input reaches when :func:`window_applies` to ``config``; yields whether
    it does. Outside the block nothing is changed."""
    if not window_applies(config):
        yield False
        return
    if config.get("model_type") == "deberta":
        from transformers.models.deberta import modeling_deberta

        cls: Any = modeling_deberta.DisentangledSelfAttention
        name, patched = "disentangled_att_bias", _v1_windowed_att_bias
    else:
        from transformers.models.deberta_v2 import modeling_deberta_v2

        cls = modeling_deberta_v2.DisentangledSelfAttention
        name, patched = "disentangled_attention_bias", _windowed_attention_bias
    original = getattr(cls, name)
    setattr(cls, name, patched)
    try:
        yield True
    finally:
        setattr(cls, name, original)


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
