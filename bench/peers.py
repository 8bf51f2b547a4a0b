"""The plain PyTorch peer: what uqlm and sentence-transformers do — fixed batches of 32 in input order, each padded to
its longest pair, fp32, ``torch.inference_mode``. Needs the export extra (torch, transformers)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class TorchPeer:
    """A HF sequence-classification checkpoint run with PyTorch on CPU, probabilities in canonical order."""

    def __init__(self, checkpoint: str | Path, batch_size: int = 32, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from fastnli.engine.labels import canonical_columns

        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
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
                logits = self.model(**enc).logits.float()
                out.append(torch.softmax(logits, -1).numpy()[:, self.columns])
        return np.concatenate(out) if out else np.empty((0, 3), np.float32)

    def timed(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        probs = self.predict(pairs)
        return probs, time.perf_counter() - t0
