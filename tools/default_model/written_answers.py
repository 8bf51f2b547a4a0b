"""Written answers: does NCP's pair score separate agreeing from disagreeing answers a person wrote?

The mission evaluation (``mission_eval``) generates its answer pairs from rules (value swaps, formats, aliases), so its
pairs share the rules' shapes. This check reads ``data/written_answers.jsonl``: questions written for fastnli (not
taken from any benchmark; released with the repository, Apache-2.0), each with three correct and three incorrect
answers in the forms people and LLMs give them (a bare value, a sentence, a sentence with more detail or a reason),
the incorrect ones plausible: near years, neighbouring places, the famous wrong person, common misconceptions.

Pairs: every two correct answers of a question agree (3 per question); every correct answer against every incorrect
one disagrees (9 per question); two incorrect answers are left out (they may or may not agree). Each pair is scored
as NCP scores a response against one sample, ``NCP(a, [b]) = 1 - (p_c(a, b) + p_c(b, a)) / 2``, through
:func:`fastnli.score` with the model's default inputs (units aligned where its manifest says so), bare and with the
question (``prompts``). Reported per form: the AUROC of that score, agreeing above disagreeing (the figure the
held-out check of real answers uses); the share of disagreeing pairs flagged (P(contradiction) > 0.5 in either
direction, read from the scores' matrix) and of agreeing pairs with NCP above 0.5; and the share of questions whose
correct response gets a lower NCP from two incorrect samples than from two correct ones.

    python -m tools.default_model.written_answers                  # the embedded default model
    python -m tools.default_model.written_answers --model DIR --json out.json
    python -m tools.default_model.written_answers --before DIR --write   # record in quality.json and the model card
    python -m tools.default_model.written_answers --fp32 DIR --write     # the model's own fp32 weights beside it

``--write`` replaces the figures it measures and keeps the recorded ones it does not (the model replaced, without
``--before``; the fp32 weights, without ``--fp32``).

``data/written_answers_heldout.jsonl`` holds 45 more questions of the same shape, written after stage 9 of the default
model was chosen and read by no rule that chooses a model, recipe or setting: the held-out check of these figures.
``ship`` and ``--write`` measure it beside the main set (the shipped model and the one it replaced) and record it as
``heldout``.

``ship`` records these figures for every model it ships, beside those of the model it replaces.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from itertools import combinations, product
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine import NLIEngine
from fastnli.scorers import score
from tools.default_model.mission_eval import auroc

DATA = Path(__file__).parent / "data" / "written_answers.jsonl"
#: questions no choosing rule reads (the module docstring)
HELDOUT = DATA.with_name("written_answers_heldout.jsonl")
FORMS = ("bare", "question")
#: the figures per input form and their names in tables, in the tables' order
FIGURES = {"agreement_auroc": "agreement AUROC", "disagreeing_flagged": "disagreeing pairs flagged",
           "agreeing_ncp_above_half": "agreeing pairs above 0.5",
           "wrong_samples_lower_ncp": "wrong samples lower NCP"}


def read_questions(path: Path = DATA) -> list[dict[str, Any]]:
    """The questions of ``path``: ``{"question": str, "correct": [str, ...], "incorrect": [str, ...]}`` per line."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def answer_pairs(questions: Sequence[dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    """``(question, a, b, agree)`` for every pair of correct answers (agree) and every correct x incorrect pair."""
    pairs = []
    for q in questions:
        pairs += [(q["question"], a, b, True) for a, b in combinations(q["correct"], 2)]
        pairs += [(q["question"], a, b, False) for a, b in product(q["correct"], q["incorrect"])]
    return pairs


def evaluate(questions: Sequence[dict[str, Any]], engine: NLIEngine | None = None,
             examples: int = 3, align_units: bool | None = None) -> dict[str, dict[str, Any]]:
    """The figures of the module docstring per input form (``bare``, ``question``), with the ``examples`` agreeing
    pairs of the lowest pair score and disagreeing pairs of the highest (``[a, b, score]``).

    ``align_units`` as :func:`fastnli.scorers.score` (default None: the model's manifest); a model not yet shipped
    has no manifest decision, so its figures need the decision passed here to compare with a shipped model's."""
    pairs = answer_pairs(questions)
    agree = np.array([p[3] for p in pairs])
    result: dict[str, dict[str, Any]] = {}
    for form in FORMS:
        prompts = [p[0] for p in pairs] if form == "question" else None
        res = score([p[1] for p in pairs], [[p[2]] for p in pairs], engine=engine, prompts=prompts,
                    return_matrix=True, question_aware=form == "question", align_units=align_units)
        ncp = np.array([r.noncontradiction for r in res])
        # a 2 x 2 matrix holds (c, n, e) of a -> b at [0, 1] and of b -> a at [1, 0]; 1 x 1 when a and b are one text
        flagged = np.array([r.matrix is not None and len(r.matrix) == 2 and max(r.matrix[0, 1, 0], r.matrix[1, 0, 0])
                            > 0.5 for r in res])
        # each question's first correct answer twice: against the other two correct ones, then two incorrect ones
        twice = score([q["correct"][0] for q in questions for _ in range(2)],
                      [s for q in questions for s in (q["correct"][1:], q["incorrect"][:2])], engine=engine,
                      prompts=[q["question"] for q in questions for _ in range(2)] if form == "question" else None,
                      question_aware=form == "question", align_units=align_units)
        by_question = np.array([r.noncontradiction for r in twice], dtype=float).reshape(-1, 2)
        lower = by_question[:, 1] < by_question[:, 0]
        result[form] = {"questions": len(questions), "agreeing_pairs": int(agree.sum()),
                        "disagreeing_pairs": int((~agree).sum()),
                        "agreement_auroc": round(auroc(ncp[agree], ncp[~agree]), 4),
                        "disagreeing_flagged": round(float(flagged[~agree].mean()), 4),
                        "agreeing_ncp_above_half": round(float((ncp[agree] > 0.5).mean()), 4),
                        "wrong_samples_lower_ncp": round(float(np.mean(lower)), 4),
                        "lowest_agreeing": [[pairs[i][1], pairs[i][2], round(float(ncp[i]), 3)]
                                            for i in np.flatnonzero(agree)[np.argsort(ncp[agree], kind="stable")]
                                            [:examples]],
                        "highest_disagreeing": [[pairs[i][1], pairs[i][2], round(float(ncp[i]), 3)]
                                                for i in np.flatnonzero(~agree)[np.argsort(-ncp[~agree],
                                                                                           kind="stable")][:examples]]}
    return result


def render(result: dict[str, dict[str, Any]]) -> str:
    lines = ["| inputs | questions | pairs (agree / disagree) | " + " | ".join(FIGURES.values()) + " |",
             "|---|---|---|" + "---|" * len(FIGURES)]
    for form, r in result.items():
        lines.append(f"| {form} | {r['questions']} | {r['agreeing_pairs']} / {r['disagreeing_pairs']} | "
                     + " | ".join(f"{r[k]:.3f}" for k in FIGURES) + " |")
    return "\n".join(lines)


#: the most agreement AUROC an INT8 graph may lose against its own fp32 weights on any input form before the ship
#: tool warns: the ship's INT8 agreement is measured on NLI text, and these are short answers with their question
INT8_AUROC_TOLERANCE = 0.01


def record(quality: dict[str, Any], now: dict[str, dict[str, Any]],
           before: dict[str, dict[str, Any]] | None = None, fp32: dict[str, dict[str, Any]] | None = None,
           heldout: dict[str, dict[str, dict[str, Any]]] | None = None) -> None:
    """Put the figures of the shipped model (``now``), of the one it replaced (``before``) and of the shipped
    model's own fp32 weights (``fp32``) in ``quality``; ``heldout`` holds the held-out questions' figures of the
    shipped model and of the one it replaced (``{"now": ..., "before": ...}``)."""
    quality["written_answers"] = {"now": now, **({"before": before} if before is not None else {}),
                                  **({"fp32": fp32} if fp32 is not None else {}),
                                  **({"heldout": heldout} if heldout is not None else {})}


def heldout_figures(engine: NLIEngine, before: NLIEngine | None = None,
                    align_units: bool | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """The held-out questions' figures (:data:`HELDOUT`) of ``engine`` (``now``, with ``align_units``) and of the
    model it replaced (``before``, with its own manifest's alignment)."""
    questions = read_questions(HELDOUT)
    return {"now": evaluate(questions, engine, align_units=align_units),
            **({"before": evaluate(questions, before)} if before is not None else {})}


def int8_losses(int8: dict[str, dict[str, Any]], fp32: dict[str, dict[str, Any]],
                tolerance: float = INT8_AUROC_TOLERANCE) -> list[str]:
    """The input forms whose agreement AUROC the INT8 graph loses by more than ``tolerance`` against fp32, as
    "form: fp32 → int8" lines (empty: the graph reads the written answers as its weights do)."""
    return [f"{form}: {fp32[form]['agreement_auroc']:.3f} → {int8[form]['agreement_auroc']:.3f}"
            for form in FORMS if fp32[form]["agreement_auroc"] - int8[form]["agreement_auroc"] > tolerance]


def warn_int8_losses(int8: dict[str, dict[str, Any]], fp32: dict[str, dict[str, Any]], advice: str = "") -> None:
    """Log a warning naming :func:`int8_losses`' forms, if any, followed by ``advice``."""
    if lost := int8_losses(int8, fp32):
        logging.getLogger("fastnli").warning(
            "the INT8 graph reads the written answers worse than its fp32 weights (agreement AUROC, %s)%s",
            "; ".join(lost), advice)


def main(argv: list[str] | None = None) -> int:
    from tools.default_model.ship import choice_parser, log_progress, record_shipped  # ship imports this module

    p = choice_parser(__doc__)
    p.add_argument("--before", type=Path, help="also measure the model it replaced (an artifact directory)")
    p.add_argument("--questions", type=Path, default=DATA)
    p.add_argument("--fp32", type=Path, help="also measure the model's own fp32 weights (an artifact directory "
                                             "with an fp32 graph), read with the model's unit alignment")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    log_progress()
    questions = read_questions(args.questions)
    engine = NLIEngine.from_pretrained(args.model, device="cpu")
    before_engine = None if args.before is None else NLIEngine.from_pretrained(args.before, device="cpu")
    now = evaluate(questions, engine)
    before = None if before_engine is None else evaluate(questions, before_engine)
    fp32 = None if args.fp32 is None else evaluate(
        questions, NLIEngine.from_pretrained(args.fp32, device="cpu", precision="fp32"),
        align_units=engine.manifest.align_units)
    if fp32 is not None:
        warn_int8_losses(now, fp32)
    if args.json:
        args.json.write_text(json.dumps({"now": now, "before": before, "fp32": fp32}, indent=2) + "\n",
                             encoding="utf-8")
    if args.write:
        quality = json.loads(args.quality.read_text())
        kept = quality.get("written_answers", {})
        heldout = heldout_figures(engine, before_engine)
        if before_engine is None and "before" in kept.get("heldout", {}):
            heldout["before"] = kept["heldout"]["before"]
        record(quality, now, before if before is not None else kept.get("before"),
               fp32 if fp32 is not None else kept.get("fp32"), heldout)
        record_shipped(args.model, args.quality, quality)
    sys.stdout.write(render(now) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
