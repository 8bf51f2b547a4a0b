"""Dev figures of candidate checkpoints beside their base: the table a stage's choice rule reads, in one command.

Each ``NAME=CHECKPOINT`` (a HF checkpoint directory; the first is the base the others are compared with) is exported
to an fp32 graph under ``--out`` that reads its inputs as a shipped model does (the ``window_policy``,
``align_units`` and ``question_format`` of ``--reading-from``, by default the embedded default model), then measured
on dev data only:

- ``nli``: accuracy on snli/dev and lingnli/val;
- ``written``: the main written-answer set (``written_answers.DATA``; never the held-out questions), per input form:
  agreement AUROC, disagreeing pairs flagged, agreeing pairs above 0.5;
- ``mission``: the dev part of ``answer_data`` (``--rows``), units read as the reading model does: per input form
  value swaps flagged, flagged both ways and meaning kept both ways, and the place groups (another city flagged,
  flagged both ways; the city in other words kept; the stated city one way); per filler length of the long premises,
  entailment and neutral kept and false entailment;
- ``documents`` (with ``--documents``: about 3 more minutes per candidate on 2 cores): the dev score of
  ``contradiction_choice`` for the reading model's fallback and contradiction bar.

Writes ``candidates.json`` (every figure) and ``candidates.md`` (a table: each candidate's figure and its difference
from the base). A graph already under ``--out`` is reused when it was exported from the same checkpoint (its
manifest's ``source_hash``), and so are its figures in ``candidates.json`` when they were measured on the same rows,
data, reading settings and ``--documents``.

    python -m tools.default_model.candidates --rows /tmp/a/dev.jsonl --out /tmp/cmp \\
        base=/tmp/stage8 mix=/tmp/mix tuned=/tmp/tuned [--documents]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from fastnli.engine import NLIEngine
from fastnli.engine.manifest import MANIFEST_NAME, checkpoint_hash
from tools.default_model import contradiction_choice, mission_eval, ship, written_answers
from tools.default_model.answer_data import read_jsonl

logger = logging.getLogger("fastnli")
#: the manifest fields that decide how a shipped model reads its inputs, copied to every candidate's graph
READING = ("window_policy", "align_units", "question_format")
NLI_SPLITS = ("snli/dev", "lingnli/val")
WRITTEN = ("agreement_auroc", "disagreeing_flagged", "agreeing_ncp_above_half")
MISSION = tuple(k for k in mission_eval.GROUP_FIGURES if k != "agreement_auroc")  # every group figure but the AUROC
LONG = ("entailment_kept", "neutral_kept", "false_entailment")


def read_like(artifact: Path, reading_from: Path) -> dict[str, Any]:
    """Give ``artifact``'s manifest the :data:`READING` fields of ``reading_from``'s (those it has); returns them."""
    shipped = json.loads((reading_from / MANIFEST_NAME).read_text(encoding="utf-8"))
    settings = {k: shipped[k] for k in READING if k in shipped}
    path = artifact / MANIFEST_NAME
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **settings}, indent=1) + "\n",
                    encoding="utf-8")
    return settings


def figures(artifact: Path, rows: list[dict[str, Any]], data: Path, documents: bool) -> dict[str, float]:
    """The figures of the module docstring of one fp32 ``artifact``, as ``{"section: name": value}``."""
    engine = NLIEngine(artifact, device="cpu", precision="fp32")
    out: dict[str, float] = {}
    for split, split_rows in ship.load_splits(data, NLI_SPLITS).items():
        out[f"nli: {split}"] = ship.evaluate(engine, split_rows)[0]
    written = written_answers.evaluate(written_answers.read_questions(), engine)
    out.update({f"written: {name} {form}": float(r[name]) for form, r in written.items() for name in WRITTEN})
    mission = mission_eval.evaluate(rows, mission_eval.row_probs(engine.predict, rows,
                                                                 bool(engine.manifest.align_units)))
    out.update({f"mission: {name} {form}": float(g[name]) for form, g in mission["groups"].items()
                for name in MISSION if name in g})
    out.update({f"long: {name} {words}": float(e[name]) for words, e in mission["long"].items()
                for name in LONG if name in e})
    if documents:
        policy = engine.window_planner.policy
        table = contradiction_choice.measure(artifact, "dev", 90, contradiction_choice.DEPTHS, 7, data)
        out["documents: contradiction_choice dev score"] = contradiction_choice.score(
            table, policy.contradiction_threshold, policy.fallback)
    return out


def reusable_figures(earlier: dict[str, Any], record: dict[str, Any], name: str) -> dict[str, float] | None:
    """``name``'s figures in an earlier ``candidates.json`` (``earlier``) when that run measured the same checkpoint
    (:func:`~fastnli.engine.manifest.checkpoint_hash`) on the same rows, data, reading settings and ``--documents`` as
    this one (``record``); else None."""
    same = all(earlier.get(k) == record.get(k) for k in ("rows", "documents", "data", "reading"))
    source = earlier.get("source_hash", {}).get(name)
    if not same or source is None or source != record["source_hash"][name]:
        return None
    known: dict[str, float] | None = earlier.get("figures", {}).get(name)
    return known


def render(results: dict[str, dict[str, float]], base: str) -> str:
    """A markdown table: a row per figure, a column per candidate (``value (difference from the base)``)."""
    names = list(results)
    keys = list(dict.fromkeys(k for r in results.values() for k in r))
    lines = ["| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in keys:
        cells = []
        for name in names:
            value, ref = results[name].get(key), results[base].get(key)
            cell = "n/a" if value is None else f"{value:.4f}"
            if name != base and value is not None and ref is not None:
                cell += f" ({value - ref:+.4f})"
            cells.append(cell)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+", metavar="NAME=CHECKPOINT", help="the base first, then the candidates")
    p.add_argument("--rows", type=Path, required=True, help="the dev.jsonl of answer_data.py (never its test part)")
    p.add_argument("--out", type=Path, required=True, help="a directory for the graphs and the results")
    p.add_argument("--data", type=Path, default=ship.REPO.parent / "shared" / "nli-data")
    p.add_argument("--reading-from", type=Path, default=ship.REPO / "fastnli" / "models" / "default",
                   help="the shipped model whose reading settings the candidates take (default: the embedded one)")
    p.add_argument("--documents", action="store_true", help="also score documents read in windows (slow)")
    args = p.parse_args(argv)
    pairs = [spec.partition("=") for spec in args.checkpoints]
    if any(not name or not sep or not path for name, sep, path in pairs) or len({n for n, _, _ in pairs}) < len(pairs):
        p.error("give each checkpoint as NAME=CHECKPOINT, with names that differ")
    if args.rows.name.startswith("test"):
        p.error(f"--rows {args.rows}: candidates are compared on the dev part; the test part is never used to choose")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from fastnli.exporter import export

    rows = read_jsonl(args.rows)
    results: dict[str, dict[str, float]] = {}
    record: dict[str, Any] = {"base": pairs[0][0], "rows": str(args.rows), "documents": args.documents,
                              "data": str(args.data), "checkpoints": {name: path for name, _, path in pairs},
                              "source_hash": {name: checkpoint_hash(path) for name, _, path in pairs}}
    earlier = args.out / "candidates.json"
    earlier_record = json.loads(earlier.read_text(encoding="utf-8")) if earlier.is_file() else {}
    for name, _, path in pairs:
        artifact, manifest = args.out / name, args.out / name / MANIFEST_NAME
        if manifest.is_file() and json.loads(manifest.read_text()).get("source_hash") == record["source_hash"][name]:
            logger.info("%s: reusing the graph in %s", name, artifact)
        else:
            export(Path(path), artifact, precisions=("fp32",))
        record["reading"] = read_like(artifact, args.reading_from)
        if (known := reusable_figures(earlier_record, record, name)) is not None:
            logger.info("%s: reusing its figures in %s", name, earlier)
            results[name] = known
        else:
            results[name] = figures(artifact, rows, args.data, args.documents)
        logger.info("%s: %s", name, json.dumps(results[name]))
        (args.out / "candidates.json").write_text(json.dumps({**record, "figures": results}, indent=1) + "\n",
                                                  encoding="utf-8")
    table = render(results, pairs[0][0])
    (args.out / "candidates.md").write_text(table + "\n", encoding="utf-8")
    sys.stdout.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
