"""Run uqlm's ``BlackBoxUQ.score`` on pre-generated responses: JSON in, JSON out.

This is a standalone script executed with the python of uqlm's own virtual environment (see
:func:`bench.uqlm_peer.ensure_uqlm_env`). It imports ``fastnli`` only with ``"nli": "fastnli"``, which
needs fastnli installed in that venv (``ensure_uqlm_env(with_fastnli=True)``).

Usage::

    python _uqlm_runner.py REQUEST.json RESPONSE.json
    python _uqlm_runner.py --serve

``--serve`` imports uqlm's stack once (about 16 s on a 2-core AMD EPYC Zen 1), then runs jobs read from stdin, one
JSON object per line (``request``, ``response``, ``stderr``: paths; ``cwd``: a directory; ``env``: the job's
environment, which may differ from the server's in variables that imports do not read), each in a child forked
from that state: a job starts from what a fresh interpreter holds after those imports, its own patches and fastnli
import stay in its child. For each job the server writes the child's exit code on a line of stdout.

Request keys: ``checkpoint_dir`` (str), ``responses`` (list[str]), ``sampled_responses`` (list[list[str]]),
``scorers`` (list[str], default ``["noncontradiction"]``), ``use_best`` (bool, default false), ``batch_size``
(int, default 32), ``max_length`` (int, characters, default 2000 as in uqlm), ``torch_threads`` (int or null,
default null = torch's default), ``warmup`` (bool, default true: one uncounted, untimed ``predict_batch`` call on
two pairs before scoring), ``return_probabilities`` (bool, default false), ``fastnli_precision`` (str, default ``"fp32"``), ``prompts`` (list[str] or null), and:

- ``nli``: which NLI object uqlm's scorers get. ``"uqlm"`` (default): uqlm's own ``NLI`` on ``checkpoint_dir``.
  ``"fastnli"``: ``FastNLI(checkpoint_dir, device="cpu", precision=fastnli_precision)`` with ``checkpoint_dir`` a
  fastnli export artifact, handed over as ``nli=`` (ConsistencyScorer) or through
  ``fastnli.patch_uqlm(model=checkpoint_dir)`` (BlackBoxUQ). ``"patch"``: ``fastnli.patch_uqlm(precision=...)``
  and nothing else: the uqlm code is the same as with ``"uqlm"``, on the same ``checkpoint_dir``.
- ``api``: the uqlm entry point. ``"blackbox"`` (default): ``BlackBoxUQ(scorers, nli_model_name, device="cpu",
  use_best, nli_batch_size, max_length).score(responses, sampled_responses)``. ``"consistency"``:
  ``ConsistencyScorer(nli_model_name, max_length, use_best, scorers, device="cpu", nli_batch_size)`` (with ``nli=``
  for ``"fastnli"``)
  ``.evaluate(...)``. ``"semantic_entropy"``: ``SemanticEntropy(nli_model_name, device="cpu", use_best, max_length,
  nli_batch_size).score(prompts, responses, sampled_responses)``; scores ``discrete_confidence_scores``,
  ``discrete_entropy_values``, ``num_semantic_sets``. ``"generate_and_score"``: ``BlackBoxUQ(llm=<scripted
  langchain chat model>, ...).generate_and_score(prompts, num_responses)``, the chat model answering the k-th call
  for a prompt with ``llm_answers[i][k]`` (the original response first, then the samples; ``llm_answers``:
  list[list[str]], one list per prompt).

Response keys: ``scores`` ({scorer: [float or null]}, NaN/inf written as null), ``seconds`` (wall seconds of the
scoring call alone), ``load_seconds`` (wall seconds to build the uqlm object, i.e. load tokenizer and model),
``warmup_seconds`` (wall seconds of the warm-up call, 0 without one),
``num_nli_pairs`` (premise/hypothesis pairs passed to the NLI object's ``predict_batch`` during scoring),
``nli_calls`` (number of ``predict_batch`` calls), ``nli_seconds`` (wall seconds spent inside ``predict_batch``),
``responses`` / ``sampled_responses`` (as returned by uqlm: swapped for the best response when ``use_best`` applies),
``uqlm_version``, ``torch_version``, ``transformers_version``, ``numpy_version``, ``torch_threads``, ``nli``,
``api``, ``nli_class`` (module and name of the NLI object's class), ``uqlm_nli_built`` (how many of uqlm's own
``NLI`` objects were built), ``fastnli_kernels`` / ``fastnli_path`` (``fastnli.kernels.IMPLEMENTATION`` and
``fastnli.__file__`` with a fastnli ``nli``, else empty), ``llm_calls`` (the prompts of the scripted chat model's
calls, in call order; ``generate_and_score`` only), ``nli_probabilities`` (with ``"return_probabilities": true``:
the NLI object's cache after scoring, ``[premise, hypothesis, [contradiction, neutral, entailment]]`` per entry).

Progress bars that uqlm draws even with ``show_progress_bars=False`` go to stderr, never to the response file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import math
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from fastnli.engine.engine import PrecisionArg

#: uqlm entry points the runner drives (``api``).
APIS = ("blackbox", "consistency", "semantic_entropy", "generate_and_score")


def _finite_or_none(x: Any) -> float | None:
    """Return ``x`` as a float, or ``None`` for NaN/inf/None (JSON has no NaN)."""
    if x is None:
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _scripted_chat_model(answers: dict[str, list[str]]) -> Any:
    """A langchain chat model that answers the k-th call for a prompt with ``answers[prompt][k]`` (no network)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from pydantic import PrivateAttr

    class ScriptedChatModel(BaseChatModel):
        answers: dict[str, list[str]]
        temperature: float = 1.0
        _calls: list[str] = PrivateAttr(default_factory=list)

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            prompt = str(messages[-1].content)
            k = self._calls.count(prompt)
            self._calls.append(prompt)
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self.answers[prompt][k]))])

        async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            return self._generate(messages, stop, run_manager, **kwargs)

    return ScriptedChatModel(answers=answers)


def _preload() -> None:
    """Import what every job imports before it reads its request (the fork server's shared state)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import uqlm  # noqa: F401
    from langchain_core.language_models.chat_models import BaseChatModel  # noqa: F401
    from uqlm import BlackBoxUQ, SemanticEntropy  # noqa: F401
    from uqlm.black_box import ConsistencyScorer  # noqa: F401
    from uqlm.nli.nli import NLI  # noqa: F401


def serve() -> int:
    """The fork server: :func:`_preload`, then one forked child per job line of stdin (see the module docstring).
    Returns 0 when stdin closes."""
    _preload()
    protocol = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: its own stdout/stderr file and working directory, then the job
            code = 1
            try:
                fd = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.chdir(job["cwd"])
                os.environ.clear()  # the job's own environment, as a fresh interpreter would have it
                os.environ.update(job["env"])
                importlib.invalidate_caches()  # a fastnli installed since the server started is found
                code = main([job["request"], job["response"]])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        protocol.write(f"{os.waitstatus_to_exitcode(status)}\n")
        protocol.flush()
    return 0


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is ``[request_path, response_path]`` or ``["--serve"]``. Returns the process exit
    code."""
    if argv == ["--serve"]:
        return serve()
    if len(argv) != 2:
        sys.stderr.write("usage: _uqlm_runner.py REQUEST.json RESPONSE.json | --serve\n")
        return 2
    request_path, response_path = argv
    with open(request_path, encoding="utf-8") as f:
        req = json.load(f)

    import numpy as np
    import torch
    import transformers

    threads = req.get("torch_threads")
    if threads:
        torch.set_num_threads(int(threads))

    import uqlm
    from uqlm import BlackBoxUQ, SemanticEntropy
    from uqlm.black_box import ConsistencyScorer
    from uqlm.nli.nli import NLI

    backend = str(req.get("nli", "uqlm"))
    api = str(req.get("api", "blackbox"))
    if backend not in ("uqlm", "fastnli", "patch") or api not in APIS:
        sys.stderr.write(f"unknown nli={backend!r} or api={api!r}\n")
        return 2
    checkpoint = str(req["checkpoint_dir"])
    max_length = int(req.get("max_length", 2000))
    batch_size = int(req.get("batch_size", 32))
    # not validated here: fastnli itself rejects an unknown precision, as before
    precision = cast("PrecisionArg", str(req.get("fastnli_precision", "fp32")))
    use_best = bool(req.get("use_best", False))
    prompts = req.get("prompts")
    scorers = list(req.get("scorers") or ["noncontradiction"])
    responses = list(req["responses"])
    sampled_responses = [list(s) for s in req["sampled_responses"]]

    # Count uqlm's own NLI objects: none may be built on fastnli.
    built = {"uqlm_nli": 0}
    original_init = NLI.__init__

    @functools.wraps(original_init)  # keeps NLI's signature, which fastnli.patch_uqlm() checks
    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        built["uqlm_nli"] += 1
        original_init(self, *args, **kwargs)

    NLI.__init__ = counting_init  # type: ignore[method-assign]

    fastnli_kernels = fastnli_path = ""
    nli_class: Any = NLI
    fast_nli = None
    if backend != "uqlm":
        import fastnli
        import fastnli.kernels
        from fastnli.scorers.uqlm_adapter import FastNLI

        nli_class = FastNLI
        fastnli_kernels, fastnli_path = fastnli.kernels.IMPLEMENTATION, fastnli.__file__
        if backend == "patch":  # the one line; everything below is the same uqlm code as with nli="uqlm"
            fastnli.patch_uqlm(precision=precision)
        elif api == "consistency":
            fast_nli = FastNLI(checkpoint, device="cpu", precision=precision, max_length=max_length)
        else:
            fastnli.patch_uqlm(model=checkpoint, device="cpu", precision=precision)

    # Count what the NLI object really sends to the model (after uqlm's own caches and shortcuts).
    counter = {"pairs": 0, "calls": 0, "seconds": 0.0}
    original_predict_batch = nli_class.predict_batch

    def counting_predict_batch(self: Any, pairs: Any) -> Any:
        t = time.perf_counter()
        try:
            return original_predict_batch(self, pairs)
        finally:
            counter["seconds"] += time.perf_counter() - t
            counter["pairs"] += len(pairs)
            counter["calls"] += 1

    nli_class.predict_batch = counting_predict_batch

    llm = None
    if api == "generate_and_score":
        llm = _scripted_chat_model({str(p): list(a) for p, a in zip(prompts, req["llm_answers"])})
    with contextlib.redirect_stdout(sys.stderr):
        t0 = time.perf_counter()
        if api == "consistency":
            uq: Any = ConsistencyScorer(nli_model_name=checkpoint, max_length=max_length, use_best=use_best,
                                        scorers=scorers, device="cpu", nli=fast_nli, nli_batch_size=batch_size)
            nli = uq.nli
        elif api == "semantic_entropy":
            uq = SemanticEntropy(nli_model_name=checkpoint, device="cpu", use_best=use_best, max_length=max_length,
                                 nli_batch_size=batch_size)
            nli = uq.nli
        else:
            uq = BlackBoxUQ(llm=llm, scorers=scorers, nli_model_name=checkpoint, device="cpu", use_best=use_best,
                            nli_batch_size=batch_size, max_length=max_length)
            nli = next(o.nli for o in uq.scorer_objects.values() if hasattr(o, "nli"))
        load_seconds = time.perf_counter() - t0

        # One uncounted forward pass outside the timed call: torch's first call pays one-off initialisation
        # (hundreds of ms on CPU). predict_batch does not fill uqlm's NLI cache, so scores are unaffected.
        warmup_seconds = 0.0
        if req.get("warmup", True):
            first = responses[0] if responses else "warm up"
            other = sampled_responses[0][0] if responses and sampled_responses[0] else first
            t_w = time.perf_counter()
            original_predict_batch(nli, [(first, other), (other, first)])
            warmup_seconds = time.perf_counter() - t_w

        counter.update(pairs=0, calls=0, seconds=0.0)
        t1 = time.perf_counter()
        if api == "consistency":
            data = uq.evaluate(responses=responses, sampled_responses=sampled_responses)
        elif api == "semantic_entropy":
            data = uq.score(prompts=prompts, responses=responses, sampled_responses=sampled_responses,
                            show_progress_bars=False).data
            scorers = ["discrete_confidence_scores", "discrete_entropy_values", "num_semantic_sets"]
        elif api == "generate_and_score":
            data = asyncio.run(uq.generate_and_score(prompts=prompts, num_responses=len(req["llm_answers"][0]) - 1,
                                                     show_progress_bars=False)).data
        else:
            data = uq.score(responses=responses, sampled_responses=sampled_responses, show_progress_bars=False).data
        seconds = time.perf_counter() - t1

    out = {
        "scores": {s: [_finite_or_none(v) for v in data[s]] for s in scorers},
        "seconds": seconds,
        "load_seconds": load_seconds,
        "warmup_seconds": warmup_seconds,
        "num_nli_pairs": counter["pairs"],
        "nli_calls": counter["calls"],
        "nli_seconds": counter["seconds"],
        "responses": [str(r) for r in data.get("responses", responses)],
        "sampled_responses": [[str(x) for x in s] for s in data.get("sampled_responses", sampled_responses)],
        "uqlm_version": getattr(uqlm, "__version__", "unknown"),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "numpy_version": np.__version__,
        "torch_threads": torch.get_num_threads(),
        "nli": backend,
        "api": api,
        "nli_class": f"{type(nli).__module__}.{type(nli).__qualname__}",
        "uqlm_nli_built": built["uqlm_nli"],
        "fastnli_kernels": fastnli_kernels,
        "fastnli_path": fastnli_path,
        "llm_calls": list(llm._calls) if llm is not None else [],
    }
    if req.get("return_probabilities"):
        out["nli_probabilities"] = [[a, b, [float(x) for x in np.ravel(p)]] for (a, b), p in nli.probabilities.items()]
    with open(response_path, "w", encoding="utf-8") as f:
        json.dump(out, f, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
