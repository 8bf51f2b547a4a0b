"""The default model's answer-consistency data and its mission-shaped evaluation (tools/default_model)."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_DATA
from hypothesis import given
from hypothesis import strategies as st

from tools.default_model import answer_data as ad
from tools.default_model.mission_eval import auroc, evaluate


def test_parse_value_kinds() -> None:
    assert ad.parse_value("1989").kind == "year" and ad.parse_value("in 1989").year == 1989
    d = ad.parse_value("14 December 1972 UTC")
    assert (d.kind, d.day, d.month, d.year) == ("date", 14, 12, 1972)
    assert ad.parse_value("May 22, 2018").kind == "date" and ad.parse_value("December 1972").kind == "month_year"
    assert ad.parse_value("24").number == 24 and ad.parse_value("three").number == 3
    q = ad.parse_value("24 episodes")
    assert (q.kind, q.number, q.unit) == ("quantity", 24, "episodes")
    assert ad.parse_value("Canberra").kind == "entity"


@given(st.integers(1000, 2099), st.integers(0, 10**6))
def test_swapped_years_differ_and_variants_keep_the_year(year: int, seed: int) -> None:
    v = ad.parse_value(str(year))
    rng = random.Random(seed)
    for w in ad.swapped_values(v, {str(year)}, rng):
        assert ad.parse_value(w).year != year
    for text in ad.format_variants(v, rng):
        assert str(year) in text


@given(st.integers(0, 5000), st.integers(0, 10**6))
def test_swapped_numbers_are_never_an_accepted_answer(n: int, seed: int) -> None:
    v = ad.parse_value(str(n))
    accepted = {ad.normalize(str(n)), ad.normalize(str(n + 1))}
    for w in ad.swapped_values(v, accepted, random.Random(seed), n=3):
        assert ad.normalize(w) not in accepted


def test_sentence_answers() -> None:
    assert ad.sentence_answer("who wrote the song hallelujah", "Leonard Cohen") == \
        "Leonard Cohen wrote the song hallelujah."
    assert ad.sentence_answer("when was the eiffel tower built?", "1889") == "The eiffel tower was built in 1889."
    assert ad.sentence_answer("why is the sky blue", "scattering") is None


def test_long_document_places_the_evidence_and_avoids_related_filler() -> None:
    pool = ["The committee met on Tuesday.", "Prices rose sharply last year.", "A dog runs in the park.",
            "Tourists visit the old harbour.", "The report was published in spring."]
    rng = random.Random(0)
    doc = ad.long_document("A man plays a guitar.", "A dog runs outside.", pool, 60, rng, depth=0.0)
    assert doc.startswith("A man plays a guitar.") and len(doc.split()) >= 60
    assert "A dog runs in the park." not in doc  # shares two content words with the hypothesis
    nodoc = ad.long_document(None, "Tourists visit a harbour.", pool, 40, rng)
    assert "Tourists visit the old harbour." not in nodoc and len(nodoc.split()) >= 40


def test_cap_per_category_keeps_whole_pairs() -> None:
    rows: list[dict] = []
    rec = ad.Rows("train", "t", rows)
    for i in range(10):
        rec.both(f"a{i}", f"b{i}", "contradiction", "contradiction", "x")
    kept = ad.cap_per_category(rows, 6, 0)
    assert len(kept) == 6 and all(sum(r["pair_id"] == k["pair_id"] for r in kept) == 2 for k in kept)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_build_parts_are_disjoint_and_pairs_have_both_directions(tmp_path: Path) -> None:
    parts = ad.build(SHARED_DATA, seed=0, long_train=200)
    # dated events fall into a part by their subject and verb, places by their name (test_place_pairs_...)
    questions = {p: {r["question"] for r in rows if r["question"] and r["source"] not in ("answers/events",
                                                                                         "answers/places")}
                 for p, rows in parts.items()}
    assert not (questions["train"] & questions["dev"]) and not (questions["train"] & questions["test"])
    assert not (questions["dev"] & questions["test"])
    assert all(ad.part_of(q) == p for p, qs in questions.items() for q in qs)
    for part in ("dev", "test"):
        by_pair = defaultdict(list)
        for r in parts[part]:
            if r["pair_id"]:
                by_pair[r["pair_id"]].append(r)
        for rows in by_pair.values():
            a, b = rows
            assert (a["premise"], a["hypothesis"]) == (b["hypothesis"], b["premise"])
            if a["category"].split("+")[0] in ad.VALUE_SWAPS:
                assert a["label"] == b["label"] == "contradiction"
            if a["category"].split("+")[0] in ad.MEANING_KEPT:
                assert a["label"] == b["label"] == "entailment"
        long_rows = [r for r in parts[part] if r["category"].startswith("long_")]
        assert {r["category"] for r in long_rows} >= {"long_kept@0", "long_kept@330", "long_removed@330"}
        for r in long_rows:
            assert r["label"] == "neutral" or r["category"].startswith("long_kept")
    train_long = [r for r in parts["train"] if r["source"].startswith("long/")]
    assert len(train_long) == 200 and {r["source"] for r in train_long} == {"long/kept", "long/removed"}
    assert not any(r["source"].startswith("lingnli") for r in parts["train"])


def test_auroc_equals_the_pairwise_count() -> None:
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 5, 40).astype(float), rng.integers(0, 5, 30).astype(float)
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert auroc(pos, neg) == pytest.approx(brute, abs=1e-12)


def test_evaluate_reads_each_category_by_its_rule() -> None:
    rows: list[dict] = []
    rec = ad.Rows("test", "t", rows)
    rec.both("1989", "1991", "contradiction", "contradiction", "year_swap")  # flagged one way only: counts
    rec.both("1989", "In 1989.", "entailment", "entailment", "format_variant")  # entailed one way only: fails
    rec.both("May 1989", "1989", "entailment", "neutral", "more_specific")
    probs = np.array([[0.6, 0.2, 0.2], [0.1, 0.1, 0.8],   # year swap a->b contradiction, b->a entailment
                      [0.0, 0.1, 0.9], [0.1, 0.6, 0.3],   # format a->b entailment, b->a neutral
                      [0.0, 0.1, 0.9], [0.1, 0.8, 0.1]])  # specific -> general entailment, back neutral: right
    res = evaluate(rows, probs)
    assert res["categories"]["year_swap"]["value"] == 1.0
    assert res["categories"]["year_swap"]["both_ways"] == 0.0  # ... but not both ways, which NCP's mean needs
    assert (res["groups"]["bare"]["value_swaps"], res["groups"]["bare"]["value_swaps_both_ways"]) == (1.0, 0.0)
    assert "both_ways" not in res["categories"]["format_variant"]
    assert res["categories"]["format_variant"]["value"] == 0.0
    assert res["categories"]["more_specific"]["value"] == 1.0
    # pair scores: swap 1 - (0.6 + 0.1) / 2 = 0.65; agreeing pairs 0.95 and 0.95: AUROC 1
    assert res["groups"]["bare"]["agreement_auroc"] == 1.0


def test_evaluate_reads_place_swaps_apart_from_the_value_swaps() -> None:
    """Another city of the same place is its own group: it moves neither the value swaps nor their AUROC."""
    rows: list[dict] = []
    rec = ad.Rows("test", "t", rows)
    rec.both("1989", "1991", "contradiction", "contradiction", "year_swap")
    rec.both("1989", "In 1989.", "entailment", "entailment", "format_variant")
    rec.both("Oslo", "Bergen", "contradiction", "contradiction", "place_swap")
    rec.both("Norway's capital is Oslo.", "Oslo", "entailment", "neutral", "place_stated+bare")
    c, n, e = [0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.0, 0.1, 0.9]
    probs = np.array([c, c, e, e, c, e, e, n])  # the city swap flagged one way only
    res = evaluate(rows, probs)
    bare = res["groups"]["bare"]
    assert (bare["value_swaps"], bare["value_swaps_both_ways"], bare["agreement_auroc"]) == (1.0, 1.0, 1.0)
    assert (bare["place_swaps"], bare["place_swaps_both_ways"]) == (1.0, 0.0)
    assert res["groups"]["+bare"] == {"place_one_way": 1.0}
    assert res["categories"]["place_stated+bare"]["metric"] == "directed_accuracy"


def test_evaluate_reports_each_gold_label_kept_in_long_premises() -> None:
    """Long premises: accuracy, each gold label's share predicted so, and false entailment without the evidence."""
    def row(label: str, category: str) -> dict:
        return {"premise": "a b c", "hypothesis": "d", "label": label, "category": category, "pair_id": ""}

    rows = [row("entailment", "long_kept@120"), row("entailment", "long_kept@120"),
            row("contradiction", "long_kept@120"), row("neutral", "long_kept@120"), row("neutral", "long_kept@120"),
            row("neutral", "long_removed@120"), row("neutral", "long_removed@120")]
    e, n, c = [0.0, 0.1, 0.9], [0.1, 0.8, 0.1], [0.8, 0.1, 0.1]
    probs = np.array([e, n, c, e, n, e, n])
    long = evaluate(rows, probs)["long"]["120"]
    assert (long["accuracy"], long["entailment_kept"], long["contradiction_kept"], long["neutral_kept"],
            long["false_entailment"]) == (0.6, 0.5, 1.0, 0.5, 0.5)


YEAR_IN = re.compile(r"\b(\d{4})\b")


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def both_directions(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows of each pair (``pair_id``), its two directions in file order."""
    by_pair: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_pair[r["pair_id"]].append(r)
    return list(by_pair.values())


def assert_one_part_per_question(rows: list[dict[str, Any]]) -> None:
    parts_of_question = defaultdict(set)
    for r in rows:
        parts_of_question[r["question"]].add(r["part"])
    assert all(len(p) == 1 for p in parts_of_question.values())


def test_event_pairs_change_the_date_only_where_they_should() -> None:
    rows = ad.event_pairs(SHARED_DATA, 0, {"train": 40, "dev": 10, "test": 20})
    seen = set()
    for a, b in both_directions(rows):
        cat = a["category"].split("+")[0]
        seen.add(a["category"])
        ya, yb = set(YEAR_IN.findall(a["premise"])), set(YEAR_IN.findall(a["hypothesis"]))
        if cat == "event_year_swap":
            assert ya and yb and ya != yb and a["label"] == b["label"] == "contradiction"
        elif cat == "event_format":
            assert ya == yb and a["premise"] != a["hypothesis"] and a["label"] == b["label"] == "entailment"
        elif cat == "event_more_specific":  # a full date -> its year or month: entailed one way only
            assert ya == yb and (a["label"], b["label"]) == ("entailment", "neutral")
        else:
            assert cat == "event_date_swap" and a["premise"] != a["hypothesis"] and a["label"] == "contradiction"
    assert {"event_year_swap", "event_date_swap", "event_format", "event_more_specific",
            "event_year_swap+question"} <= seen
    assert_one_part_per_question(rows)  # one event (subject and verb) lies in one part only


@pytest.mark.parametrize(("n", "plain", "british"), [
    (0, "zero", "zero"), (21, "twenty-one", "twenty-one"), (100, "one hundred", "one hundred"),
    (168, "one hundred sixty-eight", "one hundred and sixty-eight"), (206, "two hundred six", "two hundred and six"),
    (1005, "one thousand five", "one thousand and five"),
    (12345, "twelve thousand three hundred forty-five", "twelve thousand three hundred and forty-five"),
    (999999, "nine hundred ninety-nine thousand nine hundred ninety-nine",
     "nine hundred ninety-nine thousand nine hundred and ninety-nine"),
])
def test_number_in_words(n: int, plain: str, british: bool) -> None:
    assert ad.number_in_words(n) == plain and ad.number_in_words(n, british=True) == british


def test_number_in_words_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match=re.escape("number_in_words takes 0 to 999,999; got 1000000")):
        ad.number_in_words(1_000_000)


def test_a_dated_answer_gets_a_detail_without_a_year() -> None:
    rng = random.Random(0)
    details = [ad.with_detail("The wall fell in 1989.", rng, ["Berlin"], dated=True) for _ in range(60)]
    assert all(re.findall(r"\d{4}", d) == ["1989"] for d in details)
    assert {d.removeprefix("The wall fell in 1989")[:5] for d in details} == {" in B", ", acc"}  # places and sources
    undated = {ad.with_detail("The wall fell.", rng, ["Berlin"]) for _ in range(60)}
    assert any(re.search(r"\d{4}", d) for d in undated)  # other answers may get a year


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_detail_pairs_label_the_detailed_answer_as_implying_the_plain_one() -> None:
    rows = ad.detail_pairs(SHARED_DATA, 0, {"train": 60, "dev": 10, "test": 20})
    seen = set()
    for a, b in both_directions(rows):
        seen.add(a["category"])
        assert a["premise"] == b["hypothesis"] and a["hypothesis"] == b["premise"] and a["part"] == b["part"]
        cat = a["category"].split("+")[0]
        if cat in ("added_detail", "event_dropped_date"):  # the longer text states all the shorter one does
            assert (a["label"], b["label"]) == ("entailment", "neutral")
            if a["category"] == "added_detail":  # the same sentence, a detail added before its full stop
                assert a["premise"].startswith(a["hypothesis"][:-1]) and a["hypothesis"].endswith(".")
            assert len(a["premise"]) > len(a["hypothesis"])
        elif cat == "added_detail_swap":
            assert a["label"] == b["label"] == "contradiction"
        else:
            assert cat in ("mixed_format", "spelled_number") and a["label"] == b["label"] == "entailment"
    assert {"added_detail", "added_detail+bare", "added_detail+question", "added_detail_swap",
            "added_detail_swap+bare", "added_detail_swap+question", "mixed_format+question", "event_dropped_date"} <= seen
    assert_one_part_per_question(rows)  # one question (or event) lies in one part only
    assert {r["part"] for r in rows} == {"train", "dev", "test"}


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_detail_rows_join_the_train_part_only_when_asked() -> None:
    plain = ad.build(SHARED_DATA, long_train=0, train_cap=50, event_train=20)
    more = ad.build(SHARED_DATA, long_train=0, train_cap=50, event_train=20, detail_train=30)
    assert more["dev"] == plain["dev"] and more["test"] == plain["test"]  # the evaluation does not move
    assert more["train"][: len(plain["train"])] == plain["train"]
    added = more["train"][len(plain["train"]):]
    assert added and {r["source"] for r in added} == {"answers/detail"} and {r["part"] for r in added} == {"train"}


def place_asked(question: str) -> str:
    """The place a place row's question asks about ("What is the capital of Norway?" -> "Norway")."""
    return re.sub(r"^What is the (capital of|largest city in) (.+)\?$", r"\2", question)


def test_place_pairs_swap_cities_of_one_place_and_keep_the_right_one_in_other_words() -> None:
    places = {p.name: p for p in ad.read_places()}
    rows = ad.place_pairs(0)
    pairs = both_directions(rows)
    assert {len(p) for p in pairs} == {2} and all(r["source"] == "answers/places" for r in rows)
    assert_one_part_per_question(rows)
    assert {r["part"] for r in rows} == set(ad.PARTS)
    named = {r["part"] for r in rows if r["question"].endswith(("of Norway?", "in Norway?"))}
    assert named == {ad.part_of("place:Norway")}  # a place's questions share its part: they share its cities
    for a, b in pairs:
        base = a["category"].split("+")[0]
        assert a["category"] == b["category"]
        assert (a["label"], b["label"]) == {"place_swap": ("contradiction", "contradiction"),
                                            "place_format": ("entailment", "entailment"),
                                            "place_stated": ("entailment", "neutral")}[base]
        place = places[place_asked(a["question"])]
        capital = a["question"].startswith("What is the capital")
        right = place.capital if capital or place.largest == "-" else place.largest
        named = [c for c in (place.capital, place.largest, *place.others) if c not in "-?" and c in a["premise"]]
        if a["category"] == "place_swap":  # bare: the right city against another of the same place
            assert right in (a["premise"], a["hypothesis"]) and a["premise"] != a["hypothesis"]
        if base in ("place_format", "place_stated"):
            assert right in a["premise"] and right in a["hypothesis"] and a["premise"] != a["hypothesis"]
        if base == "place_stated":  # the sentence first: it states what the bare name only answers
            assert a["hypothesis"] == right and a["premise"].endswith(".")
        assert named, a
    # no place of the written-answer sets: they measure what the place rows teach on places no row names
    written = " ".join((Path(ad.__file__).parent / "data" / name).read_text(encoding="utf-8")
                       for name in ("written_answers.jsonl", "written_answers_heldout.jsonl"))
    for question in {r["question"] for r in rows}:
        place = place_asked(question)
        assert f"capital of {place}?" not in written and f"largest city in {place}?" not in written
    assert "the capital of Australia?" in written  # the check above reads the sets it should
    capped = ad.place_pairs(0, {"train": 5})
    assert len({r["pair_id"] for r in capped if r["part"] == "train"}) == 5
    assert [r for r in capped if r["part"] != "train"] == [r for r in rows if r["part"] != "train"]


def test_a_place_without_a_known_largest_city_is_asked_only_for_its_capital() -> None:
    asked = ad.place_questions(ad.Place("Ruritania", "Strelsau", "?", ("Zenda",)))
    assert asked == [("What is the capital of Ruritania?", "Strelsau", ("Zenda",), ad.CAPITAL_SENTENCES)]
    asked = ad.place_questions(ad.Place("Ruritania", "Strelsau", "Zenda", ("Hentzau",)))
    assert [(q, r, w) for q, r, w, _ in asked] == [
        ("What is the capital of Ruritania?", "Strelsau", ("Zenda", "Hentzau")),
        ("What is the largest city in Ruritania?", "Zenda", ("Strelsau", "Hentzau"))]


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_place_rows_join_the_train_part_only_when_asked() -> None:
    plain = ad.build(SHARED_DATA, long_train=0, train_cap=50, event_train=20)
    more = ad.build(SHARED_DATA, long_train=0, train_cap=50, event_train=20, place_train=30)
    assert more["dev"] == plain["dev"] and more["test"] == plain["test"]  # the evaluation does not move
    assert {r["source"] for r in plain["test"]} >= {"answers/places"}  # ... and always measures the places
    assert more["train"][: len(plain["train"])] == plain["train"]
    added = more["train"][len(plain["train"]):]
    assert len(added) == 60 and {r["source"] for r in added} == {"answers/places"}


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_the_build_record_rebuilds_the_same_rows(tmp_path: Path) -> None:
    args = ["--long-train", "50", "--event-train", "10", "--long-statement-share", "0.5", "--window-train", "20",
            "--place-train", "30"]
    assert ad.main(["--data", str(SHARED_DATA), "--out", str(tmp_path / "a"), *args]) == 0
    record = json.loads((tmp_path / "a" / ad.BUILD_RECORD).read_text())
    sha = record["sha256"]["train.jsonl"]
    command = ad.rows_command(tmp_path / "a" / "train.jsonl", sha, str(tmp_path / "b"))
    assert command is not None and command.startswith("python -m tools.default_model.answer_data --out ")
    rebuilt = command.split(" --out ", 1)[1].split()
    assert ad.main(["--data", str(SHARED_DATA), "--out", *rebuilt]) == 0
    assert (tmp_path / "b" / "train.jsonl").read_bytes() == (tmp_path / "a" / "train.jsonl").read_bytes()
    assert ad.rows_command(tmp_path / "a" / "train.jsonl", "0" * 64, "x") is None  # other bytes: no command
    # ship records the build record in the training record, so a card rendered after the rows are gone still has them
    from tools.default_model import ship

    training = {"data": {"extra_train": {"files": {str(tmp_path / "a" / "train.jsonl"): sha}}},
                "base_training": {"data": {"extra_train": {"files": {"/gone/train.jsonl": sha}}}}}
    ship.record_rows_builds(training)
    assert training["data"]["extra_train"]["build_record"] == record
    assert "build_record" not in training["base_training"]["data"]["extra_train"]
    (tmp_path / "a" / ad.BUILD_RECORD).unlink()
    assert ship.stage_rows_record(training["data"]["extra_train"]) == record
    assert ad.command_for(record["arguments"], str(tmp_path / "b")) == command
    long_rows = [r for r in ad.read_jsonl(tmp_path / "a" / "train.jsonl") if r["category"] == "long"]
    assert len(long_rows) == 50


def test_window_rows_pair_the_evidence_with_its_removal() -> None:
    """Window rows come in pairs over one hypothesis: the SNLI entailment premise among unrelated sentences
    (entailment), then a document of unrelated sentences alone (neutral), each at most a window long."""
    rows = [{"source": "snli/train", "label": "entailment", "premise": f"A man number {i} plays a guitar.",
             "hypothesis": f"A person {i} plays music."} for i in range(30)]
    rows.append({"source": "snli/train", "label": "neutral", "premise": "A dog.", "hypothesis": "A cat."})
    pools = {"train": ["The committee met on Tuesday.", "Prices rose sharply last year.",
                       "Tourists visit the old harbour.", "The report was published in spring."], "eval": []}
    got = ad.window_train_rows(rows, pools, seed=0, n=20)
    assert len(got) == 20 and got == ad.window_train_rows(rows, pools, seed=0, n=20)
    for kept, removed in zip(got[::2], got[1::2]):
        assert kept["hypothesis"] == removed["hypothesis"] and kept["label"] == "entailment"
        assert removed["label"] == "neutral" and (kept["source"], removed["source"]) == ("window/kept",
                                                                                       "window/removed")
        evidence = next(r["premise"] for r in rows if r["hypothesis"] == kept["hypothesis"])
        assert evidence in kept["premise"] and evidence not in removed["premise"]
        assert all(len(r["premise"].split()) <= 130 + 12 for r in (kept, removed))  # one filler sentence past 130


WINDOW_POOLS = {"train": ["The committee met on Tuesday.", "Prices rose sharply last year.",
                          "Tourists visit the old harbour.", "The report was published in spring."], "eval": []}


def _long_window_scorer(seen: list[tuple[str, str]]) -> Any:
    """A stand-in model for hard_rows: P(the label) 0.9 for windows over 60 words, else 0.1; records every pair."""
    def score(pairs: Any) -> np.ndarray:
        seen.extend(pairs)
        return np.array([0.9 if len(p.split()) > 60 else 0.1 for p, _ in pairs])
    return score


def test_hard_windows_keep_what_the_model_misreads_beside_the_evidence() -> None:
    """Only windows scored above 0.5 become (neutral) hard rows, each after a kept row (the pair's premise among
    unrelated sentences: entailment) of the same hypothesis; the draw depends on the seed alone."""
    from tools.default_model.hard_windows import hard_rows

    rows = [{"source": "snli/train", "label": "entailment", "premise": f"A man number {i} plays a guitar.",
             "hypothesis": f"Someone {i} is outside."} for i in range(12)]
    rows.append({"source": "snli/train", "label": "neutral", "premise": "A dog.", "hypothesis": "A cat."})
    pools = WINDOW_POOLS
    seen: list[tuple[str, str]] = []
    score = _long_window_scorer(seen)  # "entailed" when the window is long

    got, counts = hard_rows(rows, pools, score, seed=3, per_pair=2)
    assert counts["pairs"] == 12 and counts["windows"] == len(seen) == 24
    long_windows = [p for p, _ in seen if len(p.split()) > 60]
    assert counts["hard"] == len(long_windows) == len(got) // 2 > 0
    assert [r["premise"] for r in got[1::2]] == long_windows
    for kept, hard in zip(got[::2], got[1::2]):
        assert (kept["label"], kept["source"], hard["label"], hard["source"]) == (
            "entailment", "window/kept", "neutral", "window/hard")
        evidence = next(r["premise"] for r in rows if r["hypothesis"] == kept["hypothesis"] == hard["hypothesis"])
        assert evidence in kept["premise"] and evidence not in hard["premise"]
    assert hard_rows(rows, pools, score, seed=3, per_pair=2)[0] == got
    assert hard_rows(rows, pools, score, seed=4, per_pair=2)[0] != got


def test_hard_contradiction_windows_draw_contradiction_pairs_and_keep_them_contradicting() -> None:
    """``--kind contradiction``: only SNLI contradiction pairs are drawn; a window scored above 0.5 P(contradiction)
    becomes a neutral row beside the pair's own premise among unrelated sentences, labelled contradiction."""
    from tools.default_model.hard_windows import hard_rows

    rows = [{"source": "snli/train", "label": label, "premise": f"A man number {i} plays a guitar.",
             "hypothesis": f"Someone {i} is {'asleep' if label == 'contradiction' else 'outside'}."}
            for i in range(8) for label in ("entailment", "contradiction")]
    pools = WINDOW_POOLS
    seen: list[tuple[str, str]] = []
    score = _long_window_scorer(seen)  # "contradicting" when the window is long

    got, counts = hard_rows(rows, pools, score, seed=3, per_pair=2, label="contradiction")
    assert counts["pairs"] == 8 and {h for _, h in seen} == {r["hypothesis"] for r in rows
                                                               if r["label"] == "contradiction"}
    assert counts["hard"] == len(got) // 2 > 0
    for kept, hard in zip(got[::2], got[1::2]):
        assert (kept["label"], kept["source"], hard["label"], hard["source"]) == (
            "contradiction", "window/kept", "neutral", "window/hard")
        evidence = next(r["premise"] for r in rows if r["hypothesis"] == kept["hypothesis"])
        assert evidence in kept["premise"] and evidence not in hard["premise"]


def test_hard_contradiction_windows_of_any_label_keep_each_premise_with_its_own_label() -> None:
    """``--kind contradiction --any-label``: the hypotheses of SNLI pairs of every label are drawn; a window read
    above 0.5 P(contradiction) is a neutral row beside the pair's premise in a window, labelled as the pair is."""
    from tools.default_model.hard_windows import hard_rows

    labels = ("entailment", "neutral", "contradiction")
    rows = [{"source": "snli/train", "label": label, "premise": f"A man number {i} plays a guitar.",
             "hypothesis": f"Someone {i} is {label}."} for i in range(6) for label in labels]
    seen: list[tuple[str, str]] = []
    got, counts = hard_rows(rows, WINDOW_POOLS, _long_window_scorer(seen), seed=3, per_pair=3,
                            label="contradiction", any_label=True)
    assert counts["pairs"] == 18 and {h for _, h in seen} == {r["hypothesis"] for r in rows}
    assert {kept["label"] for kept in got[::2]} == set(labels)
    for kept, hard in zip(got[::2], got[1::2]):
        pair = next(r for r in rows if r["hypothesis"] == kept["hypothesis"])
        assert (kept["label"], kept["source"], hard["label"], hard["source"]) == (
            pair["label"], "window/kept", "neutral", "window/hard")
        assert pair["premise"] in kept["premise"] and pair["premise"] not in hard["premise"]
    assert hard_rows(rows, WINDOW_POOLS, _long_window_scorer([]), seed=3, per_pair=3, label="contradiction")[1][
        "pairs"] == 6


def test_hard_windows_refuse_any_label_for_kinds_that_draw_no_such_windows(capsys: pytest.CaptureFixture[str],
                                                                           tmp_path: Path) -> None:
    from tools.default_model import hard_windows

    with pytest.raises(SystemExit) as e:
        hard_windows.main(["--out", str(tmp_path), "--kind", "faint", "--any-label"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: --any-label draws pairs of every label for --kind windows / contradiction / evidence, not --kind "
        "faint (its rows are contradictions read under the bar): drop it\n")
    assert not any(tmp_path.iterdir())


def test_hard_windows_score_in_logged_chunks_with_the_rows_of_one_call(caplog: pytest.LogCaptureFixture) -> None:
    from tools.default_model.hard_windows import logged

    calls: list[int] = []

    def score(pairs: Any) -> np.ndarray:
        calls.append(len(pairs))
        return np.array([[len(p), len(h)] for p, h in pairs], dtype=np.float32)

    pairs = [(f"premise {i}" * (i % 3 + 1), f"h{i}") for i in range(10)]
    with caplog.at_level("INFO", logger="fastnli.tools"):
        got = logged(score, chunk=4)(pairs)
    assert calls == [4, 4, 2]
    assert np.array_equal(got, score(pairs))  # the rows one call over every pair gives, in order
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "scored 4 / 10 pairs", "scored 8 / 10 pairs", "scored 10 / 10 pairs"]
    assert logged(score, chunk=4)([]).shape[0] == 0


AWAITED = "The sibling waits at the door."


def test_hard_evidence_keeps_pairs_right_alone_and_wrong_in_a_document() -> None:
    """``--kind evidence``: a licensed entailment/contradiction pair the model labels right alone and wrong inside its
    long document becomes a row with the pair's label (the document holds the premise), then the same length of
    unrelated text without it (neutral); a pair wrong alone, or right in its document, adds nothing."""
    from tools.default_model.hard_windows import EVIDENCE_MAX_WORDS, hard_evidence_rows

    labels = ("contradiction", "neutral", "entailment")
    rows = [{"source": "snli/train", "label": ("entailment", "contradiction")[i % 2],
             "premise": f"A man number {i} plays a guitar.", "hypothesis": f"Someone {i} plays music."}
            for i in range(20)]
    rows += [{"source": "snli/train", "label": "neutral", "premise": "A dog.", "hypothesis": "A cat."},
             {"source": "lingnli/train", "label": "entailment", "premise": "A dog.", "hypothesis": "An animal."}]
    # other hypotheses of some premises: a neutral one of every third (and a second, not taken), a contradiction of
    # pair 4 (an entailment pair), another entailment of pair 4 (its own label: not a sibling), one of another source
    rows += [{"source": "snli/train", "label": "neutral", "premise": f"A man number {i} plays a guitar.",
              "hypothesis": f"Sibling {i} {k} waits."} for i in range(0, 20, 3) for k in range(2)]
    rows += [{"source": "snli/train", "label": label, "premise": "A man number 4 plays a guitar.",
              "hypothesis": f"Sibling 4 {label} waits."} for label in ("contradiction", "entailment")]
    rows += [{"source": "wanli/train", "label": "neutral", "premise": "A man number 6 plays a guitar.",
              "hypothesis": "Sibling 6 wanli waits."}]
    # filler that bears on the siblings ("sibling", "waits"): never in a document that has siblings
    pools = {"train": [f"The committee met on day {i} of the session." for i in range(30)] + [AWAITED] * 30,
             "eval": []}
    seen: list[tuple[str, str]] = []

    gold_of = {r["hypothesis"]: labels.index(r["label"]) for r in rows}

    def predict(pairs: Any) -> np.ndarray:
        """Gold alone except pair 3 (wrong alone); neutral in a document over 150 words."""
        seen.extend(pairs)
        out = []
        for p, h in pairs:
            gold = gold_of[h]
            wrong = (h.startswith("Someone 3 ") and len(p.split()) < 10) or len(p.split()) > 150
            out.append(np.eye(3)[1 if wrong else gold])
        return np.array(out)

    got, counts = hard_evidence_rows(rows, pools, predict, seed=5, pairs=50, labels=labels)
    # the licensed entailment/contradiction pairs: the 20, and the two of pair 4's premise
    assert counts["pairs"] == 22 and counts["right_alone"] == 21 and len(seen) == 44
    docs = {h: p for p, h in seen[22:]}
    lost = sorted(h for h, p in docs.items() if len(p.split()) > 150 and not h.startswith("Someone 3 "))
    hard = [r for r in got if r["source"] == "long/hard"]
    assert counts["hard"] == len(lost) == len(hard) > 0
    assert sorted(r["hypothesis"] for r in hard) == lost
    for kept in hard:
        pair = next(r for r in rows if r["hypothesis"] == kept["hypothesis"])
        removed = got[got.index(kept) + 1]
        assert (kept["label"], removed["source"], removed["label"]) == (pair["label"], "long/removed", "neutral")
        assert kept["premise"] == docs[kept["hypothesis"]] and pair["premise"] in kept["premise"]
        assert removed["hypothesis"] == kept["hypothesis"] and pair["premise"] not in removed["premise"]
        assert 150 - 12 < len(removed["premise"].split()) <= EVIDENCE_MAX_WORDS + 12
        # the same document against the premise's other hypotheses of the source, one per other label
        siblings = [r for r in got if r["source"] == "long/sibling" and r["premise"] == kept["premise"]]
        expected: dict[str, str] = {}  # label -> the first hypothesis of that label
        for r in rows:
            if r["source"] == pair["source"] and r["premise"] == pair["premise"] and r["label"] != pair["label"]:
                expected.setdefault(r["label"], r["hypothesis"])
        assert sorted((r["label"], r["hypothesis"]) for r in siblings) == sorted(expected.items())
        if siblings:  # the filler avoided the siblings' content words too
            assert AWAITED not in kept["premise"]
    assert counts["siblings"] == sum(r["source"] == "long/sibling" for r in got) > 0
    assert any(AWAITED in p for p, h in seen[22:] if h.startswith("Someone 1 "))  # it is filler elsewhere
    assert hard_evidence_rows(rows, pools, predict, seed=5, pairs=50, labels=labels)[0] == got
    assert hard_evidence_rows(rows, pools, predict, seed=5, pairs=4, labels=labels)[1]["pairs"] == 4


def test_hard_evidence_of_any_label_mines_neutral_pairs_read_otherwise_in_a_document() -> None:
    """``--kind evidence --any-label``: licensed neutral pairs are placed too; one the model labels neutral alone and
    contradiction inside its document becomes a neutral ``long/hard`` row, with its siblings; the counts split the
    hard rows by label."""
    from tools.default_model.hard_windows import hard_evidence_rows

    labels = ("contradiction", "neutral", "entailment")
    rows = [{"source": "snli/train", "label": ("entailment", "contradiction", "neutral")[i % 3],
             "premise": f"A woman number {i} rides a bike.", "hypothesis": f"Someone {i} is out."} for i in range(30)]
    rows += [{"source": "snli/train", "label": "entailment", "premise": "A woman number 2 rides a bike.",
              "hypothesis": "Sibling 2 waits."}]
    pools = {"train": [f"The committee met on day {i} of the session." for i in range(40)], "eval": []}
    gold_of = {r["hypothesis"]: labels.index(r["label"]) for r in rows}

    def predict(pairs: Any) -> np.ndarray:
        """Gold alone; contradiction in a document over 100 words."""
        return np.array([np.eye(3)[0 if len(p.split()) > 100 else gold_of[h]] for p, h in pairs])

    got, counts = hard_evidence_rows(rows, pools, predict, seed=7, pairs=100, labels=labels, any_label=True)
    assert counts["pairs"] == 31 and counts["right_alone"] == 31
    hard = [r for r in got if r["source"] == "long/hard"]
    assert counts["hard"] == len(hard) and counts["hard_by_label"] == {
        label: sum(r["label"] == label for r in hard) for label in labels}
    assert counts["hard_by_label"]["contradiction"] == 0 < counts["hard_by_label"]["neutral"]
    assert counts["hard_by_label"]["entailment"] > 0
    for kept in (r for r in hard if r["label"] == "neutral"):
        pair = next(r for r in rows if r["hypothesis"] == kept["hypothesis"])
        assert pair["label"] == "neutral" and pair["premise"] in kept["premise"] and len(kept["premise"].split()) > 100
    sibling = [r for r in got if r["source"] == "long/sibling"]
    # pair 2 (neutral) is lost in its document (the seed draws it over 100 words) beside its entailed sibling
    assert any(r["hypothesis"] == "Someone 2 is out." for r in hard)
    assert ("Sibling 2 waits.", "entailment") in [(r["hypothesis"], r["label"]) for r in sibling]
    without = hard_evidence_rows(rows, pools, predict, seed=7, pairs=100, labels=labels)
    assert without[1]["pairs"] == 21 and "hard_by_label" not in without[1]
    assert all(r["label"] != "neutral" for r in without[0] if r["source"] == "long/hard")


def test_faint_windows_keep_contradictions_read_under_the_bar_beside_their_removed_and_siblings() -> None:
    """``--kind faint``: an SNLI training contradiction the model labels contradiction alone and reads at or under
    the bar in its window becomes a contradiction row (the window holds the premise), then the same length of
    unrelated text without it (neutral), then the window against the premise's other hypotheses (their labels); a
    pair wrong alone, or above the bar in its window, adds nothing."""
    from tools.default_model.hard_windows import MAX_WORDS, MIN_WORDS, hard_faint_rows

    labels = ("contradiction", "neutral", "entailment")
    rows = [{"source": "snli/train", "label": "contradiction", "premise": f"A man number {i} plays a guitar.",
             "hypothesis": f"Someone {i} sleeps."} for i in range(20)]
    rows += [{"source": "snli/train", "label": label, "premise": f"A man number {i} plays a guitar.",
              "hypothesis": f"Sibling {i} {label} waits."} for i in range(0, 20, 4) for label in ("neutral",
                                                                                                "entailment")]
    rows += [{"source": "lingnli/train", "label": "contradiction", "premise": "A dog.", "hypothesis": "A cat."}]
    pools = {"train": [f"The committee met on day {i} of the session." for i in range(30)] + [AWAITED] * 30,
             "eval": []}
    gold_of = {r["hypothesis"]: labels.index(r["label"]) for r in rows}
    seen: list[tuple[str, str]] = []

    def predict(pairs: Any) -> np.ndarray:
        """Pair 3 reads neutral alone; a window reads P(contradiction) 0.9 when its hypothesis number is even, 0.99
        when odd."""
        seen.extend(pairs)
        out = []
        for p, h in pairs:
            if len(p.split()) < 10:
                out.append(np.eye(3)[1 if h.startswith("Someone 3 ") else gold_of[h]])
            else:
                pc = 0.9 if int(h.split()[1]) % 2 == 0 else 0.99
                out.append(np.array([pc, 1 - pc, 0.0]))
        return np.array(out)

    got, counts = hard_faint_rows(rows, pools, predict, seed=5, pairs=50, labels=labels, bar=0.95)
    assert counts["pairs"] == 20 and counts["right_alone"] == 19 and len(seen) == 40
    windows = {h: p for p, h in seen[20:]}
    faint = [r for r in got if r["source"] == "window/faint"]
    assert counts["faint"] == len(faint) == 10  # the even pairs
    assert sorted(r["hypothesis"] for r in faint) == sorted(f"Someone {i} sleeps." for i in range(0, 20, 2))
    for kept in faint:
        pair = next(r for r in rows if r["hypothesis"] == kept["hypothesis"])
        removed = got[got.index(kept) + 1]
        assert (kept["label"], removed["source"], removed["label"]) == ("contradiction", "window/removed", "neutral")
        assert kept["premise"] == windows[kept["hypothesis"]] and pair["premise"] in kept["premise"]
        assert MIN_WORDS <= len(kept["premise"].split()) <= MAX_WORDS + 12
        assert removed["hypothesis"] == kept["hypothesis"] and pair["premise"] not in removed["premise"]
        siblings = [r for r in got if r["source"] == "window/sibling" and r["premise"] == kept["premise"]]
        number = int(kept["hypothesis"].split()[1])
        expected = [("entailment", f"Sibling {number} entailment waits."),
                    ("neutral", f"Sibling {number} neutral waits.")] if number % 4 == 0 else []
        assert sorted((r["label"], r["hypothesis"]) for r in siblings) == expected
        if siblings:
            assert AWAITED not in kept["premise"]
    assert counts["siblings"] == sum(r["source"] == "window/sibling" for r in got) == 10
    assert counts["window_p_contradiction_median"] == pytest.approx(0.9)
    assert hard_faint_rows(rows, pools, predict, seed=5, pairs=50, labels=labels, bar=0.95)[0] == got
    assert hard_faint_rows(rows, pools, predict, seed=5, pairs=50, labels=labels, bar=0.995)[1]["faint"] == 19
    more, _ = hard_faint_rows(rows, pools, predict, seed=5, pairs=50, labels=labels, bar=0.95, removed=3)
    assert [r for r in more if r["source"] != "window/removed"] == [r for r in got if r["source"] != "window/removed"]
    assert sum(r["source"] == "window/removed" for r in more) == 3 * counts["faint"]
    assert all(r["label"] == "neutral" and "plays a guitar" not in r["premise"] for r in more
               if r["source"] == "window/removed")


def test_hard_window_rows_follow_an_answer_data_folder_byte_for_byte(tmp_path: Path) -> None:
    """``--after``: the written file is the folder's rows, unchanged, then the hard rows, and its build record carries
    the folder's record; a folder whose rows differ from its record is refused by name."""
    from tools.default_model.hard_windows import TOOL, preceding_rows, write_rows

    answers = tmp_path / "answers"
    answers.mkdir()
    plain = '{"premise": "Zürich", "hypothesis": "a"}\n'.encode()
    (answers / "train.jsonl").write_bytes(plain)
    plain_record = {"arguments": ["--seed", "0"], "sha256": {"train.jsonl": hashlib.sha256(plain).hexdigest()}}
    (answers / ad.BUILD_RECORD).write_text(json.dumps(plain_record))
    hard = [{"premise": "Städte", "hypothesis": "b", "label": "neutral"}]
    path = write_rows(tmp_path / "out", hard, {"tool": TOOL, "arguments": ["--seed", "17"]}, preceding_rows(answers))
    data = path.read_bytes()
    assert data.startswith(plain) and [json.loads(x) for x in data[len(plain):].splitlines()] == hard
    record = json.loads((tmp_path / "out" / ad.BUILD_RECORD).read_text())
    assert record["after"] == plain_record and record["arguments"] == ["--seed", "17"]
    assert ad.rows_record(path, hashlib.sha256(data).hexdigest()) == record
    alone = write_rows(tmp_path / "alone", hard, {"tool": TOOL, "arguments": []})
    assert alone.read_bytes() == data[len(plain):]
    assert "after" not in json.loads((tmp_path / "alone" / ad.BUILD_RECORD).read_text())
    (answers / "train.jsonl").write_bytes(plain + plain)
    with pytest.raises(ValueError, match=r"--after .*answers: no build.json there records its train.jsonl as it is "
                                         r"now; build the folder with tools.default_model.answer_data"):
        preceding_rows(answers)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_faint_windows_command_scores_with_the_model_and_its_own_bar(tmp_path: Path) -> None:
    """``hard_windows --kind faint`` end to end with the embedded model: its manifest's contradiction bar decides,
    and the build record names the kind, its arguments and the counts of the rows written."""
    from tools.default_model import hard_windows

    out = tmp_path / "faint"
    assert hard_windows.main(["--data", str(SHARED_DATA), "--out", str(out), "--kind", "faint", "--pairs", "60",
                              "--seed", "3"]) == 0
    record = json.loads((out / "build.json").read_text(encoding="utf-8"))
    assert (record["tool"], record["kind"]) == (hard_windows.TOOL, "faint")
    assert record["arguments"] == ["--kind", "faint", "--pairs", "60", "--seed", "3"]
    counts = record["counts"]
    assert counts["pairs"] == 60 and counts["bar"] == 0.95 and 0 < counts["faint"] < counts["right_alone"] <= 60
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    by_source = {s: [r for r in rows if r["source"] == s] for s in ("window/faint", "window/removed", "window/sibling")}
    assert len(rows) == sum(len(v) for v in by_source.values()) == 2 * counts["faint"] + counts["siblings"]
    assert len(by_source["window/faint"]) == len(by_source["window/removed"]) == counts["faint"]
    assert {r["label"] for r in by_source["window/faint"]} <= {"contradiction"}
    assert {r["label"] for r in by_source["window/removed"]} <= {"neutral"}
