"""The CaLM loop (Hsu et al., 2024, "Contrasting Large and Small Language Models to Verify Grounded Generation").

For each query, iteration ``t = 1..max_iterations``:

1. the main (large) LM answers with ALCE citations — from the pool's first ``k`` documents (``t = 1``), or, after a
   rejected answer, from the corroborated statements of that answer plus the pool's next ``k`` documents;
2. the answer is split into statements and its citations parsed (citable: every document shown so far);
3. the verifier (small) LM answers the same query from the documents the answer cites, and nothing else (an answer
   that cites no valid document is not verified: it scores 0 and is refined);
4. the NLI checks (:mod:`fastnli.calm.checks`) compare the answer with the verifier's; the answer is accepted when
   the acceptance rule holds, else its corroborated statements are kept for the next refinement.

A query stops when accepted, after ``max_iterations``, or when its pool has no further documents. The final answer
is the accepted one, else the one with the highest consistency score (the earliest on ties).

Many queries run at once: in each iteration the main-LM calls of all active queries run concurrently on one thread
pool (``max_concurrency``), then the verifier calls, then the NLI checks of all active queries go through ONE engine
pass (the engine dedups and length-packs across queries).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fastnli.calm.checks import AnswerInput, CheckConfig, check_answers, engine_max_length
from fastnli.calm.documents import Document, as_documents, estimate_tokens
from fastnli.calm.lm import LMCaller, LMError, resolve_lm
from fastnli.calm.prompts import PromptTemplates
from fastnli.calm.result import CalmBatchResult, CalmResult, IterationTrace, stats_dict
from fastnli.calm.statements import Statement, format_citations, split_statements
from fastnli.engine.protocol import EngineLike

__all__ = ["Retriever", "calm", "calm_batch"]

logger = logging.getLogger("fastnli")

#: ``query -> ranked documents`` (strings or ``{"title", "text"}`` dicts), best first.
Retriever = Callable[[str], Sequence[Any]]
OnError = Literal["raise", "record"]


@dataclass
class _Query:
    index: int
    query: str
    pool: list[Document] = field(default_factory=list)
    shown: int = 0
    kept: list[str] = field(default_factory=list)
    previous_answer: str = ""
    trace: list[IterationTrace] = field(default_factory=list)
    done: bool = False
    stop_reason: str = "max_iterations"
    error: str | None = None


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1")
    return value


def _validate_query(q: Any, where: str) -> str:
    if not isinstance(q, str):
        raise TypeError(f"{where} must be str; got {type(q).__name__}")
    if not q.strip():
        raise ValueError(f"{where} is empty; give the question to answer as a non-empty string")
    return q


def _with_citations(text: str, cites: Sequence[int]) -> str:
    """``"Paris is big."`` + [0, 1] → ``"Paris is big [1][2]."`` (ALCE places markers before the final mark)."""
    if not cites:
        return text
    m = re.search(r"[.!?。！？]+$", text)
    if m:
        return f"{text[:m.start()]} {format_citations(cites)}{m.group(0)}"
    return f"{text} {format_citations(cites)}"


def _fail(q: _Query, exc: BaseException, on_error: OnError, trace: IterationTrace | None) -> None:
    if on_error == "raise":
        raise exc
    logger.warning("query %d stopped: %s", q.index, exc)
    q.done, q.stop_reason, q.error = True, "error", str(exc)
    if trace is not None:
        trace.error = str(exc)


def _retrieve(states: list[_Query], retriever: Retriever, pool: ThreadPoolExecutor, on_error: OnError) -> None:
    futures = [pool.submit(retriever, q.query) for q in states]
    for q, fut in zip(states, futures):
        try:
            docs = fut.result()
        except Exception as exc:
            err = RuntimeError(f"the retriever failed on query {q.index}: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            _fail(q, err, on_error, None)
            continue
        try:
            if isinstance(docs, Sequence) and not isinstance(docs, (str, bytes)) and len(docs) == 0:
                raise ValueError(f"the retriever returned no documents for query {q.index}; CaLM needs at least one "
                                 "document per query")
            q.pool = as_documents(docs, f"the retriever's result for query {q.index}")
        except (TypeError, ValueError) as exc:
            _fail(q, exc, on_error, None)


def _warn_long_documents(states: list[_Query], max_length: int, long_premise: str) -> None:
    long = [(q.index, j) for q in states for j, d in enumerate(q.pool)
            if estimate_tokens(d.text) + estimate_tokens(d.title) > max_length]
    if long:
        where = ", ".join(f"documents[{i}][{j}]" for i, j in long[:5]) + (" ..." if len(long) > 5 else "")
        if long_premise == "chunk":
            logger.info("%d document(s) are estimated over the NLI model's limit of %d tokens (%s); checks read them "
                        "in windows (long_premise='chunk')", len(long), max_length, where)
            return
        logger.warning("%d document(s) are estimated over the NLI model's limit of %d tokens (%s); the engine "
                       "truncates each (premise, hypothesis) pair longest_first, so checks see only the beginning of "
                       "such documents; results flag them (truncated, truncated_documents)", len(long), max_length,
                       where)


def _prompt(q: _Query, t: int, k: int, templates: PromptTemplates) -> tuple[str, int, int]:
    start, end = q.shown, min(q.shown + k, len(q.pool))
    docs = templates.format_documents(q.pool[start:end], first_number=start + 1)
    if t == 1:
        return templates.answer_prompt(q.query, docs), start, end
    return templates.refine_prompt(q.query, docs, q.kept, q.previous_answer), start, end


def calm_batch(
    queries: Sequence[str],
    documents_or_retriever: Sequence[Sequence[Any]] | Retriever,
    main_lm: Any,
    verifier_lm: Any,
    engine: EngineLike | None = None,
    k: int = 3,
    max_iterations: int = 3,
    *,
    check_config: CheckConfig | None = None,
    prompts: PromptTemplates | None = None,
    max_concurrency: int = 8,
    on_error: OnError = "raise",
    progress: Callable[[int, int], None] | None = None,
) -> CalmBatchResult:
    """Run CaLM for many queries at once (see the module docstring for the loop).

    Args:
        queries: the questions, non-empty strings.
        documents_or_retriever: one ranked list of documents per query (strings or ``{"title", "text"}`` dicts,
            best first), or a retriever ``query -> ranked documents`` (called once per query, concurrently).
        main_lm: the large LM that answers with citations: a callable ``prompt -> str`` (e.g.
            :class:`~fastnli.calm.lm.OpenAIChatLM`), a :class:`~fastnli.calm.lm.BatchedLM`, or a LangChain chat model.
        verifier_lm: the small LM that answers from the cited documents only (same kinds).
        engine: the NLI engine (default None: :func:`~fastnli.engine.default_engine`, the embedded default model).
        k: documents per batch: the first answer sees the pool's first ``k``; each refinement the next ``k``
            (default 3).
        max_iterations: T, the most answers per query (default 3).
        check_config: NLI decision and acceptance rules (default :class:`~fastnli.calm.checks.CheckConfig()`:
            accept when ≥ 80 % of statements are corroborated and none is contradicted with probability > 0.5;
            a premise read in windows takes the engine's window threshold, :meth:`CheckConfig.for_engine`).
        prompts: prompt templates (default :class:`~fastnli.calm.prompts.PromptTemplates()`, ALCE style).
        max_concurrency: LM calls in flight at once, across all queries (default 8).
        on_error: ``"raise"`` (default): the first failed LM call (lowest query index of the phase) raises
            :class:`~fastnli.calm.lm.LMError` naming the LM, the role and the query index; ``"record"``: that query
            stops with ``stop_reason="error"`` and the error in its result, the others go on.
        progress: called as ``progress(queries finished, queries)`` whenever queries finish.

    Returns:
        A :class:`~fastnli.calm.result.CalmBatchResult` (one result per query in input order, one engine pass per
        iteration).

    Raises:
        TypeError / ValueError: bad input, naming the argument or index and the fix.
        LMError: an LM failed (with ``on_error="raise"``).
    """
    t0 = time.perf_counter()
    if isinstance(queries, (str, bytes)) or not isinstance(queries, Sequence):
        raise TypeError(f"queries must be a list of strings; got {type(queries).__name__}")
    qs = [_validate_query(q, f"queries[{i}]") for i, q in enumerate(queries)]
    k = _check_positive_int("k", k)
    max_iterations = _check_positive_int("max_iterations", max_iterations)
    max_concurrency = _check_positive_int("max_concurrency", max_concurrency)
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error={on_error!r} is not supported; use 'raise' or 'record'")
    main: LMCaller = resolve_lm(main_lm, "main")
    verifier: LMCaller = resolve_lm(verifier_lm, "verifier")
    config = check_config or CheckConfig()
    templates = prompts or PromptTemplates()
    retriever: Retriever | None = None
    states = [_Query(i, q) for i, q in enumerate(qs)]
    if callable(documents_or_retriever) and not isinstance(documents_or_retriever, Sequence):
        retriever = documents_or_retriever
    else:
        docs_all = documents_or_retriever
        if isinstance(docs_all, (str, bytes)) or not isinstance(docs_all, Sequence):
            raise TypeError("documents_or_retriever must be a list of document lists (one per query) or a retriever "
                            f"callable (query -> documents); got {type(docs_all).__name__}")
        if len(docs_all) != len(qs):
            raise ValueError(f"documents has {len(docs_all)} lists for {len(qs)} queries; give one list of documents "
                             "per query")
        for q, docs in zip(states, docs_all):
            q.pool = as_documents(docs, f"documents[{q.index}]")
    if engine is None:
        from fastnli.engine import default_engine

        engine = default_engine()
    if not callable(getattr(engine, "predict_with_stats", None)):
        raise TypeError(f"engine must be an NLIEngine (fastnli.NLIEngine.from_pretrained(...)) or have "
                        f"predict_with_stats(pairs); got {type(engine).__name__}")
    passes: list[dict[str, Any]] = []
    finished = 0

    def report() -> None:
        nonlocal finished
        now = sum(q.done for q in states)
        if progress is not None and now != finished:
            progress(now, len(states))
        finished = now

    with ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="fastnli-calm") as pool:
        if retriever is not None:
            _retrieve(states, retriever, pool, on_error)
        _warn_long_documents([q for q in states if not q.done], engine_max_length(engine), config.long_premise)
        report()
        for t in range(1, max_iterations + 1):
            active = [q for q in states if not q.done]
            if not active:
                break
            traces: dict[int, IterationTrace] = {}
            bounds: dict[int, int] = {}
            for q in active:
                prompt, start, end = _prompt(q, t, k, templates)
                traces[q.index] = IterationTrace(iteration=t, main_prompt=prompt,
                                                 documents_shown=list(range(start, end)), citable_documents=end)
                bounds[q.index] = end
                q.trace.append(traces[q.index])

            # Phase 1: main LM, all active queries concurrently.
            answers = main.run([traces[q.index].main_prompt for q in active], [q.index for q in active], pool)
            for q, out in zip(active, answers):
                if isinstance(out, LMError):
                    _fail(q, out, on_error, traces[q.index])
                else:
                    traces[q.index].answer = out
            active = [q for q in active if not q.done]

            # Phase 2: verifier LM on the documents each answer cites.
            statements: dict[int, list[Statement]] = {}
            to_verify: list[_Query] = []
            for q in active:
                tr = traces[q.index]
                statements[q.index] = split_statements(tr.answer, bounds[q.index])
                tr.verifier_documents = sorted({c for s in statements[q.index] for c in s.citations})
                if tr.verifier_documents:
                    docs = templates.format_documents([q.pool[c] for c in tr.verifier_documents])
                    tr.verifier_prompt = templates.verifier_prompt(q.query, docs)
                    to_verify.append(q)
                else:
                    tr.notes.append("the answer cites no valid document; the verifier was not called and the answer "
                                    "scores 0")
            verified = verifier.run([traces[q.index].verifier_prompt or "" for q in to_verify],
                                    [q.index for q in to_verify], pool)
            for q, out in zip(to_verify, verified):
                if isinstance(out, LMError):
                    _fail(q, out, on_error, traces[q.index])
                else:
                    traces[q.index].verifier_answer = out
            active = [q for q in active if not q.done]

            # Phase 3: the NLI checks of all active queries, one engine pass.
            if not active:
                report()
                continue
            inputs = [AnswerInput(answer=traces[q.index].answer, documents=q.pool[:bounds[q.index]],
                                  verifier_answer=traces[q.index].verifier_answer or "",
                                  statements=statements[q.index]) for q in active]
            checks, stats = check_answers(inputs, engine, config)
            pass_stats = {"iteration": t, "active_queries": len(active), **stats_dict(stats)}
            passes.append(pass_stats)
            for q, check in zip(active, checks):
                tr = traces[q.index]
                tr.check, tr.engine_pass = check, pass_stats
                tr.kept_statements = [_with_citations(s.text, s.citations)
                                      for s, c in zip(statements[q.index], check.statements) if c.corroborated]
                q.kept, q.previous_answer, q.shown = tr.kept_statements, tr.answer, bounds[q.index]
                if check.accepted:
                    q.done, q.stop_reason = True, "accepted"
                elif t == max_iterations:
                    q.done, q.stop_reason = True, "max_iterations"
                elif q.shown >= len(q.pool):
                    q.done, q.stop_reason = True, "documents_exhausted"
                    tr.notes.append(f"no documents left in the pool of {len(q.pool)} to refine with")
            logger.info("CaLM iteration %d: %d queries checked, %d accepted; NLI pass: %d pairs, %d unique, %.2f s",
                        t, len(active), sum(bool(c.accepted) for c in checks), pass_stats["pairs_in"],
                        pass_stats["unique_pairs"], pass_stats["seconds"])
            report()
    for q in states:
        q.done = True
    report()
    results = [_result(q, engine) for q in states]
    settings = {"k": k, "max_iterations": max_iterations, "max_concurrency": max_concurrency,
                "main_lm": main.name, "verifier_lm": verifier.name, "check_config": asdict(config)}
    return CalmBatchResult(results=results, passes=passes, device=str(getattr(engine, "device", "")),
                           precision=str(getattr(engine, "precision", "")), seconds=time.perf_counter() - t0,
                           settings=settings)


def _result(q: _Query, engine: Any) -> CalmResult:
    res = CalmResult(index=q.index, query=q.query, iterations=len(q.trace), stop_reason=q.stop_reason,
                     trace=q.trace, documents=q.pool[:max([q.shown] + [t.citable_documents for t in q.trace])],
                     error=q.error, device=str(getattr(engine, "device", "")),
                     precision=str(getattr(engine, "precision", "")))
    scored = [t for t in q.trace if t.check is not None]
    if scored:
        accepted = [t for t in scored if t.accepted]
        best = accepted[0] if accepted else max(scored, key=lambda t: (t.consistency or 0.0, -t.iteration))
        res.answer, res.accepted, res.best_iteration = best.answer, best.accepted, best.iteration
    return res


def calm(
    query: str,
    documents_or_retriever: Sequence[Any] | Retriever,
    main_lm: Any,
    verifier_lm: Any,
    engine: EngineLike | None = None,
    k: int = 3,
    max_iterations: int = 3,
    **options: Any,
) -> CalmResult:
    """Run CaLM for one query; ``documents_or_retriever`` is its ranked document list or a retriever.

    Takes the keyword options of :func:`calm_batch` (``check_config``, ``prompts``, ``max_concurrency``,
    ``on_error``, ``progress``).
    """
    _validate_query(query, "query")
    if callable(documents_or_retriever) and not isinstance(documents_or_retriever, Sequence):
        docs: Sequence[Any] | Retriever = documents_or_retriever
    else:
        docs = [as_documents(documents_or_retriever, "documents")]
    return calm_batch([query], docs, main_lm, verifier_lm, engine, k, max_iterations, **options).results[0]
