"""The CaLM loop with scripted LMs and a rule-based stub engine: accept, refine, give up, bad citations, LM errors."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from fastnli.calm import LMError, PromptTemplates, batched, calm, calm_batch
from fastnli.engine import CallStats

ENTAIL, NEUTRAL, CONTRA = (0.02, 0.03, 0.95), (0.1, 0.8, 0.1), (0.9, 0.05, 0.05)


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


class RuleEngine:
    """Entailment when the hypothesis is contained in the premise, contradiction when it is after removing "not"."""

    device = "cpu"
    precision = "stub"

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []

    def predict_with_stats(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, CallStats]:
        pairs = list(pairs)
        self.calls.append(pairs)
        rows = []
        for p, h in pairs:
            np_, nh = _norm(p), _norm(h)
            rows.append(ENTAIL if nh in np_ else CONTRA if nh in np_.replace("not ", "") else NEUTRAL)
        return np.array(rows, dtype=np.float32).reshape(-1, 3), CallStats(pairs_in=len(pairs),
                                                                          unique_pairs=len(set(pairs)))


class Scripted:
    """A callable LM: the answer of the first rule whose substring is in the prompt; records prompts."""

    def __init__(self, rules: list[tuple[str, str]], name: str = "scripted") -> None:
        self.rules, self.name = rules, name
        self.prompts: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self._lock:
            self.prompts.append(prompt)
        for key, answer in self.rules:
            if key in prompt:
                return answer
        raise AssertionError(f"no scripted answer for prompt:\n{prompt}")


POOL = ["Paris is the capital of France.", "Paris has many museums.", "Lyon is a city in France.",
        "Paris lies on the Seine.", "Marseille is a port.", "Nice is sunny."]


def test_accepts_a_consistent_first_answer() -> None:
    main = Scripted([("Question:", "Paris is the capital of France [1]. Paris has many museums [2].")])
    verifier = Scripted([("Question:", "Paris is the capital of France, its largest city. Paris has many museums and parks.")])
    engine = RuleEngine()
    res = calm("What is Paris?", POOL, main, verifier, engine, k=3, max_iterations=3)
    assert res.accepted and res.iterations == 1 and res.stop_reason == "accepted" and res.best_iteration == 1
    assert res.answer == "Paris is the capital of France [1]. Paris has many museums [2]."
    assert len(engine.calls) == 1
    tr = res.trace[0]
    assert tr.documents_shown == [0, 1, 2] and tr.verifier_documents == [0, 1]
    assert "Document [3]: Lyon is a city in France." in tr.main_prompt
    # The verifier sees the cited documents only, renumbered.
    assert "Document [1]: Paris is the capital of France." in verifier.prompts[0]
    assert "Document [2]: Paris has many museums." in verifier.prompts[0] and "Lyon" not in verifier.prompts[0]
    assert res.metrics["consistency"] == pytest.approx(0.95) and res.metrics["citation_recall"] == 1.0
    assert res.metrics["nli_pairs"] == 2 * 2 + 2
    assert tr.engine_pass is not None and tr.engine_pass["pairs_in"] == 6
    d = json.loads(res.to_json())
    assert d["accepted"] is True and d["trace"][0]["check"]["statements"][0]["corroborated"] is True
    assert "main_prompt" not in res.to_dict(include_prompts=False)["trace"][0]


def test_refines_with_corroborated_statements_then_accepts() -> None:
    first = "Paris is the capital of France [1]. Paris has ten million cats [2]."
    refined = "Paris is the capital of France [1]. Paris lies on the Seine [4]."
    main = Scripted([("Confirmed statements:", refined), ("Question:", first)])
    verifier = Scripted([("Seine", "Paris is the capital of France. Paris lies on the Seine."),
                         ("Question:", "Paris is the capital of France. Cats are not counted.")])
    engine = RuleEngine()
    res = calm("Tell me about Paris.", POOL, main, verifier, engine, k=3, max_iterations=3)
    assert res.accepted and res.iterations == 2 and res.best_iteration == 2 and res.answer == refined
    assert len(engine.calls) == 2
    t1, t2 = res.trace
    assert t1.check is not None and t1.check.corroborated_share == 0.5 and not t1.accepted
    assert t1.kept_statements == ["Paris is the capital of France [1]."]
    assert t2.documents_shown == [3, 4, 5] and t2.citable_documents == 6
    assert "- Paris is the capital of France [1]." in t2.main_prompt
    assert "Document [4]: Paris lies on the Seine." in t2.main_prompt and "Document [1]" not in t2.main_prompt
    assert t2.verifier_documents == [0, 3]
    assert "Document [2]: Paris lies on the Seine." in verifier.prompts[1]
    assert len(res.documents) == 6


def test_gives_up_after_T_with_the_best_answer() -> None:
    answers = ["Paris is the capital of France [1]. Paris is blue [2].",  # 1 of 2 corroborated
               "Paris is the capital of France [1]. Paris has many museums [2]. Paris is red [3].",  # 2 of 3
               "Paris is the capital of France [1]. Paris is green [2]. Paris is pink [3]."]  # 1 of 3
    counter = iter(answers)
    verifier = Scripted([("Question:", "Paris is the capital of France, its largest city. Paris has many museums "
                                       "and parks.")])

    def main_lm(prompt: str) -> str:
        return next(counter)

    engine = RuleEngine()
    res = calm("Paris?", POOL, main_lm, verifier, engine, k=2, max_iterations=3)
    assert not res.accepted and res.iterations == 3 and res.stop_reason == "max_iterations"
    assert [t.consistency for t in res.trace] == pytest.approx([(0.95 + 0.1) / 2, (0.95 * 2 + 0.1) / 3,
                                                                (0.95 + 0.2) / 3])
    assert res.best_iteration == 2 and res.answer == answers[1]
    assert [t.documents_shown for t in res.trace] == [[0, 1], [2, 3], [4, 5]]
    assert len(engine.calls) == 3


def test_stops_when_the_pool_is_exhausted() -> None:
    main = Scripted([("Question:", "Paris is blue [1].")])
    verifier = Scripted([("Question:", "Paris is the capital of France.")])
    res = calm("Paris?", POOL[:3], main, verifier, RuleEngine(), k=3, max_iterations=3)
    assert res.iterations == 1 and res.stop_reason == "documents_exhausted" and not res.accepted
    assert res.answer == "Paris is blue [1]." and res.best_iteration == 1
    assert any("no documents left" in n for n in res.trace[0].notes)


def test_citations_out_of_range_or_missing_are_reported_not_raised() -> None:
    main = Scripted([("Where is Paris", "Paris is the capital of France [7]. It is big."),
                     ("Is Paris big", "Paris is the capital of France [1][9].")])
    verifier = Scripted([("Question:", "Paris is the capital of France.")])
    engine = RuleEngine()
    batch = calm_batch(["Where is Paris?", "Is Paris big?"], [POOL[:3], POOL[:3]], main, verifier, engine, k=3,
                       max_iterations=1)
    r0, r1 = batch
    c0 = r0.trace[0].check
    assert c0 is not None and c0.invalid_citations == [7] and c0.consistency == 0.0 and not r0.accepted
    assert r0.trace[0].verifier_prompt is None and r0.trace[0].verifier_answer is None
    assert any("cites no valid document; the verifier was not called" in n for n in r0.trace[0].notes)
    assert [s.supported for s in c0.statements] == [False, False]
    c1 = r1.trace[0].check
    assert c1 is not None and c1.invalid_citations == [9] and r1.trace[0].verifier_documents == [0]
    assert c1.statements[0].supported is False  # an out-of-range citation fails ALCE support
    assert c1.citation_precision == 0.0 and c1.num_citations == 2
    assert r1.accepted  # corroboration decides acceptance
    assert len(verifier.prompts) == 1 and len(engine.calls) == 1


def test_one_engine_pass_per_iteration_whatever_the_number_of_queries() -> None:
    main = Scripted([("Confirmed statements:", "Paris is the capital of France [1]."),
                     ("Question: q", "Paris is the capital of France [1]. Paris is blue [2].")])
    verifier = Scripted([("Question:", "Paris is the capital of France.")])
    engine = RuleEngine()
    calls: list[int] = []
    batch = calm_batch([f"q{i}" for i in range(20)], [POOL] * 20, main, verifier, engine, k=3, max_iterations=3,
                       max_concurrency=4, progress=lambda done, total: calls.append(done))
    assert len(engine.calls) == 2 and len(batch.passes) == 2
    assert [p["active_queries"] for p in batch.passes] == [20, 20]
    assert all(r.accepted and r.iterations == 2 for r in batch)
    # Identical pairs across queries are all sent, and deduplicated by the engine: 2 statements x 1 verifier sentence
    # + 2 citation pairs per query; the verifier's sentence equals document [1], so 3 distinct pairs in all.
    assert batch.passes[0]["pairs_in"] == 20 * (2 * 1 + 2) and batch.passes[0]["unique_pairs"] == 3
    assert calls[-1] == 20 and batch.settings["k"] == 3
    assert batch.accepted_share == 1.0


def test_batched_and_langchain_style_lms() -> None:
    sizes: list[int] = []

    def main_many(prompts: list[str]) -> list[str]:
        sizes.append(len(prompts))
        return ["Paris is the capital of France [1]."] * len(prompts)

    class Msg:
        def __init__(self, content: object) -> None:
            self.content = content

    class FakeChat:
        model_name = "tiny-chat"

        def __init__(self) -> None:
            self.seen: list[object] = []

        def invoke(self, messages: object) -> Msg:
            self.seen.append(messages)
            return Msg([{"type": "text", "text": "Paris is the capital of France."}])

    chat = FakeChat()
    batch = calm_batch(["a?", "b?", "c?"], [POOL] * 3, batched(main_many, name="many"), chat, RuleEngine())
    assert sizes == [3] and all(r.accepted for r in batch)
    assert isinstance(chat.seen[0], list) and chat.seen[0][0][0] == "human"
    assert batch.settings["main_lm"] == "many" and batch.settings["verifier_lm"] == "tiny-chat"


def test_retriever_is_called_once_per_query() -> None:
    asked: list[str] = []

    def retriever(query: str) -> list[dict[str, str]]:
        asked.append(query)
        return [{"title": "Paris", "text": POOL[0]}, {"title": "", "text": POOL[1]}]

    main = Scripted([("Question:", "Paris is the capital of France [1].")])
    verifier = Scripted([("Question:", "Paris is the capital of France.")])
    res = calm("Paris?", retriever, main, verifier, RuleEngine())
    assert asked == ["Paris?"] and res.accepted
    assert "Document [1](Title: Paris): Paris is the capital of France." in res.trace[0].main_prompt
    with pytest.raises(ValueError, match=re.escape(
            "the retriever returned no documents for query 0; CaLM needs at least one document per query")):
        calm("Paris?", lambda q: [], main, verifier, RuleEngine())


def test_verifier_errors_and_timeouts_surface_with_lm_and_query_index(caplog: pytest.LogCaptureFixture) -> None:
    main = Scripted([("Question:", "Paris is the capital of France [1].")])

    def flaky(prompt: str) -> str:
        if "Question: q1" in prompt:
            raise TimeoutError("read timed out")
        return "Paris is the capital of France."

    engine = RuleEngine()
    with pytest.raises(LMError, match=re.escape("verifier LM 'flaky' failed on query 1: TimeoutError: read timed out")) \
            as info:
        calm_batch(["q0", "q1", "q2"], [POOL] * 3, main, flaky, engine)
    assert info.value.role == "verifier" and info.value.query_index == 1 and info.value.lm == "flaky"
    assert engine.calls == []

    with caplog.at_level(logging.WARNING, logger="fastnli"):
        batch = calm_batch(["q0", "q1", "q2"], [POOL] * 3, main, flaky, engine, on_error="record")
    assert [r.stop_reason for r in batch] == ["accepted", "error", "accepted"]
    assert batch[1].error == "verifier LM 'flaky' failed on query 1: TimeoutError: read timed out"
    assert batch[1].answer is None and batch[1].trace[0].error == batch[1].error
    assert len(engine.calls) == 1 and batch.passes[0]["active_queries"] == 2
    assert "query 1 stopped" in caplog.text


def test_main_lm_returning_a_non_string() -> None:
    def bad(prompt: str) -> str:
        return 3  # type: ignore[return-value]

    with pytest.raises(LMError, match=re.escape("main LM 'bad' returned int for query 0; an LM must return str")):
        calm("q?", POOL, bad, bad, RuleEngine())


def test_bad_input_messages() -> None:
    lm = Scripted([("", "x")])
    engine = RuleEngine()
    cases: list[tuple[type[Exception], str, dict[str, object]]] = [
        (ValueError, "queries[1] is empty; give the question to answer as a non-empty string",
         {"queries": ["a", "  "], "documents_or_retriever": [POOL, POOL]}),
        (TypeError, "queries[0] must be str; got int", {"queries": [3], "documents_or_retriever": [POOL]}),
        (TypeError, "queries must be a list of strings; got str", {"queries": "a", "documents_or_retriever": [POOL]}),
        (ValueError, "documents has 1 lists for 2 queries; give one list of documents per query",
         {"queries": ["a", "b"], "documents_or_retriever": [POOL]}),
        (ValueError, "documents[1] is empty; give at least one document (or a retriever)",
         {"queries": ["a", "b"], "documents_or_retriever": [POOL, []]}),
        (TypeError, "documents[0][1] must be a string or a {'title': ..., 'text': ...} dict; got NoneType",
         {"queries": ["a"], "documents_or_retriever": [["x", None]]}),
        (ValueError, "k=0 must be an integer >= 1", {"queries": ["a"], "documents_or_retriever": [POOL], "k": 0}),
        (ValueError, "max_iterations=1.5 must be an integer >= 1",
         {"queries": ["a"], "documents_or_retriever": [POOL], "max_iterations": 1.5}),
        (ValueError, "on_error='ignore' is not supported; use 'raise' or 'record'",
         {"queries": ["a"], "documents_or_retriever": [POOL], "on_error": "ignore"}),
        (TypeError, "verifier_lm must be a callable prompt -> str, a BatchedLM (list[str] -> list[str]) or a "
                    "LangChain chat model (an object with .invoke(messages)); got str",
         {"queries": ["a"], "documents_or_retriever": [POOL], "verifier_lm": "gpt"}),
        (TypeError, "engine must be an NLIEngine (fastnli.NLIEngine.from_pretrained(...)) or have "
                    "predict_with_stats(pairs); got object",
         {"queries": ["a"], "documents_or_retriever": [POOL], "engine": object()}),
    ]
    for exc_type, message, kwargs in cases:
        args: dict[str, object] = {"main_lm": lm, "verifier_lm": lm, "engine": engine, **kwargs}
        with pytest.raises(exc_type, match=re.escape(message)):
            calm_batch(**args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("query is empty; give the question to answer as a non-empty "
                                                   "string")):
        calm("", POOL, lm, lm, engine)
    with pytest.raises(ValueError, match=re.escape("documents is empty; give at least one document (or a "
                                                   "retriever)")):
        calm("q", [], lm, lm, engine)


def test_custom_prompts_reach_the_lms() -> None:
    main = Scripted([("ASK", "Paris is the capital of France [1].")])
    verifier = Scripted([("CHECK", "Paris is the capital of France.")])
    templates = PromptTemplates(answer="ASK {query}\n{documents}", verifier="CHECK {query}\n{documents}")
    res = calm("Paris?", POOL, main, verifier, RuleEngine(), prompts=templates)
    assert res.accepted and main.prompts[0].startswith("ASK Paris?") and verifier.prompts[0].startswith("CHECK")
