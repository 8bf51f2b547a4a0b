"""Canonical label order and the mapping from a checkpoint's own ``id2label`` to it.

fastnli always returns probabilities as ``(contradiction, neutral, entailment)`` — uqlm's order — whatever the
checkpoint's own order is (deberta-large-mnli: C/N/E; cross-encoder/nli-deberta-v3-*: C/E/N;
MoritzLaurer/DeBERTa-v3-*-mnli: E/N/C).
"""

from __future__ import annotations

from collections.abc import Mapping

CANONICAL_LABELS: tuple[str, str, str] = ("contradiction", "neutral", "entailment")
CONTRADICTION, NEUTRAL, ENTAILMENT = 0, 1, 2

_PREFIXES = {"contradiction": ("contradict",), "neutral": ("neutral",), "entailment": ("entail",)}


def canonical_columns(id2label: Mapping[int | str, str]) -> list[int]:
    """Return, for each canonical label, the index of the checkpoint's logit column that holds it.

    Args:
        id2label: the checkpoint config's ``id2label`` (keys may be ints or digit strings).

    Raises:
        ValueError: when the labels are not exactly one contradiction, one neutral and one entailment label
            (e.g. ``LABEL_0``/``LABEL_1`` of an untrained head, or a 2-way entailment model).
    """
    labels = {int(k): str(v) for k, v in id2label.items()}
    columns: list[int] = []
    for name in CANONICAL_LABELS:
        hits = [i for i, lab in labels.items() if lab.strip().lower().startswith(_PREFIXES[name])]
        if len(hits) != 1:
            found = ", ".join(f"{i}: {lab!r}" for i, lab in sorted(labels.items()))
            what = "no" if not hits else "more than one"
            raise ValueError(
                f"the checkpoint's id2label has {what} {name!r} label (id2label = {{{found}}}); fastnli needs a 3-way "
                "NLI head with contradiction, neutral and entailment labels — fix the config's id2label or use an "
                "MNLI-trained checkpoint such as microsoft/deberta-large-mnli"
            )
        columns.append(hits[0])
    if len(labels) != 3:
        raise ValueError(f"the checkpoint has {len(labels)} labels; fastnli needs exactly 3 (contradiction, neutral, "
                         "entailment)")
    return columns
