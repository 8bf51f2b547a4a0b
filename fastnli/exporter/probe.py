"""The built-in probe set: premise/hypothesis pairs on which every exported precision is validated.

The pairs mix short QA-style answers (the NCP workload), sentences, paragraphs, an empty string, unicode and
one pair longer than 512 tokens (truncation path). Fixed text, so validation figures are comparable across exports.
"""

from __future__ import annotations

_SHORT = ["Paris", "Lyon", "1848", "1852", "George Washington", "John Adams", "blue", "red", "yes", "no",
          "Mount Everest", "K2", "the Pacific Ocean", "the Atlantic", "42", "forty-two"]
_SENTENCES = [
    "A man is playing a guitar on stage.",
    "A man is performing music.",
    "Nobody is playing an instrument.",
    "The capital of France is Paris.",
    "Paris is not the capital of France.",
    "The Eiffel Tower was completed in 1889 for the World's Fair.",
    "The Eiffel Tower was built in the twentieth century.",
    "Two dogs are running through a snowy field.",
    "The animals are asleep indoors.",
    "She bought three apples and an orange at the market yesterday.",
    "She went shopping.",
    "Water boils at 100 degrees Celsius at sea level.",
    "At sea level, water boils at a lower temperature than 50 degrees.",
    "The company reported record profits in the last quarter, driven by strong sales in Asia.",
    "The company lost money last quarter.",
    "Café au lait — naïve façade, Zürich, 東京.",
]
_PARAGRAPH = (
    "The committee met on Tuesday to review the budget. After a long discussion, members agreed to postpone the "
    "vote until next month. Several members said they needed more information about the costs of the new building. "
    "The chair promised to circulate a detailed report before the next meeting."
)


def probe_pairs() -> list[tuple[str, str]]:
    """Return the fixed probe set (about 100 directed pairs)."""
    pairs: list[tuple[str, str]] = []
    for i in range(0, len(_SHORT), 2):
        a, b = _SHORT[i], _SHORT[i + 1]
        pairs += [(a, b), (b, a), (a, a)]
    for i in range(len(_SENTENCES) - 1):
        pairs += [(_SENTENCES[i], _SENTENCES[i + 1]), (_SENTENCES[i + 1], _SENTENCES[i])]
    for s in _SENTENCES[::3]:
        pairs += [(_PARAGRAPH, s), (s, _PARAGRAPH)]
    pairs += [("", "Paris"), ("Paris", ""), ("", "")]
    long_text = " ".join([_PARAGRAPH] * 12)  # well over 512 tokens: exercises longest_first truncation
    pairs += [(long_text, _SENTENCES[0]), (_SENTENCES[0], long_text), (long_text, long_text[::-1])]
    return pairs
