"""Seeded benchmark workloads: NCP-shaped (short QA answers, long paragraphs, mixed) and CaLM-shaped.

Short answers mimic what sampled LLM answers to factual questions look like: 1–8 words, drawn from a few
candidate answers per question with a dominant one, so that samples repeat each other and the response (the "heavy
duplication real samples have"). Long answers are paragraphs of 2–6 sentences with the same structure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_ENTITIES = ["Paris", "Lyon", "Marseille", "Berlin", "Munich", "Rome", "Milan", "Madrid", "Lisbon", "Vienna",
             "George Washington", "John Adams", "Thomas Jefferson", "Abraham Lincoln", "Marie Curie",
             "Isaac Newton", "Albert Einstein", "Ada Lovelace", "Charles Darwin", "Nikola Tesla"]
_YEARS = [str(y) for y in range(1789, 2021, 7)]
_NOUNS = ["river", "bridge", "treaty", "company", "election", "museum", "cathedral", "railway", "university",
          "festival", "harbour", "mountain", "library", "parliament", "observatory"]
_ADJ = ["old", "famous", "large", "small", "northern", "southern", "first", "last", "new", "ancient"]
_VERBS = ["built", "founded", "signed", "opened", "designed", "won", "discovered", "moved to", "visited", "wrote"]


def _short_answer(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.35:
        return rng.choice(_ENTITIES)
    if kind < 0.55:
        return rng.choice(["In ", "", "Around ", "It was "]) + rng.choice(_YEARS) + rng.choice(["", "."])
    if kind < 0.8:
        return f"The {rng.choice(_ADJ)} {rng.choice(_NOUNS)}"
    if kind < 0.9:
        return f"{rng.choice(_ENTITIES)} {rng.choice(_VERBS)} it."
    return f"{rng.choice(_ENTITIES)} {rng.choice(_VERBS)} the {rng.choice(_NOUNS)} in {rng.choice(_YEARS)}."


def _sentence(rng: random.Random) -> str:
    return (f"{rng.choice(_ENTITIES)} {rng.choice(_VERBS)} the {rng.choice(_ADJ)} {rng.choice(_NOUNS)} in "
            f"{rng.choice(_YEARS)}, {rng.choice(['which', 'and this', 'although it'])} "
            f"{rng.choice(['changed the city', 'was widely reported', 'surprised many historians', 'is still debated', 'made the news across Europe'])}.")


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))


@dataclass
class Workload:
    """Responses and their sampled responses (one list per response)."""

    name: str
    responses: list[str]
    sampled_responses: list[list[str]]

    @property
    def num_prompts(self) -> int:
        return len(self.responses)


def _ncp(name: str, prompts: int, samples: int, seed: int, make: object) -> Workload:
    rng = random.Random(seed)
    responses, sampled = [], []
    for _ in range(prompts):
        gen = make if callable(make) else _short_answer
        pool = [gen(rng) for _ in range(rng.randint(2, 4))]  # candidate answers of this question
        weights = [6, 3, 1, 1][: len(pool)]  # a dominant answer: samples repeat it
        texts = rng.choices(pool, weights=weights, k=samples + 1)
        responses.append(texts[0])
        sampled.append(texts[1:])
    return Workload(name, responses, sampled)


def ncp_pairs(workload: Workload) -> list[tuple[str, str]]:
    """The directed (response, sample) and (sample, response) pairs NCP scores on ``workload``, repeats included."""
    pairs = []
    for response, samples in zip(workload.responses, workload.sampled_responses, strict=True):
        for sample in samples:
            pairs += [(response, sample), (sample, response)]
    return pairs


def short_workload(prompts: int = 200, samples: int = 5, seed: int = 0) -> Workload:
    """QA-style answers of 1–8 words with heavy duplication (the issue's 200 prompts × 5 samples)."""
    return _ncp("short", prompts, samples, seed, _short_answer)


def long_workload(prompts: int = 6, samples: int = 3, seed: int = 1) -> Workload:
    """Paragraph answers of 2–6 sentences (sized so the PyTorch peers finish in about a minute)."""
    return _ncp("long", prompts, samples, seed, _paragraph)


def mixed_workload(prompts: int = 100, samples: int = 5, seed: int = 2) -> Workload:
    """Mostly short answers with a tenth of the prompts answered in paragraphs: the padding stress test."""
    rng = random.Random(seed)
    short = short_workload(prompts, samples, seed)
    long = long_workload(max(1, prompts // 10), samples, seed + 1)
    responses = short.responses + long.responses
    sampled = short.sampled_responses + long.sampled_responses
    order = list(range(len(responses)))
    rng.shuffle(order)
    return Workload("mixed", [responses[i] for i in order], [sampled[i] for i in order])


def calm_workload(queries: int = 100, seed: int = 3) -> tuple[list[list[str]], list[list[str]]]:
    """CaLM-shaped: per query, main-answer statements (3–5) and verifier sentences (2–4)."""
    rng = random.Random(seed)
    statements = [[_sentence(rng) for _ in range(rng.randint(3, 5))] for _ in range(queries)]
    verifier = [[_sentence(rng) for _ in range(rng.randint(2, 4))] for _ in range(queries)]
    return statements, verifier
