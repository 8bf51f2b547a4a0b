"""uqlm's black-box NLI scorers, computed from a response set's pairwise probability matrix.

Everything here is pure NumPy on precomputed probabilities, so it can be checked against uqlm formula by formula.
A response set is ``texts = [response] + samples`` (m samples, duplicates kept); ``P[a, b]`` holds the engine's
probabilities ``(contradiction, neutral, entailment)`` of the directed pair (premise ``uniq[a]``, hypothesis
``uniq[b]``) over the *distinct* texts ``uniq``; ``pos[t]`` maps text position t to its row in ``uniq``.

As in uqlm (``uqlm/nli/nli.py``, ``uqlm/black_box/consistency.py``, ``uqlm/nli/cluster.py``,
``uqlm/scorers/shortform/black_box.py``):

- a pair of identical strings counts as non-contradiction 1, entailment score 1 and "entails", without the model;
- NCP(y) = 1 − (1/m) Σ_j (p_c(y, ỹ_j) + p_c(ỹ_j, y)) / 2 — m counts every sample, duplicates included;
- entailment(y) = (1/m) Σ_j (p_e(y, ỹ_j) + p_e(ỹ_j, y)) / 2;
- clustering: text t joins every existing cluster whose first member entails it in either direction (argmax label is
  entailment), else it opens a new cluster; cluster probabilities are the (normalised) sums of the members' uniform
  probabilities 1/(m+1); semantic_negentropy = 1 − H / log(m+1); semantic_sets_confidence = (m + 1 − #sets) / m;
- the best response (``use_best``) is the first member of the most probable cluster after uqlm's sort (the mode
  when a text repeats, else the longest).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from fastnli.engine.labels import CONTRADICTION, ENTAILMENT


def noncontradiction_and_entailment(P: np.ndarray, pos: Sequence[int], anchor: int = 0) -> tuple[float, float]:
    """(NCP, mean bidirectional entailment) of text position ``anchor`` against every other position."""
    a = pos[anchor]
    nc, en = [], []
    for t, b in enumerate(pos):
        if t == anchor:
            continue
        if b == a:  # identical strings
            nc.append(1.0)
            en.append(1.0)
        else:
            nc.append(((1.0 - P[a, b, CONTRADICTION]) + (1.0 - P[b, a, CONTRADICTION])) / 2.0)
            en.append((P[a, b, ENTAILMENT] + P[b, a, ENTAILMENT]) / 2.0)
    return float(np.mean(nc)), float(np.mean(en))


def _entails(P: np.ndarray, a: int, b: int) -> bool:
    if a == b:
        return True
    return bool(P[a, b].argmax() == ENTAILMENT or P[b, a].argmax() == ENTAILMENT)


def cluster(P: np.ndarray, pos: Sequence[int]) -> list[list[int]]:
    """uqlm's semantic clusters of the text positions (a position may join several clusters)."""
    clusters: list[list[int]] = [[0]]
    for t in range(1, len(pos)):
        joined = False
        for c in clusters:
            if _entails(P, pos[c[0]], pos[t]):
                c.append(t)
                joined = True
        if not joined:
            clusters.append([t])
    return clusters


def cluster_probabilities(clusters: Sequence[Sequence[int]], n_texts: int) -> list[float]:
    """Normalised cluster probabilities under uniform response probabilities 1/n_texts."""
    raw = [sum(1.0 / n_texts for _ in c) for c in clusters]
    total = sum(raw)
    return [p / total for p in raw] if total else [1.0 / len(raw)] * len(raw)


def semantic_scores(clusters: Sequence[Sequence[int]], m: int) -> tuple[float, float, int]:
    """(semantic_negentropy, semantic_sets_confidence, number of semantic sets) for m samples."""
    probs = cluster_probabilities(clusters, m + 1)
    entropy = abs(sum(p * math.log(p) if p > 0.0 else 0.0 for p in probs))
    return 1.0 - entropy / math.log(m + 1), (m + 1 - len(clusters)) / m, len(clusters)


def best_response(texts: Sequence[str], clusters: Sequence[Sequence[int]]) -> str:
    """uqlm's uncertainty-minimising response: the lead member of the most probable cluster."""
    probs = cluster_probabilities(clusters, len(texts))
    members = [texts[t] for t in clusters[probs.index(max(probs))]]
    mode, count = Counter(members).most_common(1)[0]
    if count > 1:
        return sorted(members, key=lambda x: (x != mode, x))[0]
    return sorted(members, key=len, reverse=True)[0]
