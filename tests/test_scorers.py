"""NCP and siblings: hand-computed formulas on a controlled engine, one engine pass, order invariance, bad input."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from fastnli.cli.score import read_score_input
from fastnli.engine import CallStats, NLIEngine
from fastnli.scorers import score


class TableEngine:
    """An engine whose probabilities the test sets: table[(premise, hypothesis)] -> (c, n, e)."""

    device, precision = "cpu", "fp32"

    def __init__(self, table: dict[tuple[str, str], tuple[float, float, float]]) -> None:
        self.table = table
        self.calls: list[list[tuple[str, str]]] = []

    def predict_with_stats(self, pairs: list[tuple[str, str]], progress: object = None
                           ) -> tuple[np.ndarray, CallStats]:
        self.calls.append(list(pairs))
        probs = np.array([self.table.get(p, (0.2, 0.6, 0.2)) for p in pairs], dtype=np.float32).reshape(-1, 3)
        return probs, CallStats(pairs_in=len(pairs), unique_pairs=len(set(pairs)))


TABLE = {
    ("Paris", "Lyon"): (0.9, 0.05, 0.05), ("Lyon", "Paris"): (0.7, 0.2, 0.1),
    ("Paris", "Paris, France"): (0.1, 0.2, 0.7), ("Paris, France", "Paris"): (0.0, 0.3, 0.7),
    ("Lyon", "Paris, France"): (0.8, 0.1, 0.1), ("Paris, France", "Lyon"): (0.6, 0.3, 0.1),
}


def test_ncp_and_entailment_match_hand_computation() -> None:
    eng = TableEngine(TABLE)
    res = score(["Paris"], [["Paris", "Lyon", "Paris, France", "Lyon"]], scorers=("noncontradiction", "entailment"),
                engine=eng)  # type: ignore[arg-type]
    nc = [1.0, 1 - (0.9 + 0.7) / 2, 1 - (0.1 + 0.0) / 2, 1 - (0.9 + 0.7) / 2]  # m = 4, duplicates counted
    en = [1.0, (0.05 + 0.1) / 2, (0.7 + 0.7) / 2, (0.05 + 0.1) / 2]
    assert res[0].noncontradiction == pytest.approx(np.mean(nc), abs=1e-6)
    assert res[0].entailment == pytest.approx(np.mean(en), abs=1e-6)
    assert res[0].semantic_negentropy is None and res[0].num_samples == 4
    # NCP only needs the response's pairs, both directions, each distinct sample once.
    assert sorted(eng.calls[0]) == sorted([("Paris", "Lyon"), ("Lyon", "Paris"), ("Paris", "Paris, France"),
                                           ("Paris, France", "Paris")])


def test_semantic_scores_match_hand_computation() -> None:
    eng = TableEngine(TABLE)
    res = score(["Paris"], [["Paris", "Lyon", "Paris, France", "Lyon"]],
                scorers=("semantic_negentropy", "semantic_sets_confidence"), engine=eng)  # type: ignore[arg-type]
    # texts: Paris, Paris, Lyon, Paris France, Lyon. Clusters: {Paris, Paris, Paris France} (entailment argmax),
    # {Lyon, Lyon} -> probabilities 3/5, 2/5.
    h = -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))
    assert res[0].semantic_negentropy == pytest.approx(1 - h / math.log(5), abs=1e-9)
    assert res[0].semantic_sets_confidence == pytest.approx((5 - 2) / 4)
    assert res[0].num_semantic_sets == 2
    assert len(eng.calls) == 1 and len(eng.calls[0]) == 6  # all directed pairs of the 3 distinct texts


def test_use_best_swaps_to_cluster_lead() -> None:
    eng = TableEngine(TABLE)
    res = score(["Lyon"], [["Paris", "Paris", "Paris, France", "Lyon"]],
                scorers=("noncontradiction", "semantic_negentropy"), engine=eng, use_best=True)  # type: ignore[arg-type]
    assert res[0].best_response == "Paris"  # the mode of the most probable cluster
    # NCP of "Paris" against [Lyon, Paris, Paris France, Lyon] (the best's first occurrence removed)
    nc = [1 - (0.9 + 0.7) / 2, 1.0, 1 - 0.05, 1 - (0.9 + 0.7) / 2]
    assert res[0].noncontradiction == pytest.approx(np.mean(nc), abs=1e-6)


def test_one_engine_pass_for_all_prompts_and_scorers() -> None:
    eng = TableEngine(TABLE)
    res = score(["Paris", "Lyon", "Paris"], [["Lyon"], ["Paris", "Paris, France"], ["Paris, France", "Lyon"]],
                scorers=("noncontradiction", "entailment", "semantic_negentropy", "semantic_sets_confidence"),
                engine=eng, return_matrix=True)  # type: ignore[arg-type]
    assert len(eng.calls) == 1 and len(res) == 3
    m = res[2].matrix
    assert m is not None and m.shape == (3, 3, 3) and res[2].matrix_texts == ["Paris", "Paris, France", "Lyon"]
    assert np.allclose(m[0, 2], TABLE[("Paris", "Lyon")]) and np.allclose(m[1, 1], (0, 0, 1))


def test_rows_follow_input_order_whatever_the_order(art_v1: Path) -> None:
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    rng = np.random.default_rng(0)
    words = ["Paris", "Lyon", "1848", "the red planet", "Mars", "", "William Shakespeare", "In 1989."]
    responses = [str(rng.choice(words)) for _ in range(12)]
    samples = [[str(rng.choice(words)) for _ in range(4)] for _ in range(12)]
    scorers = ("noncontradiction", "entailment", "semantic_negentropy", "semantic_sets_confidence")
    base = score(responses, samples, scorers=scorers, engine=engine)
    perm = rng.permutation(12)
    shuffled = score([responses[i] for i in perm], [samples[i] for i in perm], scorers=scorers, engine=engine)
    for k, i in enumerate(perm):
        for s in scorers:
            assert getattr(shuffled[k], s) == pytest.approx(getattr(base[int(i)], s), abs=1e-6)
    small = engine.with_policy(max_batch_tokens=64, max_batch_size=3)
    rebatched = score(responses, samples, scorers=scorers, engine=small)
    assert rebatched.stats.batches > base.stats.batches
    for a, b in zip(base, rebatched):
        assert a.noncontradiction == pytest.approx(b.noncontradiction, abs=1e-5)


def test_result_serialisation(art_v1: Path) -> None:
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    res = score(["Paris"], [["Lyon", "Paris"]], scorers=("noncontradiction",), engine=engine)
    data = json.loads(res.to_json())
    assert data["rows"][0]["noncontradiction"] == res[0].noncontradiction and data["precision"] == "fp32"
    assert res.column("noncontradiction") == [res[0].noncontradiction]


@pytest.mark.parametrize(
    "responses, samples, scorers, exc, message",
    [
        ("Paris", [["a"]], ("noncontradiction",), TypeError, "responses must be a list; got str"),
        (["Paris", "Lyon"], [["a"]], ("noncontradiction",), ValueError,
         "responses has 2 items but sampled_responses has 1; give one list of sampled responses per response"),
        ([3], [["a"]], ("noncontradiction",), TypeError, "responses[0] must be str; got int"),
        (["a", "b"], [["x"], []], ("noncontradiction",), ValueError,
         "sampled_responses[1] is empty; each response needs at least one sampled response"),
        (["a"], [["x", None]], ("noncontradiction",), TypeError, "sampled_responses[0][1] must be str; got NoneType"),
        (["a"], ["x"], ("noncontradiction",), TypeError, "sampled_responses[0] must be a list of strings; got str"),
        (["a"], [["x"]], ("ncp",), ValueError, "scorers=['ncp']: unknown ['ncp']; choose from ['noncontradiction', "
         "'entailment', 'semantic_negentropy', 'semantic_sets_confidence']"),
    ],
)
def test_bad_input(responses: object, samples: object, scorers: tuple[str, ...], exc: type[Exception],
                   message: str) -> None:
    with pytest.raises(exc, match=re.escape(message)):
        score(responses, samples, scorers=scorers, engine=TableEngine({}))  # type: ignore[arg-type]


def test_cli_score_jsonl_and_csv(art_v1: Path, tmp_path: Path) -> None:
    from fastnli.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 7, "response": "Paris", "sampled_responses": ["Lyon", "Paris", ""]}\n'
                   '{"id": 8, "response": "", "sampled_responses": ["Mars"]}\n')
    out = tmp_path / "out.jsonl"
    assert main(["score", str(src), "-o", str(out), "--model", str(art_v1), "--precision", "fp32",
                 "--scorers", "noncontradiction,entailment", "--no-progress"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    ref = score(["Paris", ""], [["Lyon", "Paris", ""], ["Mars"]], scorers=("noncontradiction", "entailment"),
                engine=engine)
    assert [r["id"] for r in rows] == [7, 8]
    assert rows[0]["noncontradiction"] == pytest.approx(ref[0].noncontradiction, abs=1e-6)
    csv_src = tmp_path / "in.csv"
    csv_src.write_text("response,sample_1,sample_2,sample_3\nParis,Lyon,Paris,\n,Mars,,\n")
    rows_csv = read_score_input(csv_src)
    assert rows_csv[0]["sampled_responses"] == ["Lyon", "Paris"] and rows_csv[1]["sampled_responses"] == ["Mars"]



def _bad_and_good_lines() -> tuple[list[str], dict[int, str]]:
    """Input lines of a score file mixing scorable records with bad ones, and each bad line's expected error."""
    lines = ['{"id": 1, "prompt": "Capital?", "response": "Paris", "sampled_responses": ["Lyon", "Paris"]}',
             '{"id": 2, "response": "a", ',
             '{"id": 3, "prompt": "Capital?", "response": 5, "sampled_responses": ["a"]}',
             '[1, 2]',
             '{"id": 5, "response": "Lyon", "sampled_responses": ["Paris"]}',
             '{"id": 6, "prompt": "Capital?", "response": "Lyon", "sampled_responses": ["Paris", 7]}',
             '{"id": 7, "prompt": "Capital?", "response": "Lyon", "sampled_responses": ["Paris, France"]}']
    errors = {2: "in.jsonl:2: not valid JSON (Expecting property name enclosed in double quotes); each line must be "
                 "one JSON object",
              3: "in.jsonl:3: field 'response' must be a string, got int",
              4: "in.jsonl:4: expected a JSON object, got list",
              5: "in.jsonl:5: missing field 'prompt'; other records have one: give every record its question or none",
              6: "in.jsonl:6: field 'sampled_responses'[1] must be a string, got int"}
    return lines, errors


def test_cli_score_keeps_invalid_records_in_place(art_v1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    from fastnli.cli import main

    monkeypatch.chdir(tmp_path)
    lines, errors = _bad_and_good_lines()
    Path("in.jsonl").write_text("\n".join(lines[:4]) + "\n\n" + "\n".join(lines[4:]) + "\n")
    errors = {k + (k >= 5): v.replace(f"in.jsonl:{k}:", f"in.jsonl:{k + (k >= 5)}:") for k, v in errors.items()}
    args = ["score", "in.jsonl", "-o", "out.jsonl", "--model", str(art_v1), "--precision", "fp32", "--no-progress"]
    with pytest.raises(ValueError, match=re.escape(errors[2])):  # the default stops at the first bad line
        read_score_input("in.jsonl")
    assert main(args) != 0 and not Path("out.jsonl").exists()
    assert main([*args, "--on-invalid", "keep"]) == 0
    out = [json.loads(x) for x in Path("out.jsonl").read_text().splitlines()]
    assert len(out) == len(lines)  # every non-blank input line, in its place
    assert [r.get("error") for r in out] == [errors.get(n) for n in (1, 2, 3, 4, 6, 7, 8)]
    assert [r.get("id") for r in out] == [1, None, 3, None, 5, 6, 7]
    assert "noncontradiction" not in out[2] and out[2]["response"] == 5  # a bad record keeps its fields, no score
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    ref = score(["Paris", "Lyon"], [["Lyon", "Paris"], ["Paris, France"]], engine=engine,
                prompts=["Capital?", "Capital?"])
    assert [out[0]["noncontradiction"], out[6]["noncontradiction"]] == pytest.approx(
        [r.noncontradiction for r in ref], abs=1e-6)  # the good records score as they would alone
    assert "5 of 7 records of in.jsonl could not be scored and are kept with an 'error' field; the first: " \
        + errors[2] in caplog.text


def test_cli_keep_invalid_edge_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from fastnli.cli import main

    monkeypatch.chdir(tmp_path)
    Path("bad.jsonl").write_text('{"response": 1, "sampled_responses": ["a"]}\n{"premise": "a"}\n')
    missing_model = str(tmp_path / "no-such-model")  # loading it would fail: nothing valid, nothing loaded
    assert main(["score", "bad.jsonl", "-o", "s.jsonl", "--on-invalid", "keep", "--model", missing_model]) == 0
    assert [json.loads(x)["error"] for x in Path("s.jsonl").read_text().splitlines()] == [
        "bad.jsonl:1: field 'response' must be a string, got int", "bad.jsonl:2: missing field 'response'"]
    assert main(["predict", "bad.jsonl", "-o", "p.jsonl", "--on-invalid", "keep", "--model", missing_model]) == 0
    assert [json.loads(x)["error"] for x in Path("p.jsonl").read_text().splitlines()] == [
        "bad.jsonl:1: missing field 'premise' (a string)", "bad.jsonl:2: missing field 'hypothesis' (a string)"]
    capsys.readouterr()
    Path("clash.jsonl").write_text('{"response": "a", "sampled_responses": ["b"], "error": 0}\n')
    assert main(["score", "clash.jsonl", "--on-invalid", "keep", "--model", missing_model]) != 0
    assert "clash.jsonl:1: the record has a field 'error', where --on-invalid keep writes the errors; rename that " \
        "field, or use --on-invalid stop" in " ".join(capsys.readouterr().err.split())
    Path("in.csv").write_text('response,sampled_responses\nParis,"[""Lyon""]"\nLyon,not json\n')
    rows = read_score_input("in.csv", keep_invalid=True)
    assert [r.get("_error") for r in rows] == [
        None, "in.csv:3: field 'sampled_responses' must hold a JSON list of strings"]


def test_cli_predict_keeps_invalid_records_in_place(art_v1: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from fastnli.cli import main

    monkeypatch.chdir(tmp_path)
    Path("pairs.jsonl").write_text('{"premise": "A man sleeps.", "hypothesis": "A man rests."}\n'
                                   '{"premise": "A man sleeps.", "hypothesis": ["x"]}\n'
                                   'oops\n'
                                   '{"id": 4, "premise": "A dog runs.", "hypothesis": "An animal moves."}\n')
    args = ["predict", "pairs.jsonl", "-o", "out.jsonl", "--model", str(art_v1), "--precision", "fp32"]
    assert main(args) != 0
    assert main([*args, "--on-invalid", "keep"]) == 0
    out = [json.loads(x) for x in Path("out.jsonl").read_text().splitlines()]
    assert [r.get("error") for r in out] == [
        None, "pairs.jsonl:2: field 'hypothesis' must be a string, got list",
        "pairs.jsonl:3: not valid JSON (Expecting value); each line must be one JSON object", None]
    engine = NLIEngine.from_pretrained(art_v1, device="cpu", precision="fp32")
    probs = engine.predict([("A man sleeps.", "A man rests."), ("A dog runs.", "An animal moves.")])
    got = np.array([[r[label] for label in engine.labels] for r in (out[0], out[3])])
    np.testing.assert_allclose(got, probs, atol=1e-6)
    assert out[3]["id"] == 4 and out[1]["hypothesis"] == ["x"]

@pytest.mark.parametrize(
    "line, message",
    [
        ('{"response": "a", "sampled_responses": []}', "in.jsonl:2: field 'sampled_responses' must be a non-empty "
                                                       "list of strings"),
        ('{"response": 5, "sampled_responses": ["a"]}', "in.jsonl:2: field 'response' must be a string, got int"),
        ('{"sampled_responses": ["a"]}', "in.jsonl:2: missing field 'response'"),
        ('{"response": "a", "sampled_responses": ["a", 1]}', "in.jsonl:2: field 'sampled_responses'[1] must be a "
                                                             "string, got int"),
        ('{"response": "a", ', "in.jsonl:2: not valid JSON"),
    ],
)
def test_malformed_input_lines_name_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"response": "ok", "sampled_responses": ["ok"]}\n' + line + "\n")
    with pytest.raises(ValueError, match=re.escape(message)):
        read_score_input(src)
