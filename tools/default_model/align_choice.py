"""Choose whether the scorers and checks align units for the default model (its manifest's ``align_units``).

    python -m tools.default_model.align_choice [--model fastnli/models/default] [--write]

A 6-layer model compares "569 kilometres" and "354 miles" by their digits: it cannot tell a right conversion from a
wrong one. :func:`fastnli.scorers.units.align_units` writes the hypothesis's quantities in the premise's units first,
which turns the pair into a number comparison. Whether that is the model's default is measured on the mission
evaluation (``tools/default_model/mission_eval.py`` on the rows of ``answer_data.build`` with its default
arguments, as ``ship.py`` and the CI gate use them), by :data:`RULE`, on the ``dev`` part; the ``test`` part is
reported only.

``ship.py`` runs :func:`measure` for every shipped model; this command measures an already-shipped model and, with
``--write``, records the decision in ``quality.json`` (``align_units``, and the CI gate's aligned figures
``mission_gate.int8_aligned``), sets the manifest's ``align_units`` and re-renders the model card.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from fastnli.engine import NLIEngine
from tools.default_model import answer_data, mission_eval
from tools.default_model.ship import (
    MISSION_GATE_EVERY,
    choice_parser,
    log_progress,
    logger,
    mission_probs,
    record_shipped,
)

#: the categories whose pairs state one quantity in two units
UNIT_CATEGORIES = ("unit_equivalent", "unit_swap")
RULE = (f"units aligned by default when, on the dev part, the unit categories ({', '.join(UNIT_CATEGORIES)}) score "
        "higher on average and no form's value swaps flagged, meaning kept or agreement AUROC is lower")


def decide(dev: dict[str, Any], dev_aligned: dict[str, Any], test_aligned: dict[str, Any]) -> dict[str, Any]:
    """The decision by :data:`RULE` from the dev part's evaluations as written and aligned; ``test_aligned`` is
    recorded for the report."""
    def units(r: dict[str, Any]) -> float:
        return float(np.mean([r["categories"][c]["value"] for c in UNIT_CATEGORIES]))

    lower = [f"{form} {key}" for form, g in dev["groups"].items() for key, v in g.items()
             if dev_aligned["groups"][form][key] < v - 1e-9]
    use = units(dev_aligned) > units(dev) and not lower
    return {"default": bool(use), "rule": RULE, "dev": {"plain": units(dev), "aligned": units(dev_aligned),
                                                        "lower": lower},
            "test_aligned": {"categories": {c: test_aligned["categories"][c] for c in UNIT_CATEGORIES},
                             "groups": test_aligned["groups"]}}


def measure(engine: NLIEngine, parts: dict[str, list[dict[str, Any]]], plain: dict[str, np.ndarray]
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(decision, gate)``: :func:`decide` from ``engine`` on the mission rows ``parts`` (``dev``, ``test``) read
    aligned against their probabilities as written (``plain``, per part; reused where alignment changes nothing);
    ``gate``: the aligned figures of the CI gate's slice of the test part."""
    probs = {p: mission_probs(engine, rows, aligned=True, plain=plain[p]) for p, rows in parts.items()}
    aligned = {p: mission_eval.evaluate(parts[p], probs[p]) for p in parts}
    gate = mission_eval.gate_indices(parts["test"], MISSION_GATE_EVERY)
    gate_groups = mission_eval.evaluate([parts["test"][i] for i in gate], probs["test"][gate])["groups"]
    dev_plain = mission_eval.evaluate(parts["dev"], plain["dev"])
    return decide(dev_plain, aligned["dev"], aligned["test"]), gate_groups


def record(quality: dict[str, Any], decision: dict[str, Any], gate: dict[str, Any]) -> None:
    """Put the decision in ``quality`` (and the gate's aligned figures when units are aligned by default)."""
    quality["align_units"] = decision
    quality["mission_gate"].pop("int8_aligned", None)
    if decision["default"]:  # the CI gate then checks what the scorers compute by default too
        quality["mission_gate"]["int8_aligned"] = gate


def main(argv: list[str] | None = None) -> int:
    args = choice_parser(__doc__).parse_args(argv)
    log_progress()

    built = answer_data.build(args.data)
    parts = {p: built[p] for p in ("dev", "test")}
    engine = NLIEngine.from_pretrained(args.model, device="cpu")
    plain = {p: mission_probs(engine, rows) for p, rows in parts.items()}
    decision, gate = measure(engine, parts, plain)
    sys.stdout.write(json.dumps(decision, indent=1) + "\n")
    if args.write:
        quality = json.loads(args.quality.read_text())
        record(quality, decision, gate)
        path = record_shipped(args.model, args.quality, quality, {"align_units": decision["default"]})
        logger.info("recorded align_units=%s in %s, %s and the model card", decision["default"], args.quality, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
