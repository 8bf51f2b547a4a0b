"""Run uqlm's ``BlackBoxUQ.score`` on pre-generated responses: JSON in, JSON out.

This is a standalone script executed with the python of uqlm's own virtual environment (see
:func:`bench.uqlm_peer.ensure_uqlm_env`). It imports ``fastnli`` only with ``"nli": "fastnli"``, which
needs fastnli installed in that venv (``ensure_uqlm_env(with_fastnli=True)``).

Usage::

    python _uqlm_runner.py REQUEST.json RESPONSE.json

Request keys: ``checkpoint_dir`` (str), ``responses`` (list[str]), ``sampled_responses`` (list[list[str]]),
``scorers`` (list[str], default ``["noncontradiction"]``), ``use_best`` (bool, default false), ``batch_size``
(int, default 32), ``max_length`` (int, characters, default 2000 as in uqlm), ``torch_threads`` (int or null,
default null = torch's default), ``warmup`` (bool, default true: one uncounted, untimed ``predict_batch`` call on
two pairs before ``score()``), ``nli`` (``"uqlm"``, default: uqlm's ``NLI`` on ``checkpoint_dir``; ``"fastnli"``:
``fastnli.scorers.uqlm_adapter.FastNLI(checkpoint_dir, device="cpu", precision=fastnli_precision)``, with
``checkpoint_dir`` a fastnli export artifact), ``api`` (``"blackbox"``, default: ``BlackBoxUQ(...).score``, whose
``NLI`` is replaced by the FastNLI object with ``"nli": "fastnli"``; ``"consistency"``:
``ConsistencyScorer(nli=<NLI object>, scorers=..., use_best=...).evaluate``), ``fastnli_precision`` (str, default
``"fp32"``).

Response keys: ``scores`` ({scorer: [float or null]}, NaN/inf written as null), ``seconds`` (wall seconds of the
``score()`` call alone), ``load_seconds`` (wall seconds to build ``BlackBoxUQ``, i.e. load tokenizer and model),
``warmup_seconds`` (wall seconds of the warm-up call, 0 without one),
``num_nli_pairs`` (premise/hypothesis pairs passed to ``NLI.predict_batch`` during ``score()``), ``nli_calls``
(number of ``predict_batch`` calls), ``nli_seconds`` (wall seconds spent inside ``predict_batch``),
``responses`` / ``sampled_responses`` (as returned by uqlm: swapped for the best response when ``use_best`` applies),
``uqlm_version``, ``torch_version``, ``transformers_version``, ``numpy_version``, ``torch_threads``, ``nli``,
``api``, ``fastnli_kernels`` / ``fastnli_path`` (``fastnli.kernels.IMPLEMENTATION`` and ``fastnli.__file__`` with
``"nli": "fastnli"``, else empty).

Progress bars that uqlm draws even with ``show_progress_bars=False`` go to stderr, never to the response file.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from typing import Any


def _finite_or_none(x: Any) -> float | None:
    """Return ``x`` as a float, or ``None`` for NaN/inf/None (JSON has no NaN)."""
    if x is None:
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is ``[request_path, response_path]``. Returns the process exit code."""
    if len(argv) != 2:
        sys.stderr.write("usage: _uqlm_runner.py REQUEST.json RESPONSE.json\n")
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
    from uqlm import BlackBoxUQ
    from uqlm.black_box import ConsistencyScorer
    from uqlm.nli.nli import NLI

    backend = str(req.get("nli", "uqlm"))
    api = str(req.get("api", "blackbox"))
    if backend not in ("uqlm", "fastnli") or api not in ("blackbox", "consistency"):
        sys.stderr.write(f"unknown nli={backend!r} or api={api!r}\n")
        return 2
    max_length = int(req.get("max_length", 2000))
    batch_size = int(req.get("batch_size", 32))
    fastnli_kernels = fastnli_path = ""
    nli_class: Any = NLI
    if backend == "fastnli":
        import fastnli
        import fastnli.kernels
        from fastnli.scorers.uqlm_adapter import FastNLI

        nli_class = FastNLI
        fastnli_kernels, fastnli_path = fastnli.kernels.IMPLEMENTATION, fastnli.__file__

    def make_nli(**_ignored: Any) -> Any:
        """The NLI object: uqlm's own, or fastnli's drop-in (the one-line switch)."""
        if backend == "fastnli":
            precision = str(req.get("fastnli_precision", "fp32"))
            return FastNLI(str(req["checkpoint_dir"]), device="cpu", precision=precision, max_length=max_length)
        return NLI(
            nli_model_name=str(req["checkpoint_dir"]), device="cpu", max_length=max_length, batch_size=batch_size
        )

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

    scorers = list(req.get("scorers") or ["noncontradiction"])
    responses = list(req["responses"])
    sampled_responses = [list(s) for s in req["sampled_responses"]]

    use_best = bool(req.get("use_best", False))
    with contextlib.redirect_stdout(sys.stderr):
        t0 = time.perf_counter()
        if api == "consistency":
            consistency = ConsistencyScorer(nli=make_nli(), scorers=scorers, use_best=use_best)
            nli = consistency.nli
        else:
            if backend == "fastnli":
                # BlackBoxUQ builds its one shared NLI object from this module-level name.
                import uqlm.scorers.shortform.black_box as black_box_module

                black_box_module.NLI = make_nli  # type: ignore[attr-defined]
            bbuq = BlackBoxUQ(
                scorers=scorers,
                nli_model_name=str(req["checkpoint_dir"]),
                device="cpu",
                use_best=use_best,
                nli_batch_size=batch_size,
                max_length=max_length,
            )
            nli = next(o.nli for o in bbuq.scorer_objects.values() if hasattr(o, "nli"))
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
            data = consistency.evaluate(responses=responses, sampled_responses=sampled_responses)
        else:
            data = bbuq.score(responses=responses, sampled_responses=sampled_responses, show_progress_bars=False).data
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
        "fastnli_kernels": fastnli_kernels,
        "fastnli_path": fastnli_path,
    }
    with open(response_path, "w", encoding="utf-8") as f:
        json.dump(out, f, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
