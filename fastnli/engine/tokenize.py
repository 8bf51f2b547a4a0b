"""Pair tokenization at run time with the ``tokenizers`` backend alone (no transformers, no torch).

The artifact carries the checkpoint's ``tokenizer.json``; its post-processor holds the model's real pair template
(``[CLS] premise [SEP] hypothesis [SEP]``). Truncation is ``longest_first`` to the model maximum, exactly what
``tokenizer(premises, hypotheses, truncation="longest_first", max_length=512)`` does in transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.kernels import flatten_token_lists

#: Special tokens a pair adds to its texts (``[CLS] premise [SEP] hypothesis [SEP]``), for token estimates.
PAIR_SPECIAL_TOKENS = 3


class PairTokenizer:
    """Tokenizes (premise, hypothesis) pairs into flat int64 token arrays.

    Args:
        tokenizer_json: path of the ``tokenizer.json`` file.
        max_length: truncation limit in tokens, special tokens included (default model maximum: 512).
    """

    def __init__(self, tokenizer_json: str | Path, max_length: int = 512) -> None:
        from tokenizers import Tokenizer

        self.max_length = int(max_length)
        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._tok.no_padding()
        self._tok.enable_truncation(max_length=self.max_length, strategy="longest_first", stride=0,
                                    direction="right")
        self._whole = Tokenizer.from_str(self._tok.to_str())  # the same tokenizer without truncation
        self._whole.no_truncation()
        processor = self._tok.post_processor
        #: special tokens a pair adds to its two texts (3 for ``[CLS] premise [SEP] hypothesis [SEP]``)
        self.pair_special_tokens = int(processor.num_special_tokens_to_add(True)) if processor is not None else 0

    def encode(
        self, premises: Sequence[str], hypotheses: Sequence[str], with_type_ids: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Tokenize pairs.

        Returns:
            ``(flat_ids, offsets, flat_type_ids)``: pair ``u``'s tokens are ``flat_ids[offsets[u]:offsets[u+1]]``;
            ``flat_type_ids`` (segment ids, 0 for the premise, 1 for the hypothesis) only when asked for.
        """
        encodings = self._tok.encode_batch(list(zip(premises, hypotheses)), add_special_tokens=True)
        flat, offsets = flatten_token_lists([e.ids for e in encodings])
        types = flatten_token_lists([e.type_ids for e in encodings])[0] if with_type_ids else None
        return flat, offsets, types

    def encode_texts(self, texts: Sequence[str]) -> list[Any]:
        """Tokenize single texts whole (no special tokens, no truncation): ``tokenizers`` ``Encoding`` objects,
        whose ``ids`` and ``offsets`` (character spans in the text) the window planner reads."""
        return list(self._whole.encode_batch(list(texts), add_special_tokens=False))
