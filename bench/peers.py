"""The plain PyTorch peer: what uqlm and sentence-transformers do — fixed batches of 32 in input order, each padded to
its longest pair, fp32 (or fp16 on a GPU, as uqlm 0.6.5's batched path), ``torch.inference_mode``. Needs the export
extra (torch, transformers)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class TorchPeer:
    """A HF sequence-classification checkpoint run with PyTorch, probabilities in canonical order.

    ``device`` is ``"cpu"`` (default) or ``"cuda"``; ``dtype`` ``"fp32"`` (default) or ``"fp16"`` (the weights and
    the compute in half precision; the softmax in fp32).
    """

    def __init__(self, checkpoint: str | Path, batch_size: int = 32, threads: int | None = None,
                 device: str = "cpu", dtype: str = "fp32") -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from fastnli.engine.labels import canonical_columns

        if threads:
            torch.set_num_threads(threads)
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        torch_dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
        # Cast after loading: from_pretrained(dtype=float16) leaves DeBERTa's q_bias/v_bias in fp32, which then
        # promotes the attention query to fp32 and fails against the fp16 keys.
        self.model = AutoModelForSequenceClassification.from_pretrained(checkpoint).to(device=device, dtype=torch_dtype)
        self.model.eval()
        self.columns = canonical_columns(self.model.config.id2label)
        self.batch_size = batch_size
        self.padded_tokens = 0
        self.real_tokens = 0

    def predict(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        import torch

        out = []
        self.padded_tokens = self.real_tokens = 0
        with torch.inference_mode():
            for i in range(0, len(pairs), self.batch_size):
                chunk = pairs[i:i + self.batch_size]
                enc = self.tokenizer([p for p, _ in chunk], [h for _, h in chunk], padding=True,
                                     truncation="longest_first", max_length=512, return_tensors="pt")
                self.padded_tokens += int(enc["attention_mask"].numel())
                self.real_tokens += int(enc["attention_mask"].sum())
                logits = self.model(**enc.to(self.device)).logits.float()
                out.append(torch.softmax(logits, -1).cpu().numpy()[:, self.columns])
        return np.concatenate(out) if out else np.empty((0, 3), np.float32)

    def timed(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, float]:
        """Probabilities and the wall-clock seconds to them (on a GPU: until they are back on the host)."""
        t0 = time.perf_counter()
        probs = self.predict(pairs)
        return probs, time.perf_counter() - t0
