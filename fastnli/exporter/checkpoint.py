"""Seeded random NLI checkpoints with the real DeBERTa (and BERT) architectures.

No model hub is needed: a tokenizer is made locally from a small built-in corpus (the same for the same seed) and the
weights are drawn from a seeded generator. The compute of such a checkpoint is the real model's (same layers,
same attention, same shapes); only its probabilities are meaningless. Tests and benchmarks use these checkpoints.
Needs the export extra (``pip install 'fastnli[export]'``: torch, transformers).

Shapes (``size``):

- ``tiny``: 2 layers, hidden 32 — for unit tests (seconds to build and export).
- ``base``: 12 layers, hidden 768 — deberta-base / deberta-v3-base shaped.
- ``large``: 24 layers, hidden 1024, vocab 50265 — deberta-large-mnli shaped (406M parameters).

Architectures (``arch``):

- ``deberta``: DeBERTa v1 as in microsoft/deberta-large-mnli — relative attention (c2p, p2c), no token types,
  GPT-2 style byte-level BPE tokenizer, labels CONTRADICTION/NEUTRAL/ENTAILMENT.
- ``deberta-v2``: DeBERTa-v2/v3 — shared attention keys, log-bucketed positions, a Unigram (SentencePiece-style)
  tokenizer.
- ``bert``: BERT as the embedded default model (all-MiniLM-L6-v2 fine-tuned) — absolute positions, token types,
  a WordPiece tokenizer; its attention exports as PyTorch's scaled-dot-product pattern.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any, Literal

__all__ = ["build_checkpoint", "LABEL_ORDERS", "corpus"]

logger = logging.getLogger("fastnli")

#: How to install what building a checkpoint needs.
EXPORT_EXTRA_HINT = "pip install 'fastnli[export]'"

Arch = Literal["deberta", "deberta-v2", "bert"]
Size = Literal["tiny", "base", "large"]

#: id2label orders seen on the hub: deberta-large-mnli (C/N/E), cross-encoder/nli-deberta-v3 (C/E/N),
#: MoritzLaurer/DeBERTa-v3-*-mnli (E/N/C); 2-way heads: the zero-shot v2.0 family (entailment / not_entailment) and
#: grounding checkers (unsupported / supported).
LABEL_ORDERS: dict[str, list[str]] = {
    "cne": ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"],
    "cen": ["contradiction", "entailment", "neutral"],
    "enc": ["entailment", "neutral", "contradiction"],
    "2way": ["entailment", "not_entailment"],
    "2way-supported": ["unsupported", "supported"],
}

_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
}
_VOCAB = {"tiny": 2000, "base": 8000, "large": 8000}
_CONFIG_VOCAB = {("deberta", "large"): 50265, ("deberta", "base"): 50265, ("deberta-v2", "base"): 128100,
                 ("deberta-v2", "large"): 128100}

_SUBJECTS = ["A man", "A woman", "Two children", "The dog", "A group of people", "The president", "My neighbour",
             "The capital of France", "Paris", "The river", "An old car", "The team", "A young girl", "The scientist",
             "Water", "The moon", "Berlin", "The first emperor", "A small bird", "The company"]
_VERBS = ["is", "was", "plays", "eats", "runs to", "sees", "likes", "builds", "visits", "paints", "opens",
          "sells", "reads", "is not", "never was", "became", "founded", "crossed", "won", "lost"]
_OBJECTS = ["the ball", "a red apple", "the park", "Rome", "in 1848", "a large house", "the river bank",
            "the final match", "an election", "the museum", "blue", "very tall", "a famous painter", "at night",
            "the old bridge", "42 years old", "the city of London", "during the summer", "with friends", "alone"]


def corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """Return ``n`` seeded English-like sentences (the tokenizer's training text and the workloads' vocabulary)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
        if rng.random() < 0.3:
            s += f" and {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
        out.append(s + rng.choice([".", ".", "!", "?"]))
    # Unicode and digits, so that tests on such text do not only hit [UNK].
    out += ["Café crème à Genève — naïve façade.", "東京は日本の首都です。", "Ünïcødé ✓ 12345 67890 3.14"] * 5
    return out


def _make_tokenizer(arch: Arch, vocab_size: int, seed: int):  # type: ignore[no-untyped-def]
    """The checkpoint's tokenizer, the same for the same arguments in every process.

    The byte-level BPE is trained with ``tokenizers``' trainer. The WordPiece and Unigram vocabularies are built here
    from the corpus's word counts: those two trainers break ties in hash-map order, which changes from process to
    process, so the same seed would give other token ids (and other test inputs) on every run.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    special = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    text = corpus(seed=seed)
    if arch == "bert":
        normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
        words = _word_counts(text, normalizer, pre_tokenizer)
        chars = sorted({c for w in words for c in w})
        pieces = special + chars + [f"##{c}" for c in chars] + _by_count(words, set(chars))
        tok = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces[:vocab_size])}, unk_token="[UNK]"))
        tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
        tok.decoder = decoders.WordPiece()
    elif arch == "deberta":
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(text, trainer=trainer)
    else:
        normalizer, pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
        words = _word_counts(text, normalizer, pre_tokenizer)
        total = sum(words.values())
        chars = sorted({c for w in words for c in w})
        scored = [(w, math.log(words[w] / total)) for w in _by_count(words, set(chars))]
        floor = min(score for _, score in scored) - 10.0  # a word is one piece, never its characters
        vocab = [(p, 0.0) for p in special] + [(c, floor) for c in chars] + scored
        tok = Tokenizer(models.Unigram(vocab[:vocab_size], unk_id=special.index("[UNK]")))
        tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
        tok.decoder = decoders.Metaspace()
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tok


def _word_counts(text: list[str], normalizer: Any, pre_tokenizer: Any) -> Counter[str]:
    """How often each pre-tokenized word of ``text`` occurs, after ``normalizer``."""
    return Counter(w for line in text for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)))


def _by_count(words: Counter[str], skip: set[str]) -> list[str]:
    """``words`` most frequent first, ties in alphabetical order, without those in ``skip``."""
    return [w for w in sorted(words, key=lambda w: (-words[w], w)) if w not in skip]


def build_checkpoint(
    out_dir: str | Path,
    arch: Arch = "deberta",
    size: Size = "tiny",
    seed: int = 0,
    label_order: str = "cne",
    num_layers: int | None = None,
) -> Path:
    """Build a seeded random sequence-classification checkpoint and its tokenizer in ``out_dir``.

    Args:
        out_dir: directory to write (created; existing files are overwritten).
        arch: ``"deberta"`` (v1, as deberta-large-mnli) or ``"deberta-v2"`` (v2/v3).
        size: ``"tiny"``, ``"base"`` or ``"large"`` (see the module docstring).
        seed: seeds the tokenizer corpus and the weights; the same seed gives the same bytes.
        label_order: a key of :data:`LABEL_ORDERS` — the checkpoint's own ``id2label`` order (``"2way"`` and
            ``"2way-supported"`` build a 2-way head).
        num_layers: override the layer count (e.g. a 2-layer large-width model for quick checks).

    Returns:
        The checkpoint directory, loadable with ``AutoModelForSequenceClassification.from_pretrained``.

    Raises:
        ImportError: without torch or transformers, naming the extra to install (:data:`EXPORT_EXTRA_HINT`).
    """
    try:
        import torch
        from transformers import (
            BertConfig,
            BertForSequenceClassification,
            BertTokenizerFast,
            DebertaConfig,
            DebertaForSequenceClassification,
            DebertaTokenizerFast,
            DebertaV2Config,
            DebertaV2ForSequenceClassification,
            DebertaV2TokenizerFast,
        )
    except ImportError as exc:
        raise ImportError(f"building a checkpoint needs torch and transformers ({exc.name or exc} is not "
                          f"installed); install the export extra: {EXPORT_EXTRA_HINT}") from None

    if arch not in ("deberta", "deberta-v2", "bert"):
        raise ValueError(f"arch={arch!r} is not supported; use 'deberta', 'deberta-v2' or 'bert'")
    if size not in _SIZES:
        raise ValueError(f"size={size!r} is not supported; use one of {sorted(_SIZES)}")
    if label_order not in LABEL_ORDERS:
        raise ValueError(f"label_order={label_order!r} is not supported; use one of {sorted(LABEL_ORDERS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = _make_tokenizer(arch, _VOCAB[size], seed)
    vocab = max(tok.get_vocab_size(), _CONFIG_VOCAB.get((arch, size), 0))
    labels = LABEL_ORDERS[label_order]
    dims = dict(_SIZES[size])
    if num_layers is not None:
        dims["num_hidden_layers"] = num_layers
    common = dict(
        vocab_size=vocab, max_position_embeddings=512, type_vocab_size=0, relative_attention=True,
        max_relative_positions=-1, position_biased_input=False, pad_token_id=0, layer_norm_eps=1e-7,
        initializer_range=0.1,
        pooler_hidden_size=dims["hidden_size"], pooler_dropout=0.0, pooler_hidden_act="gelu",
        id2label=dict(enumerate(labels)), label2id={lab: i for i, lab in enumerate(labels)}, **dims,
    )
    torch.manual_seed(seed)
    config: Any
    model: Any
    hf_tok: Any
    if arch == "bert":
        config = BertConfig(**{**common, "type_vocab_size": 2, "layer_norm_eps": 1e-12})
        model = BertForSequenceClassification(config)
        hf_tok = BertTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                   unk_token="[UNK]", mask_token="[MASK]", model_max_length=512)
    elif arch == "deberta":
        config = DebertaConfig(pos_att_type=["c2p", "p2c"], **common)
        model = DebertaForSequenceClassification(config)
        hf_tok = DebertaTokenizerFast(tokenizer_object=tok, bos_token="[CLS]", eos_token="[SEP]", cls_token="[CLS]",
                                      sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]",
                                      model_max_length=512)
    else:
        config = DebertaV2Config(pos_att_type=["p2c", "c2p"], position_buckets=256, norm_rel_ebd="layer_norm",
                                 share_att_key=True, **common)
        model = DebertaV2ForSequenceClassification(config)
        hf_tok = DebertaV2TokenizerFast(tokenizer_object=tok, vocab_file=None, bos_token="[CLS]", eos_token="[SEP]",
                                        cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
                                        mask_token="[MASK]", model_max_length=512)
    # The hub's init (std 0.02) gives the same near-uniform probabilities for every input: [CLS] barely mixes with
    # the other tokens. A wider init (0.1) and classifier scale make the probabilities depend on the input, so that
    # parity, argmax-agreement and label-order tests mean something.
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 2.0 / dims["hidden_size"] ** 0.5)
        model.classifier.bias.zero_()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    (out / "fastnli_synthetic.json").write_text(json.dumps(
        {"arch": arch, "size": size, "seed": seed, "label_order": label_order, "num_layers": dims["num_hidden_layers"],
         "note": "seeded random weights: real architecture and compute, meaningless probabilities"}, indent=2))
    logger.info("built %s/%s checkpoint (seed %d) in %s", arch, size, seed, out)
    return out
