"""Canonical label orders and the mapping from a checkpoint's own ``id2label`` to them.

fastnli returns probabilities of a 3-way NLI head as ``(contradiction, neutral, entailment)`` — uqlm's order —
whatever the checkpoint's own order is (deberta-large-mnli: C/N/E; cross-encoder/nli-deberta-v3-*: C/E/N;
MoritzLaurer/DeBERTa-v3-*-mnli: E/N/C). A 2-way head (the zero-shot and grounding checkpoints: ``entailment`` /
``not_entailment``, or ``supported`` / ``unsupported``) gives ``(not_entailment, entailment)``. Entailment is the
last column of both orders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CANONICAL_LABELS: tuple[str, str, str] = ("contradiction", "neutral", "entailment")
TWO_WAY_LABELS: tuple[str, str] = ("not_entailment", "entailment")
CONTRADICTION, NEUTRAL, ENTAILMENT = 0, 1, 2
#: Column of P(entailment) in either order.
ENTAILMENT_COLUMN = -1

_PREFIXES = {"contradiction": ("contradict",), "neutral": ("neutral",), "entailment": ("entail",)}
_TWO_WAY = {
    "not_entailment": ("not_entail", "not entail", "not-entail", "non_entail", "non-entail", "non entail",
                       "unsupported", "not_supported", "not supported"),
    "entailment": ("entail", "supported"),
}


def _norm(label: str) -> str:
    return label.strip().lower()


def _is_two_way(labels: Mapping[int, str]) -> bool:
    names = [_norm(v) for v in labels.values()]
    return len(names) == 2 and any(n.startswith(_TWO_WAY["not_entailment"]) for n in names)


def canonical_columns(id2label: Mapping[int | str, str]) -> list[int]:
    """Return, for each canonical label, the index of the checkpoint's logit column that holds it.

    A 3-way head gives three columns (contradiction, neutral, entailment); a 2-way head, whose labels are an
    entailment label (``entailment``, ``supported``) and its negation (``not_entailment``, ``non-entailment``,
    ``unsupported``, ...), gives two (not_entailment, entailment).

    Args:
        id2label: the checkpoint config's ``id2label`` (keys may be ints or digit strings).

    Raises:
        ValueError: when the labels are neither exactly one contradiction, one neutral and one entailment label, nor
            one entailment and one not-entailment label (e.g. ``LABEL_0``/``LABEL_1`` of an untrained head).
    """
    labels = {int(k): str(v) for k, v in id2label.items()}
    found = ", ".join(f"{i}: {lab!r}" for i, lab in sorted(labels.items()))
    if _is_two_way(labels):
        negative = [i for i, lab in labels.items() if _norm(lab).startswith(_TWO_WAY["not_entailment"])]
        positive = [i for i, lab in labels.items() if i not in negative and _norm(lab).startswith(_TWO_WAY["entailment"])]
        if len(negative) == 1 and len(positive) == 1:
            return [negative[0], positive[0]]
        raise ValueError(f"the checkpoint's 2-way id2label needs one entailment label ('entailment' or 'supported') "
                         f"and one not-entailment label ('not_entailment' or 'unsupported'); got {{{found}}} — fix "
                         "the config's id2label")
    columns: list[int] = []
    for name in CANONICAL_LABELS:
        hits = [i for i, lab in labels.items() if _norm(lab).startswith(_PREFIXES[name])]
        if len(hits) != 1:
            what = "no" if not hits else "more than one"
            raise ValueError(
                f"the checkpoint's id2label has {what} {name!r} label (id2label = {{{found}}}); fastnli needs a 3-way "
                "NLI head with contradiction, neutral and entailment labels, or a 2-way head with entailment and "
                "not_entailment labels — fix the config's id2label or use an NLI-trained checkpoint such as "
                "microsoft/deberta-large-mnli"
            )
        columns.append(hits[0])
    if len(labels) != 3:
        raise ValueError(f"the checkpoint has {len(labels)} labels; fastnli needs exactly 3 (contradiction, neutral, "
                         "entailment) or 2 (not_entailment, entailment)")
    return columns


def labels_of(columns: Sequence[int]) -> tuple[str, ...]:
    """The canonical label order of a head with these canonical ``columns``: 3-way or 2-way."""
    return CANONICAL_LABELS if len(columns) == 3 else TWO_WAY_LABELS


def require_three_way(labels: Sequence[str], what: str) -> None:
    """Raise ValueError when ``labels`` (an engine's :attr:`~fastnli.NLIEngine.labels`) has no contradiction column.

    Args:
        labels: the engine's canonical labels.
        what: the caller, as the message names it (e.g. ``"scorer 'noncontradiction'"``).
    """
    if tuple(labels) != CANONICAL_LABELS:
        raise ValueError(f"{what} needs P(contradiction), but the engine's model has a 2-way head "
                         f"{tuple(labels)}; use a 3-way NLI model (contradiction, neutral, entailment), or checks that "
                         "read P(entailment) only (fastnli.grounding, CaLM/ALCE citation checks)")
