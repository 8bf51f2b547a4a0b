"""Answer-consistency and long-premise NLI pairs built from licensed data.

One deterministic builder makes both the training mixture of the embedded default model and its mission-shaped
evaluation (the job NCP and CaLM do: do two answers to one question agree; does a cited document support a
statement). Sources, all licensed for a shipped model (``<data>/README.md``):

- ``qa/*.jsonl`` (NQ-open dev, EfficientQA dev; CC BY-SA 3.0): questions with their accepted short answers;
- ``train.jsonl`` without ``lingnli`` rows and ``dev.jsonl``'s ``mnli/dev_matched`` rows: sentences for sentence-level
  value swaps, negations and the filler of long premises;
- ``dev.jsonl``'s ``snli/dev`` rows: the labelled pairs of the long-premise evaluation (never trained on).

Every question, sentence and snli/dev premise falls into one part by a hash of its text: ``train`` (70%), ``dev``
(10%: free to look at while building the recipe) or ``test`` (20%: reported, never used to choose anything). Filler
sentences come from disjoint pools for training and evaluation.

Rows are ``{"premise", "hypothesis", "label", "source", "category", "part", "question", "pair_id"}``; an evaluation
pair appears once per direction (``pair_id`` ties the two), so "either direction" and "both ways" are computed per
pair. ``label`` is the label of that direction.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastnli.scorers.questions import with_question  # the question-aware form the model is trained on

PARTS = ("train", "dev", "test")
QA_FILES = ("qa/nq_open_dev.jsonl", "qa/efficientqa_dev.jsonl")
SENTENCE_SOURCES = ("snli/train", "cad_snli", "wanli/train", "mnli/dev_matched")
FILLER_SOURCE = "mnli/dev_matched"
LONG_EVAL_SOURCE = "snli/dev"

# categories of the evaluation, and the goal each belongs to
VALUE_SWAPS = ("year_swap", "date_swap", "number_swap", "quantity_swap", "unit_swap", "entity_swap",
               "sentence_number_swap", "negation", "event_year_swap", "event_date_swap")
MEANING_KEPT = ("format_variant", "alias", "unit_equivalent", "sentence_format", "event_format")
# another city of the same place against the right one, and the right one in other words: measured on their own
PLACE_SWAPS = ("place_swap",)
PLACE_KEPT = ("place_format",)
PLACE_ONE_WAY = ("place_stated",)  # the answer in a sentence -> the bare answer: entailment; back: neutral
ONE_WAY = ("more_specific", "event_more_specific")  # specific -> general: entailment; general -> specific: neutral

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
_WORD_VALUE = {w: i for i, w in enumerate(NUMBER_WORDS)}
_YEAR = re.compile(r"^(?:in |the year )?(1[0-9]{3}|20[0-9]{2})$", re.I)
_DAY_MONTH_YEAR = re.compile(r"^(?:on )?(\d{1,2}) (" + "|".join(MONTHS) + r"),? (\d{4})(?: UTC)?$", re.I)
_MONTH_DAY_YEAR = re.compile(r"^(?:on )?(" + "|".join(MONTHS) + r") (\d{1,2}),? (\d{4})$", re.I)
_MONTH_YEAR = re.compile(r"^(?:in )?(" + "|".join(MONTHS) + r"),? (\d{4})$", re.I)
_NUMBER = re.compile(r"^(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)$")
_QUANTITY = re.compile(r"^(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?|" + "|".join(NUMBER_WORDS[1:]) + r") ([a-z][a-z ]{1,30})$",
                       re.I)
_STOP = frozenset(["a", "an", "the", "of", "in", "on", "at", "to", "and", "or", "is", "are", "was", "were", "be", "been", "by", "for", "with", "from", "as", "that", "this", "it", "its", "his", "her", "their", "there", "he", "she", "they", "we", "you", "i", "not", "no"])
# (name, unit a, unit b, a -> b, plausible range of a)
UNITS = (
    ("temperature", "degrees Celsius", "degrees Fahrenheit", lambda v: v * 9 / 5 + 32, (-40, 200)),
    ("distance", "kilometres", "miles", lambda v: v * 0.621371, (1, 5000)),
    ("mass", "kilograms", "pounds", lambda v: v * 2.20462, (1, 2000)),
    ("height", "metres", "feet", lambda v: v * 3.28084, (1, 9000)),
    ("volume", "litres", "US gallons", lambda v: v * 0.264172, (1, 1000)),
    ("time", "hours", "minutes", lambda v: v * 60, (1, 48)),
    ("speed", "kilometres per hour", "miles per hour", lambda v: v * 0.621371, (5, 400)),
)
QUANTITY_SUBJECTS = {
    "temperature": ("Water boils at {q} at sea level.", "The oven should be set to {q}.", "The record high was {q}."),
    "distance": ("The two cities are {q} apart.", "The race is {q} long.", "The river is {q} long."),
    "mass": ("The statue weighs {q}.", "The load limit is {q}.", "The adult animal weighs about {q}."),
    "height": ("The mountain is {q} high.", "The tower is {q} tall.", "The waterfall drops {q}."),
    "volume": ("The tank holds {q}.", "The barrel contains {q}.", "The recipe needs {q} of water."),
    "time": ("The flight takes {q}.", "The battery lasts {q}.", "The film runs for {q}."),
    "speed": ("The train reaches {q}.", "The speed limit is {q}.", "The storm's winds reached {q}."),
}


def part_of(key: str) -> str:
    """The part (train 70% / dev 10% / test 20%) of a question or sentence, from a hash of its normalized text."""
    h = int(hashlib.sha256(key.strip().lower().encode("utf-8")).hexdigest()[:8], 16) % 100
    return "train" if h < 70 else "dev" if h < 80 else "test"


def clean(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\xa0", " ")).strip()


def normalize(text: str) -> str:
    """Lower case, no punctuation, no leading article or preposition: equal forms of one answer compare equal."""
    t = re.sub(r"[^\w\s]", " ", clean(text).lower())
    t = re.sub(r"^(?:the|a|an|in|on|at)\s+", "", re.sub(r"\s+", " ", t).strip())
    return t


# --------------------------------------------------------------------------------------------------------------------
# Answer values


@dataclass(frozen=True)
class Value:
    """A typed short answer: ``kind`` is year, date, month_year, number, quantity or entity."""

    kind: str
    text: str
    year: int = 0
    month: int = 0
    day: int = 0
    number: float = 0.0
    unit: str = ""


def parse_value(answer: str) -> Value:
    a = clean(answer)
    if m := _YEAR.match(a):
        return Value("year", a, year=int(m.group(1)))
    if m := _DAY_MONTH_YEAR.match(a):
        return Value("date", a, day=int(m.group(1)), month=_month(m.group(2)), year=int(m.group(3)))
    if m := _MONTH_DAY_YEAR.match(a):
        return Value("date", a, day=int(m.group(2)), month=_month(m.group(1)), year=int(m.group(3)))
    if m := _MONTH_YEAR.match(a):
        return Value("month_year", a, month=_month(m.group(1)), year=int(m.group(2)))
    if m := _NUMBER.match(a):
        return Value("number", a, number=float(m.group(1).replace(",", "")))
    if a.lower() in _WORD_VALUE:
        return Value("number", a, number=float(_WORD_VALUE[a.lower()]))
    if m := _QUANTITY.match(a):
        n = m.group(1).lower()
        return Value("quantity", a, number=float(_WORD_VALUE.get(n, 0) or n.replace(",", "")), unit=m.group(2))
    return Value("entity", a)


def _month(name: str) -> int:
    return [m.lower() for m in MONTHS].index(name.lower()) + 1


def fmt_number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() and abs(v) >= 10000 else (
        str(int(v)) if float(v).is_integer() else f"{v:g}")


def date_text(day: int, month: int, year: int, style: int) -> str:
    name = MONTHS[month - 1]
    return (f"{day} {name} {year}", f"{name} {day}, {year}", f"on {name} {day}, {year}")[style % 3]


def format_variants(v: Value, rng: random.Random) -> list[str]:
    """Other ways to write the same answer (meaning kept)."""
    if v.kind == "year":
        return [str(v.year), f"In {v.year}.", f"in {v.year}", f"It was in {v.year}.", f"The year {v.year}."]
    if v.kind == "date":
        return [date_text(v.day, v.month, v.year, s) for s in range(3)] + [
            f"It happened on {MONTHS[v.month - 1]} {v.day}, {v.year}."]
    if v.kind == "month_year":
        return [f"{MONTHS[v.month - 1]} {v.year}", f"In {MONTHS[v.month - 1]} {v.year}.",
                f"in {MONTHS[v.month - 1]} of {v.year}"]
    if v.kind == "number":
        n = v.number
        out = [fmt_number(n), f"{fmt_number(n)}."]
        if n.is_integer() and 0 <= n <= 20:
            out += [NUMBER_WORDS[int(n)], f"{NUMBER_WORDS[int(n)].capitalize()}."]
        if n.is_integer() and n >= 1000:
            out.append(f"{int(n):,}" if "," not in fmt_number(n) else str(int(n)))
        return out
    if v.kind == "quantity":
        n = v.number
        out = [f"{fmt_number(n)} {v.unit}", f"{fmt_number(n)} {v.unit}."]
        if n.is_integer() and 0 <= n <= 20:
            out.append(f"{NUMBER_WORDS[int(n)]} {v.unit}")
        return out
    a = v.text.rstrip(".")
    return [a, f"{a}.", f"It is {a}.", f"The answer is {a}.", f"I believe it's {a}.", a.lower()]


def swapped_values(v: Value, accepted: set[str], rng: random.Random, n: int = 2) -> list[str]:
    """Wrong answers of the same type: other years, dates, numbers; never one of the accepted answers."""
    out: list[str] = []
    for _ in range(12):
        if len(out) >= n:
            break
        if v.kind == "year":
            t = str(v.year + rng.choice([-1, 1]) * rng.choice([1, 1, 2, 2, 3, 4, 5, 7, 10, 12, 20, 25]))
        elif v.kind == "date":
            d, m, y = v.day, v.month, v.year
            which = rng.randrange(3)
            if which == 0:
                d = (d - 1 + rng.randint(1, 27)) % 28 + 1
            elif which == 1:
                m = (m - 1 + rng.randint(1, 11)) % 12 + 1
            else:
                y += rng.choice([-1, 1]) * rng.randint(1, 10)
            t = date_text(d, m, y, rng.randrange(3))
        elif v.kind == "month_year":
            m, y = v.month, v.year
            if rng.random() < 0.5:
                m = (m - 1 + rng.randint(1, 11)) % 12 + 1
            else:
                y += rng.choice([-1, 1]) * rng.randint(1, 10)
            t = f"{MONTHS[m - 1]} {y}"
        elif v.kind in ("number", "quantity"):
            x = v.number
            new = float(rng.choice([x + rng.randint(1, 5), max(0.0, x - rng.randint(1, 5)), x * 2, round(x * 1.5),
                                    x + 10 ** max(0, len(str(int(x))) - 1)]))
            if new == x:
                continue
            use_words = new.is_integer() and new <= 20 and rng.random() < 0.3
            num = NUMBER_WORDS[int(new)] if use_words else fmt_number(new)
            t = f"{num} {v.unit}" if v.kind == "quantity" else num
        else:
            return out
        if normalize(t) not in accepted and t not in out:
            out.append(t)
    return out


def general_forms(v: Value) -> list[str]:
    """Less specific but true forms of a date answer (implied by it, not implying it)."""
    if v.kind == "date":
        return [f"{MONTHS[v.month - 1]} {v.year}", str(v.year)]
    if v.kind == "month_year":
        return [str(v.year)]
    return []


# --------------------------------------------------------------------------------------------------------------------
# One-sentence answers


_WHO = re.compile(r"^who (wrote|sang|sings|plays|played|won|invented|discovered|directed|founded|created|painted|"
                  r"built|composed|designed|killed|wins|led|owns|started|signed|voiced|voices|produced|developed|"
                  r"is|was|were|are|became|has|had|did) (.+)$", re.I)
_WHEN = re.compile(r"^when (?:was|were) (.+?) (released|built|founded|invented|discovered|written|published|born|"
                   r"established|signed|formed|created|made|opened|completed|introduced|launched|elected|held|"
                   r"passed|established|declared|abolished|adopted|filmed|recorded|started|first used|"
                   r"first published)$", re.I)
_WHERE = re.compile(r"^where (?:is|was|are|were) (.+?) (located|filmed|held|born|found|built|buried|made|set|"
                    r"recorded|played|signed|founded)$", re.I)
_HOW_MANY = re.compile(r"^how many (.+?) (?:are|were|is|was) (?:there )?(?:in |on |of )?(.+)$", re.I)


def sentence_answer(question: str, answer: str) -> str | None:
    """A one-sentence answer to ``question`` with the value ``answer`` (a declarative form of frequent question
    shapes), or None when the question has no such shape."""
    q = clean(question).rstrip("?").strip()
    if m := _WHO.match(q):
        return f"{answer} {m.group(1).lower()} {m.group(2)}."
    if m := _WHEN.match(q):
        verb = "were" if m.group(1).lower().endswith("s") and not m.group(1).lower().endswith("ss") else "was"
        return f"{m.group(1)[0].upper()}{m.group(1)[1:]} {verb} {m.group(2)} in {answer}."
    if m := _WHERE.match(q):
        return f"{m.group(1)[0].upper()}{m.group(1)[1:]} is {m.group(2)} in {answer}."
    if m := _HOW_MANY.match(q):
        return f"There are {answer} {m.group(1)} in {m.group(2)}."
    return None


# --------------------------------------------------------------------------------------------------------------------
# Builders


@dataclass
class Rows:
    """Collects directed rows; ``both`` adds one evaluation pair in both directions."""

    part: str
    source: str
    out: list[dict[str, Any]]
    counter: int = 0

    def both(self, a: str, b: str, label_ab: str, label_ba: str, category: str, question: str = "") -> None:
        self.counter += 1
        pid = f"{self.source}:{self.part}:{self.counter}"
        for p, h, lab in ((a, b, label_ab), (b, a, label_ba)):
            self.out.append({"premise": p, "hypothesis": h, "label": lab, "source": self.source,
                             "category": category, "part": self.part, "question": question, "pair_id": pid})


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def qa_questions(data: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """The questions of ``qa/`` by part, each once (its first occurrence) with its accepted answers, in file order."""
    by_part: dict[str, list[tuple[str, list[str]]]] = {p: [] for p in PARTS}
    seen: set[str] = set()
    for name in QA_FILES:
        for r in read_jsonl(data / name):
            q = clean(r["question"])
            if normalize(q) in seen:
                continue
            seen.add(normalize(q))
            answers = [clean(a) for a in r["answer"] if clean(a)]
            if answers:
                by_part[part_of(q)].append((q, answers))
    return by_part


def qa_pairs(data: Path, seed: int, question_aware_share: float = 0.35) -> list[dict[str, Any]]:
    """Answer pairs of every question of ``qa/``: value swaps, distractors of the same type, format variants,
    aliases from the accepted list, more/less specific forms; short and one-sentence answers; a share of the
    training pairs (and every evaluation pair, as its own category suffix ``+question``) also in question-aware form."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    by_part = qa_questions(data)
    for part, items in by_part.items():
        pools = entity_pools(items)
        rec = Rows(part, "answers/qa", rows)
        for q, answers in items:
            _question_rows(rec, q, answers, pools, rng, question_aware_share if part == "train" else 1.0)
    return rows


def entity_pools(items: list[tuple[str, list[str]]]) -> dict[str, list[str]]:
    """Distractor pools of one part's ``(question, answers)``: the entity answers by question word ("who", ...)."""
    pools: dict[str, list[str]] = {}
    for q, answers in items:
        if parse_value(answers[0]).kind == "entity":
            pools.setdefault(q.split()[0].lower(), []).append(answers[0])
    return pools


def distractor(q: str, first: str, accepted: set[str], pools: dict[str, list[str]], rng: random.Random,
               tries: int = 4) -> str | None:
    """An entity answer of another question of the same question word that is not accepted for ``q`` and shares no
    word with its answer ``first`` (None when ``tries`` draws find none)."""
    pool = pools.get(q.split()[0].lower(), [])
    for _ in range(tries):
        if not pool:
            break
        d = rng.choice(pool)
        if normalize(d) not in accepted and not (set(normalize(d).split()) & set(normalize(first).split())):
            return d
    return None


def _question_rows(rec: Rows, q: str, answers: list[str], pools: dict[str, list[str]], rng: random.Random,
                   qa_share: float) -> None:
    accepted = {normalize(a) for a in answers}
    first = answers[0]
    v = parse_value(first)
    # a, b, label a->b, label b->a, category, and the bare values of a and b for the one-sentence form (or None)
    pairs: list[tuple[str, str, str, str, str, tuple[str, str] | None]] = []
    variants = format_variants(v, rng)
    if len(variants) >= 2:
        a, b = rng.sample(variants, 2)
        bare = [x for x in bare_variants(v) if x != first]
        pairs.append((a, b, "entailment", "entailment", "format_variant", (first, rng.choice(bare)) if bare else None))
    wrong = swapped_values(v, accepted, rng, n=2)
    cat = {"year": "year_swap", "date": "date_swap", "month_year": "date_swap", "number": "number_swap",
           "quantity": "quantity_swap"}.get(v.kind, "value_swap")
    for w in wrong:
        a = rng.choice(variants) if rng.random() < 0.5 else first
        wv = parse_value(w)
        b = rng.choice(format_variants(wv, rng)) if rng.random() < 0.5 and wv.kind == v.kind else w
        pairs.append((a, b, "contradiction", "contradiction", cat, (first, w)))
    if v.kind == "entity" and (d := distractor(q, first, accepted, pools, rng)) is not None:
        b = d if rng.random() < 0.5 else rng.choice(format_variants(parse_value(d), rng))
        pairs.append((rng.choice(variants), b, "contradiction", "contradiction", "entity_swap", (first, d)))
    for g in general_forms(v):
        pairs.append((first, g, "entailment", "neutral", "more_specific", (first, g)))
    for other in answers[1:]:  # the accepted list: equal forms, or one more specific than the other
        na, nb = normalize(first), normalize(other)
        numeric = re.search(r"\d", nb + na) or set((na + " " + nb).split()) & set(NUMBER_WORDS)
        if na == nb:
            pairs.append((first, other, "entailment", "entailment", "alias", (first, other)))
        elif set(nb.split()) < set(na.split()) and not numeric:
            pairs.append((first, other, "entailment", "neutral", "more_specific", (first, other)))
        elif set(na.split()) < set(nb.split()) and not numeric:
            pairs.append((other, first, "entailment", "neutral", "more_specific", (other, first)))
    for a, b, lab, lba, category, bare_ab in pairs:
        rec.both(a, b, lab, lba, category, q)
        if bare_ab is not None and max(len(bare_ab[0]), len(bare_ab[1])) < 60:
            sa, sb = sentence_answer(q, bare_ab[0]), sentence_answer(q, bare_ab[1])
            if sa and sb and sa != sb:
                rec.both(sa, sb, lab, lba, category + "+sentence", q)
        if rng.random() < qa_share:
            rec.both(with_question(q, a), with_question(q, b), lab, lba, category + "+question", q)


def bare_variants(v: Value) -> list[str]:
    """Other forms of an answer that fit inside a sentence (no sentence frame of their own)."""
    if v.kind == "date":
        return [date_text(v.day, v.month, v.year, s) for s in range(2)]
    if v.kind in ("number", "quantity") and v.number.is_integer() and 0 <= v.number <= 20:
        word = NUMBER_WORDS[int(v.number)]
        return [f"{word} {v.unit}".strip(), f"{int(v.number)} {v.unit}".strip()]
    if v.kind == "entity" and re.match(r"^the ", v.text, re.I):
        return [v.text[4:]]
    return []


_NUM_TOKEN = re.compile(r"\b(" + "|".join(NUMBER_WORDS[2:13]) + r"|\d{1,4})\b", re.I)
_NEGATABLE = re.compile(r"\b(is|are|was|were)\b(?! not\b)")


def sentence_pairs(rows: Iterable[dict[str, Any]], seed: int, per_kind: int = 4000) -> list[dict[str, Any]]:
    """Sentence-level pairs from licensed premises: a number changed (contradiction both ways), the same number
    written in words or digits (entailment both ways) and a negated copula (contradiction both ways)."""
    rng = random.Random(seed + 1)
    premises = sorted({clean(r["premise"]) for r in rows if r["source"].startswith(SENTENCE_SOURCES)})
    rng.shuffle(premises)
    out: list[dict[str, Any]] = []
    recs = {p: Rows(p, "answers/sentences", out) for p in PARTS}
    counts: dict[str, int] = {}
    for s in premises:
        if len(s) > 300:
            continue
        rec = recs[part_of(s)]
        nums = list(_NUM_TOKEN.finditer(s))
        if len(nums) == 1 and counts.get("num", 0) < per_kind:
            m = nums[0]
            tok = m.group(1)
            value = int(tok) if tok.isdigit() else _WORD_VALUE[tok.lower()]
            if 1000 <= value <= 2099:
                new = value + rng.choice([-1, 1]) * rng.randint(1, 12)
                new_tok = str(new)
            else:
                new = rng.choice([v for v in range(max(2, value - 4), value + 6) if v != value])
                new_tok = NUMBER_WORDS[new] if (not tok.isdigit() and new <= 20) else str(new)
                if tok[0].isupper():
                    new_tok = new_tok.capitalize()
            swapped = s[: m.start()] + new_tok + s[m.end():]
            rec.both(s, swapped, "contradiction", "contradiction", "sentence_number_swap")
            counts["num"] = counts.get("num", 0) + 1
            if value <= 12 and value >= 2:
                other = str(value) if not tok.isdigit() else NUMBER_WORDS[value]
                rec.both(s, s[: m.start()] + (other.capitalize() if tok[0].isupper() else other) + s[m.end():],
                         "entailment", "entailment", "sentence_format")
            continue
        negs = list(_NEGATABLE.finditer(s))
        if len(negs) == 1 and counts.get("neg", 0) < per_kind and rng.random() < 0.3:
            m = negs[0]
            rec.both(s, s[: m.end()] + " not" + s[m.end():], "contradiction", "contradiction", "negation")
            counts["neg"] = counts.get("neg", 0) + 1
    return out


def unit_pairs(seed: int, per_part: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Quantities in two units: the same quantity converted (entailment both ways), a wrong conversion and a changed
    value (contradiction both ways); as bare quantities and in sentences. Part by the template's value."""
    per_part = per_part or {"train": 1000, "dev": 150, "test": 300}
    rng = random.Random(seed + 2)
    out: list[dict[str, Any]] = []
    for part, n in per_part.items():
        rec = Rows(part, "answers/units", out)
        made = 0
        while made < n:
            name, ua, ub, conv, (lo, hi) = rng.choice(UNITS)
            v = rng.randint(lo, hi)
            if part_of(f"{name}:{v}") != part:
                continue
            made += 1
            w = conv(v)
            wt = f"{w:.0f}" if abs(w) >= 10 else f"{w:.1f}"
            frame = rng.choice(QUANTITY_SUBJECTS[name]) if rng.random() < 0.5 else "{q}"
            qa, qb = f"{v} {ua}", f"{wt} {ub}"
            a, b = frame.format(q=qa), frame.format(q=qb)
            rec.both(a, b, "entailment", "entailment", "unit_equivalent")
            bad = w * rng.choice([0.5, 0.7, 1.4, 2.0]) + rng.choice([-5, 5])
            bt = f"{bad:.0f}" if abs(bad) >= 10 else f"{bad:.1f}"
            if bt != wt:
                rec.both(a, frame.format(q=f"{bt} {ub}"), "contradiction", "contradiction", "unit_swap")
            v2 = v + rng.choice([-1, 1]) * max(1, int(abs(v) * rng.choice([0.1, 0.2, 0.5])))
            rec.both(a, frame.format(q=f"{v2} {ua}"), "contradiction", "contradiction", "quantity_swap")
    return out


# --------------------------------------------------------------------------------------------------------------------
# Dated events in full sentences ("The bridge was completed in 1932." / "... in 1934.")

# one-time events only (a second date contradicts the first): (past tense, question with {s})
THING_EVENTS = (
    ("was founded", "When was {s} founded?"), ("was built", "When was {s} built?"),
    ("was completed", "When was {s} completed?"), ("was demolished", "When was {s} demolished?"),
    ("was established", "When was {s} established?"), ("was abolished", "When was {s} abolished?"),
    ("was signed", "When was {s} signed?"), ("first opened", "When did {s} first open?"),
    ("fell", "When did {s} fall?"), ("collapsed", "When did {s} collapse?"),
    ("was dissolved", "When was {s} dissolved?"), ("was first published", "When was {s} first published?"),
)
PERSON_EVENTS = (
    ("was born", "When was {s} born?"), ("died", "When did {s} die?"),
    ("was first elected", "When was {s} first elected?"), ("retired", "When did {s} retire?"),
)
THING_NOUNS = ("bridge", "museum", "company", "treaty", "stadium", "railway", "university", "cathedral", "newspaper",
               "republic", "dam", "tower", "library", "airline", "bank", "empire", "wall", "canal", "hospital",
               "football club", "theatre", "factory", "monarchy", "league", "palace", "observatory", "orchestra",
               "parliament", "alliance", "mint")


def event_subjects(data: Path) -> tuple[list[str], list[str]]:
    """(people: answers to "who" questions that look like names; places: answers to "where" questions), from qa/."""
    people: set[str] = set()
    places: set[str] = set()
    for name in QA_FILES:
        for r in read_jsonl(data / name):
            first = clean(r["answer"][0])
            word = clean(r["question"]).split()[0].lower()
            if not re.fullmatch(r"[A-Z][a-z]+(?: [A-Z][a-z]+){1,2}", first):
                continue
            (people if word == "who" else places if word == "where" else set()).add(first)
    return sorted(people), sorted(places)


def event_sentence(subject: str, verb: str, when: str, style: int) -> str:
    """``subject`` ``verb`` ``when`` as one sentence, in one of three word orders (``style`` 0-2)."""
    cap = subject[0].upper() + subject[1:]
    return (f"{cap} {verb} {when}.", f"{when[0].upper()}{when[1:]}, {subject} {verb}.",
            f"It was {when} that {subject} {verb}.")[style]


def draw_event(rng: random.Random, people: list[str], places: list[str]) -> tuple[str, str, str]:
    """A random one-time event: (subject, past-tense verb, question with ``{s}``), a person's (30%) or a place's
    thing's."""
    if rng.random() < 0.3:
        subject, (verb, question) = rng.choice(people), rng.choice(PERSON_EVENTS)
    else:
        subject, (verb, question) = f"the {rng.choice(places)} {rng.choice(THING_NOUNS)}", rng.choice(THING_EVENTS)
    return subject, verb, question


def event_pairs(data: Path, seed: int, per_part: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """One-sentence statements of a dated one-time event: the year or date changed (contradiction both ways), the same
    date written another way (entailment both ways), a full date against its year or month (entailment one way,
    neutral back); bare and question-aware. Part by the event's subject and verb."""
    per_part = per_part or {"train": 1500, "dev": 150, "test": 300}
    people, places = event_subjects(data)
    rng = random.Random(seed + 7)
    out: list[dict[str, Any]] = []
    for part, n in per_part.items():
        rec = Rows(part, "answers/events", out)
        made = 0
        while made < n:
            s, verb, question = draw_event(rng, people, places)
            if part_of(f"event:{s}:{verb}") != part:
                continue
            made += 1
            q = question.format(s=s)
            year = rng.randint(1500, 2023)
            other = year + rng.choice([-1, 1]) * rng.choice([1, 1, 2, 2, 3, 4, 5, 8, 10, 15, 20, 30])
            day, month = rng.randint(1, 28), rng.randint(1, 12)
            say = functools.partial(event_sentence, s, verb)
            pairs = [
                (say(f"in {year}", 0), say(f"in {other}", rng.randrange(3)), "contradiction", "contradiction",
                 "event_year_swap"),
                (say(f"in {year}", 0), say(f"in {year}", rng.randrange(1, 3)) if rng.random() < 0.7
                 else say(f"in the year {year}", 0), "entailment", "entailment", "event_format"),
            ]
            date = date_text(day, month, year, rng.randrange(2))
            which = rng.randrange(3)
            d2, m2, y2 = ((day % 28) + rng.randint(1, 20), month, year) if which == 0 else (
                (day, (month % 12) + 1, year) if which == 1 else (day, month, other))
            changed = date_text(min(d2, 28), m2, y2, rng.randrange(2))
            pairs.append((say(f"on {date}", 0), say(f"on {changed}", rng.randrange(3)), "contradiction",
                          "contradiction", "event_date_swap"))
            general = f"in {year}" if rng.random() < 0.5 else f"in {MONTHS[month - 1]} {year}"
            pairs.append((say(f"on {date}", 0), say(general, rng.randrange(3)), "entailment", "neutral",
                          "event_more_specific"))
            for a, b, lab, lba, cat in pairs:
                rec.both(a, b, lab, lba, cat, q)
                if part != "train" or rng.random() < 0.35:
                    rec.both(with_question(q, a), with_question(q, b), lab, lba, cat + "+question", q)
    return out


# --------------------------------------------------------------------------------------------------------------------
# Answers that add a detail, numbers spelled out ("Fleming discovered it in 1928." / "Alexander Fleming.")

#: details an answer may add that the other answer does not state: {year}, {place} or a source
DETAILS = (" in {year}", " in {place}", ", according to {source}", " as of {year}", " by {year}")
#: the details of :data:`DETAILS` that name no year (for answers that are a year or a date)
UNDATED_DETAILS = tuple(d for d in DETAILS if "{year}" not in d)
SOURCES = ("most sources", "official records", "historians", "the census", "the records", "the encyclopaedia")


def number_in_words(n: int, british: bool = False) -> str:
    """``n`` (0 to 999,999) in English words: 168 is "one hundred sixty-eight" ("one hundred and sixty-eight" with
    ``british``)."""
    if n < 0 or n >= 1_000_000:
        raise ValueError(f"number_in_words takes 0 to 999,999; got {n}")
    if n < 20:
        return NUMBER_WORDS[n]
    if n < 100:
        tens = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")[n // 10 - 2]
        return tens + (f"-{NUMBER_WORDS[n % 10]}" if n % 10 else "")
    if n < 1000:
        rest = n % 100
        return f"{NUMBER_WORDS[n // 100]} hundred" + ("" if not rest else (" and " if british else " ")
                                                       + number_in_words(rest))
    rest = n % 1000
    return f"{number_in_words(n // 1000)} thousand" + ("" if not rest else (
        (" and " if british and rest < 100 else " ") + number_in_words(rest, british)))


def with_detail(sentence: str, rng: random.Random, places: list[str], dated: bool = False) -> str:
    """``sentence`` with one detail of :data:`DETAILS` added before its final full stop; ``dated`` (the answer is a
    year or a date): a detail without a year, since a second year reads as another answer to the question."""
    detail = rng.choice(UNDATED_DETAILS if dated else DETAILS).format(
        year=rng.randint(1700, 2023), place=rng.choice(places), source=rng.choice(SOURCES))
    return sentence[:-1] + detail + "."


def detail_pairs(data: Path, seed: int, per_part: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Agreeing answers of which one states more, and numbers written in words, per part (by question or event):

    - ``added_detail``: a one-sentence answer with a detail it does not need (a year, a place, a source) against the
      same answer without it, the bare answer, or the bare answer with the question: entailment from the detailed one,
      neutral back;
    - ``added_detail_swap``: the detailed answer against another value (another year, number or date; for a name or
      place, another question's answer of the same question word), bare, in its sentence and with the question:
      contradiction both ways (a detail does not excuse another value);
    - ``mixed_format``: the bare answer against its one-sentence form, with the question: entailment both ways;
    - ``spelled_number``: a number answer (bare or in its sentence) against the number in words: entailment both ways;
    - ``event_dropped_date``: a dated event against the same event without its date: entailment, neutral back.
    """
    per_part = per_part or {"train": 2000, "dev": 200, "test": 400}
    rng = random.Random(seed + 11)
    people, places = event_subjects(data)
    out: list[dict[str, Any]] = []
    by_part = qa_questions(data)
    for part, n in per_part.items():
        rec = Rows(part, "answers/detail", out)
        items = by_part[part][:]
        pools = entity_pools(items)
        rng.shuffle(items)
        made = 0
        for q, answers in items:
            if made >= n:
                break
            first = answers[0]
            v = parse_value(first)
            sentence = sentence_answer(q, first)
            if sentence is None or len(first) > 60:
                continue
            made += 1
            detailed = with_detail(sentence, rng, places, dated=v.kind in ("year", "date", "month_year"))
            rec.both(detailed, sentence, "entailment", "neutral", "added_detail", q)
            rec.both(detailed, first, "entailment", "neutral", "added_detail+bare", q)
            rec.both(with_question(q, detailed), with_question(q, first), "entailment", "neutral",
                     "added_detail+question", q)
            rec.both(with_question(q, first), with_question(q, sentence), "entailment", "entailment",
                     "mixed_format+question", q)
            accepted = {normalize(a) for a in answers}
            if v.kind == "entity":
                wrong = distractor(q, first, accepted, pools, rng)
            else:
                wrong = next(iter(swapped_values(v, accepted, rng, n=1)), None)
            if wrong is not None:
                rec.both(detailed, wrong, "contradiction", "contradiction", "added_detail_swap+bare", q)
                other = sentence_answer(q, wrong)
                if other and other != sentence:
                    rec.both(detailed, other, "contradiction", "contradiction", "added_detail_swap", q)
                    rec.both(with_question(q, detailed), with_question(q, other), "contradiction", "contradiction",
                             "added_detail_swap+question", q)
            if v.kind in ("number", "quantity") and v.number.is_integer() and 20 < v.number < 1_000_000:
                words = number_in_words(int(v.number), british=rng.random() < 0.5)
                spelled = first.replace(fmt_number(v.number), words) if fmt_number(v.number) in first else words
                rec.both(first, spelled, "entailment", "entailment", "spelled_number", q)
                if fmt_number(v.number) in sentence:
                    rec.both(sentence, sentence.replace(fmt_number(v.number), words), "entailment", "entailment",
                             "spelled_number+sentence", q)
        made = 0
        while made < n // 2:
            subject, verb, question = draw_event(rng, people, places)
            if part_of(f"event:{subject}:{verb}") != part:
                continue
            made += 1
            year = rng.randint(1500, 2023)
            when = f"in {year}" if rng.random() < 0.6 else f"on {date_text(rng.randint(1, 28), rng.randint(1, 12), year, 0)}"
            dated = event_sentence(subject, verb, when, rng.randrange(3))
            bare = f"{subject[0].upper()}{subject[1:]} {verb}."
            rec.both(dated, bare, "entailment", "neutral", "event_dropped_date", question.format(s=subject))
    return out


PLACES_FILE = Path(__file__).resolve().parent / "data" / "places.tsv"
CAPITAL_SENTENCES = ("The capital of {place} is {city}.", "{city} is the capital of {place}.",
                     "{Place}'s capital is {city}.")
LARGEST_SENTENCES = ("The largest city in {place} is {city}.", "{city} is the largest city in {place}.",
                     "{Place}'s largest city is {city}.")


@dataclass(frozen=True)
class Place:
    """One row of :data:`PLACES_FILE`: a country, U.S. state or U.K. nation, its capital, its largest city (``"-"``:
    the capital; ``"?"``: not asked) and other large cities."""

    name: str
    capital: str
    largest: str
    others: tuple[str, ...]


def read_places(path: Path = PLACES_FILE) -> list[Place]:
    """The places of ``path`` (tab-separated, ``#`` comments), in file order."""
    places = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, capital, largest, others = line.split("\t")
            places.append(Place(name, capital, largest, tuple(o for o in others.split(";") if o)))
    return places


#: a question about a place: (question, right answer, wrong answers, sentence templates)
PlaceQuestion = tuple[str, str, tuple[str, ...], tuple[str, ...]]


def place_questions(place: Place) -> list[PlaceQuestion]:
    """The questions of a place: its capital, and its largest city where the file names one (``"-"``: the capital is
    the largest), each with its right answer, the other cities as wrong answers and its sentence templates."""
    wrong = tuple(c for c in ((place.largest,) if place.largest not in "-?" else ()) + place.others)
    out: list[PlaceQuestion] = [(f"What is the capital of {place.name}?", place.capital, wrong, CAPITAL_SENTENCES)]
    if place.largest != "?":
        largest = place.capital if place.largest == "-" else place.largest
        wrong = tuple(c for c in (place.capital, *place.others) if c != largest)
        out.append((f"What is the largest city in {place.name}?", largest, wrong, LARGEST_SENTENCES))
    return out


def _say(template: str, place: Place, city: str) -> str:
    return template.format(place=place.name, Place=place.name[0].upper() + place.name[1:], city=city)


def place_pairs(seed: int, per_part: dict[str, int] | None = None, path: Path = PLACES_FILE) -> list[dict[str, Any]]:
    """Answers that name another city of the same place, the near miss a 6-layer model reads as agreeing ("Sydney"
    for the capital of Australia), per part by place (:func:`part_of` of its name), from :data:`PLACES_FILE`:

    - ``place_swap``: the right city against another city of the same place, contradiction both ways: bare, both in
      a sentence (``+sentence``), one bare and one in a sentence (``+bare``), with the question (``+question``);
    - ``place_format``: the right city in two sentences (``+sentence``) and bare against a sentence with the question
      (``+question``), entailment both ways, so that the swap rows do not teach that a sentence about a capital
      disagrees with its bare answer;
    - ``place_stated+bare``: the sentence against the bare city without the question: entailment, and neutral back
      (a city's name alone does not say that it is the capital), as for the other bare answers of :func:`detail_pairs`.

    ``per_part`` caps the pairs drawn per part (default: all of them)."""
    rng = random.Random(seed + 13)
    by_part: dict[str, list[dict[str, Any]]] = {p: [] for p in PARTS}
    recs = {p: Rows(p, "answers/places", by_part[p]) for p in PARTS}
    for place in read_places(path):
        rec = recs[part_of(f"place:{place.name}")]
        for question, right, wrong, templates in place_questions(place):
            t1, t2 = rng.sample(templates, 2)
            rec.both(_say(t1, place, right), right, "entailment", "neutral", "place_stated+bare", question)
            rec.both(_say(t1, place, right), _say(t2, place, right), "entailment", "entailment",
                     "place_format+sentence", question)
            rec.both(with_question(question, right), with_question(question, _say(t2, place, right)), "entailment",
                     "entailment", "place_format+question", question)
            for city in wrong:
                t1, t2 = rng.choice(templates), rng.choice(templates)
                rec.both(right, city, "contradiction", "contradiction", "place_swap", question)
                rec.both(_say(t1, place, right), _say(t2, place, city), "contradiction", "contradiction",
                         "place_swap+sentence", question)
                a, b = (right, _say(t2, place, city)) if rng.random() < 0.5 else (_say(t1, place, right), city)
                rec.both(a, b, "contradiction", "contradiction", "place_swap+bare", question)
                rec.both(with_question(question, right), with_question(question, city), "contradiction",
                         "contradiction", "place_swap+question", question)
    out: list[dict[str, Any]] = []
    for part, rows in by_part.items():
        cap = (per_part or {}).get(part)
        if cap is not None and 2 * cap < len(rows):
            keep = set(rng.sample(sorted({r["pair_id"] for r in rows}), cap))
            rows = [r for r in rows if r["pair_id"] in keep]
        out += rows
    return out


# --------------------------------------------------------------------------------------------------------------------
# Long premises


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if w not in _STOP and len(w) > 2}


def filler_pools(rows: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Unrelated sentences for long premises: mnli/dev_matched premises, split into a training and an evaluation
    pool by hash (``dev`` and ``test`` share the evaluation pool)."""
    pools: dict[str, list[str]] = {"train": [], "eval": []}
    for p in sorted({clean(r["premise"]) for r in rows if r["source"] == FILLER_SOURCE}):
        if 20 <= len(p) <= 400:
            pools["train" if part_of("filler:" + p) == "train" else "eval"].append(p)
    return pools


def long_document(evidence: str | None, hypothesis: str, pool: list[str], target_words: int, rng: random.Random,
                  depth: float | None = None) -> str:
    """``evidence`` placed at ``depth`` (0 start .. 1 end; random if None) among unrelated sentences from ``pool``
    until the document has about ``target_words`` words. Filler sharing two or more content words with the
    hypothesis or the evidence is skipped, so it neither supports nor contradicts the hypothesis."""
    avoid = _content_words(hypothesis) | (_content_words(evidence) if evidence else set())
    words = len(evidence.split()) if evidence else 0
    filler: list[str] = []
    while words < target_words:
        s = rng.choice(pool)
        if len(_content_words(s) & avoid) >= 2:
            continue
        filler.append(s)
        words += len(s.split())
    if evidence is None:
        return " ".join(filler)
    at = round((rng.random() if depth is None else depth) * len(filler))
    return " ".join(filler[:at] + [evidence] + filler[at:])


# generated one-sentence pairs that also serve as (document sentence, statement) evidence in long premises
LONG_STATEMENT_CATEGORIES = ("event_year_swap", "event_date_swap", "event_format", "event_more_specific",
                             "sentence_number_swap", "sentence_format", "negation")


def long_premise_train(rows: list[dict[str, Any]], pools: dict[str, list[str]], seed: int, n: int,
                       max_words: int = 330, statements: list[dict[str, Any]] | None = None,
                       statement_share: float = 0.25) -> list[dict[str, Any]]:
    """Training rows with long premises: a licensed training pair's premise (or, for ``statement_share`` of the rows,
    the premise of a generated one-sentence pair from ``statements``) among unrelated sentences (label kept), and the
    same document without the premise (neutral)."""
    rng = random.Random(seed + 3)
    cands = [r for r in rows if r["source"].startswith(SENTENCE_SOURCES) and len(r["premise"]) < 400]
    n_statements = min(round(n * statement_share), len(statements or []))
    picked = rng.sample(cands, n - n_statements)
    if n_statements:
        picked += rng.sample(statements or [], n_statements)
        rng.shuffle(picked)
    out: list[dict[str, Any]] = []
    for r in picked:
        target = rng.randint(30, max_words)
        with_ev = rng.random() < 0.7
        doc = long_document(clean(r["premise"]) if with_ev else None, r["hypothesis"], pools["train"], target, rng)
        out.append({"premise": doc, "hypothesis": r["hypothesis"], "label": r["label"] if with_ev else "neutral",
                    "source": "long/" + ("kept" if with_ev else "removed"), "category": "long", "part": "train",
                    "question": "", "pair_id": ""})
    return out


def window_train_rows(rows: list[dict[str, Any]], pools: dict[str, list[str]], seed: int, n: int,
                      max_words: int = 130) -> list[dict[str, Any]]:
    """``n`` training rows in pairs at the length of a document window (10 to ``max_words`` words of unrelated
    sentences): an SNLI entailment pair's premise among them (entailment) and the same text without it (neutral).

    SNLI's entailed hypotheses are generic ("People are outside."), and a model trained on captions reads them as
    entailed by unrelated text: the shipped model did so for 2.5-4% of unrelated 20-110-word windows (at most 0.3%
    for the other labels' hypotheses), which over the ~30 windows of a 2,500-token document adds up to about one
    statement in ten "supported" by a document that says nothing about it. The pairs are meant to teach that the
    evidence, not the hypothesis, makes the entailment; drawn at random they are mostly pairs the model already
    reads right (6,000 of them changed nothing in a short stage): ``tools/default_model/hard_windows.py`` keeps the
    windows a model misreads."""
    rng = random.Random(seed + 7)
    out: list[dict[str, Any]] = []
    for r in rng.sample(window_evidence(rows), n // 2):
        target = rng.randint(10, max_words)
        for with_ev in (True, False):
            doc = long_document(clean(r["premise"]) if with_ev else None, r["hypothesis"], pools["train"], target, rng)
            out.append(window_row(doc, r["hypothesis"], "entailment" if with_ev else "neutral",
                                  "kept" if with_ev else "removed"))
    return out


def window_evidence(rows: list[dict[str, Any]], *labels: str) -> list[dict[str, Any]]:
    """The pairs whose premise is the evidence of window rows: SNLI training pairs of ``labels`` (default
    entailment), premise under 400 characters, in input order."""
    wanted = labels or ("entailment",)
    return [r for r in rows if r["source"] == "snli/train" and r["label"] in wanted and len(r["premise"]) < 400]


def window_row(premise: str, hypothesis: str, label: str, kind: str) -> dict[str, Any]:
    """One training row of category ``window`` (source ``window/<kind>``)."""
    return {"premise": premise, "hypothesis": hypothesis, "label": label, "source": "window/" + kind,
            "category": "window", "part": "train", "question": "", "pair_id": ""}


def long_premise_eval(dev_rows: list[dict[str, Any]], pools: dict[str, list[str]], seed: int,
                      words: tuple[int, ...] = (0, 40, 120, 240, 330), per_length: int = 300) -> list[dict[str, Any]]:
    """The long-premise evaluation: snli/dev pairs (dev/test part by premise) with the premise alone (0 words) and
    among unrelated sentences at each length in words (up to the 512-token window: 330 words of filler plus the
    pair), evidence at a random depth; and the same documents without the evidence (gold: neutral)."""
    rng = random.Random(seed + 4)
    out: list[dict[str, Any]] = []
    for part in ("dev", "test"):
        cands = [r for r in dev_rows if r["source"] == LONG_EVAL_SOURCE and part_of(r["premise"]) == part]
        for r in random.Random(seed + 5).sample(cands, min(per_length, len(cands))):
            for n in words:
                doc = long_document(clean(r["premise"]), r["hypothesis"], pools["eval"], n, rng) if n else r["premise"]
                out.append({"premise": doc, "hypothesis": r["hypothesis"], "label": r["label"], "source": "long/eval",
                            "category": f"long_kept@{n}", "part": part, "question": "", "pair_id": ""})
                if n:
                    nodoc = long_document(None, r["hypothesis"], pools["eval"], n, rng)
                    out.append({"premise": nodoc, "hypothesis": r["hypothesis"], "label": "neutral",
                                "source": "long/eval", "category": f"long_removed@{n}", "part": part, "question": "",
                                "pair_id": ""})
    return out


# --------------------------------------------------------------------------------------------------------------------
# Entry points


def licensed_rows(data: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the licensed training rows: train.jsonl without lingnli + mnli/dev_matched, all of dev.jsonl)."""
    train = [r for r in read_jsonl(data / "train.jsonl") if not r["source"].startswith("lingnli")]
    dev = read_jsonl(data / "dev.jsonl")
    return train + [r for r in dev if r["source"] == FILLER_SOURCE], dev


def cap_per_category(rows: list[dict[str, Any]], cap: int, seed: int) -> list[dict[str, Any]]:
    """At most ``cap`` rows of each category (whole pairs: both directions stay together), in input order."""
    by_cat: dict[str, list[str]] = {}
    for r in rows:
        ids = by_cat.setdefault(r["category"], [])
        if not ids or ids[-1] != r["pair_id"]:
            ids.append(r["pair_id"])
    rng = random.Random(seed + 6)
    keep = {pid for ids in by_cat.values() for pid in (ids if 2 * len(ids) <= cap else rng.sample(ids, cap // 2))}
    return [r for r in rows if r["pair_id"] in keep]


def build(data: Path, seed: int = 0, long_train: int = 9000, train_cap: int = 2000, event_train: int = 1500,
          long_statement_share: float = 0.25, window_train: int = 0, detail_train: int = 0, place_train: int = 0
          ) -> dict[str, list[dict[str, Any]]]:
    """All generated rows by use: ``train`` (the training mixture's additions: at most ``train_cap`` rows per answer
    category, ``event_train`` dated events, plus ``long_train`` long-premise rows, ``long_statement_share`` of them
    around generated one-sentence pairs, ``window_train`` window-length rows of :func:`window_train_rows`, the
    answers of ``detail_train`` questions of :func:`detail_pairs` and ``place_train`` pairs of :func:`place_pairs`),
    ``dev`` and ``test`` (evaluation, uncapped; the place pairs always)."""
    licensed, dev_rows = licensed_rows(data)
    events = event_pairs(data, seed, {"train": event_train, "dev": 150, "test": 300})
    answer_rows = qa_pairs(data, seed) + sentence_pairs(licensed, seed) + unit_pairs(seed) + events
    places = place_pairs(seed, {"train": place_train})
    pools = filler_pools(licensed)
    out: dict[str, list[dict[str, Any]]] = {p: [r for r in answer_rows if r["part"] == p] for p in PARTS}
    out["train"] = cap_per_category(out["train"], train_cap, seed)
    statements = [r for r in out["train"] if r["category"] in LONG_STATEMENT_CATEGORIES]
    out["train"] += long_premise_train(licensed, pools, seed, long_train, statements=statements,
                                       statement_share=long_statement_share)
    if window_train:
        out["train"] += window_train_rows(licensed, pools, seed, window_train)
    if detail_train:
        out["train"] += detail_pairs(data, seed, {"train": detail_train})
    for r in places:
        out[r["part"]].append(r)
    for r in long_premise_eval(dev_rows, pools, seed):
        out[r["part"]].append(r)
    return out


def iter_summary(rows: list[dict[str, Any]]) -> Iterator[str]:
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        counts[(r["category"], r["label"])] = counts.get((r["category"], r["label"]), 0) + 1
    for (cat, lab), n in sorted(counts.items()):
        yield f"{cat:32s} {lab:14s} {n:6d}"


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "nli-data")
    p.add_argument("--out", type=Path, required=True, help="directory for train.jsonl, dev.jsonl, test.jsonl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--long-train", type=int, default=9000, help="long-premise training rows")
    p.add_argument("--train-cap", type=int, default=2000, help="training rows per answer category at most")
    p.add_argument("--event-train", type=int, default=1500, help="dated events of the train part (4 pairs each)")
    p.add_argument("--long-statement-share", type=float, default=0.25,
                   help="share of the long-premise rows built around generated one-sentence pairs")
    p.add_argument("--window-train", type=int, default=0,
                   help="window-length rows: an SNLI entailment premise among unrelated sentences and the text without "
                   "it (default 0)")
    p.add_argument("--detail-train", type=int, default=0,
                   help="questions of answers that add a detail and numbers in words (detail_pairs; default 0)")
    p.add_argument("--place-train", type=int, default=0,
                   help="pairs of another city of the same place (place_pairs; default 0); dev and test always have "
                   "them")
    p.add_argument("--summary", action="store_true", help="log rows per category and label")
    args = p.parse_args(argv)
    parts = build(args.data, args.seed, args.long_train, args.train_cap, args.event_train, args.long_statement_share,
                  args.window_train, args.detail_train, args.place_train)
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"arguments": build_arguments(args), "sha256": {}}
    for name, rows in parts.items():
        path = args.out / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        record["sha256"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        if args.summary:
            import sys

            sys.stderr.write(f"== {name}: {len(rows)} rows\n" + "\n".join(iter_summary(rows)) + "\n")
    (args.out / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


#: Written beside the rows: the arguments that rebuild them (the data folder aside) and each file's sha256.
BUILD_RECORD = "build.json"


def build_arguments(args: Any) -> list[str]:
    """The command-line arguments that rebuild these rows (every recipe option, always spelled out)."""
    return ["--seed", str(args.seed), "--long-train", str(args.long_train), "--train-cap", str(args.train_cap),
            "--event-train", str(args.event_train), "--long-statement-share", f"{args.long_statement_share:g}",
            *(["--window-train", str(args.window_train)] if getattr(args, "window_train", 0) else []),
            *(["--detail-train", str(args.detail_train)] if getattr(args, "detail_train", 0) else []),
            *(["--place-train", str(args.place_train)] if getattr(args, "place_train", 0) else [])]


def rows_record(train_file: str | Path, sha256: str) -> dict[str, Any] | None:
    """The :data:`BUILD_RECORD` beside the training rows ``train_file`` (whose recorded hash is ``sha256``): the tool
    and arguments that rebuild them; None when there is none or it records other bytes."""
    record_path = Path(train_file).with_name(BUILD_RECORD)
    if not record_path.is_file():
        return None
    record: dict[str, Any] = json.loads(record_path.read_text(encoding="utf-8"))
    if record["sha256"].get(Path(train_file).name) != sha256:
        return None
    return record


def command_for(arguments: list[str], out: str) -> str:
    """The command that builds the rows of ``arguments`` (:func:`build_arguments`) into ``out``."""
    return " ".join(["python -m tools.default_model.answer_data --out", out, *arguments])


def rows_command(train_file: str | Path, sha256: str, out: str) -> str | None:
    """The command that rebuilds the training rows ``train_file`` (whose recorded hash is ``sha256``) into ``out``
    (:func:`rows_record`); None when their build record is missing or records other bytes."""
    record = rows_record(train_file, sha256)
    return None if record is None else command_for(record["arguments"], out)


if __name__ == "__main__":
    raise SystemExit(main())
