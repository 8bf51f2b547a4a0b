"""A quick smoke of `python -m bench` on the tiny seeded checkpoint (the full run is the bench command itself)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.roofline import deberta_flops
from bench.run import ncp_from_pairs, uqlm_pairs
from bench.workloads import long_workload, short_workload
from fastnli.default_model import DEFAULT_MODEL_DIR
from fastnli.engine import read_manifest


def test_workloads_are_seeded_and_duplicated() -> None:
    a, b = short_workload(50, 5, seed=3), short_workload(50, 5, seed=3)
    assert a.responses == b.responses and a.sampled_responses == b.sampled_responses
    assert all(1 <= len(r.split()) <= 8 for r in a.responses)
    dup = sum(len(s) - len(set(s)) for s in a.sampled_responses) + sum(r in s for r, s in zip(a.responses,
                                                                                               a.sampled_responses))
    assert dup > 50  # heavy duplication, as real samples have
    assert all(2 <= r.count(".") <= 6 for r in long_workload(5, 2).responses)


def test_uqlm_pair_order_and_ncp_from_pairs() -> None:
    w = short_workload(5, 3, seed=1)
    pairs = uqlm_pairs(w)
    assert len(pairs) % 2 == 0 and all(pairs[i] == pairs[i + 1][::-1] for i in range(0, len(pairs), 2))
    import numpy as np

    probs = np.tile(np.array([[0.2, 0.3, 0.5]], np.float32), (len(pairs), 1))
    ncp = ncp_from_pairs(w, pairs, probs)
    for r, s, v in zip(w.responses, w.sampled_responses, ncp):
        expected = np.mean([1.0 if c == r else 0.8 for c in s])
        assert v == pytest.approx(expected, abs=1e-6)


def test_flop_count_of_deberta_large() -> None:
    cfg = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24}
    # 24 layers x 2 x (4 d^2 + 2 d ff) = 604 MFLOP per token from the linear layers alone.
    # Attention adds 12 d per token at length 1; the per-batch relative projections are not charged per sequence.
    assert deberta_flops(cfg, 1) == pytest.approx(24 * (2 * (4 * 1024**2 + 2 * 1024 * 4096) + 12 * 1024))
    assert deberta_flops(cfg, 128) > 128 * deberta_flops(cfg, 1) * 0.9


def test_int8_attention_recipe_quantizes_every_attention_product(art_v1: Path, tmp_path: Path) -> None:
    import onnx

    from bench.attention_profile import INT8_ATTENTION_RECIPE
    from fastnli.exporter.precision import to_int8

    fp32 = art_v1 / read_manifest(art_v1).precisions["fp32"].file
    ops = {}
    for name, recipe in (("default", None), ("attention", INT8_ATTENTION_RECIPE)):
        to_int8(fp32, tmp_path / f"{name}.onnx", recipe)
        ops[name] = [n.op_type for n in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node]
    fp32_products = ops["default"].count("MatMul")
    assert fp32_products == 2 * 4  # per layer of the tiny v1 checkpoint: QK^T, c2p, p2c and attention x V
    assert ops["attention"].count("MatMul") == 0
    assert ops["attention"].count("MatMulInteger") == ops["default"].count("MatMulInteger") + fp32_products


def test_attention_profile_of_the_fused_graph_shows_the_operator_instead_of_the_bands(art_v1: Path) -> None:
    from bench.attention_profile import profile_graph

    m = read_manifest(art_v1)
    graph = art_v1 / m.precisions["int8"].file
    plain = profile_graph(graph, 4, 40, 100, m.inputs, runs=1)
    fused = profile_graph(graph, 4, 40, 100, m.inputs, runs=1, fused=True)
    assert fused["DisentangledAttention"] > 0 and "DisentangledAttention" not in plain and plain["Slice"] > 0


@pytest.mark.uqlm
def test_bench_quick_writes_table_json_and_plots(ckpt_v1: Path, art_v1: Path, tmp_path: Path) -> None:
    from bench.__main__ import main

    out = tmp_path / "bench"
    assert main(["--quick", "--checkpoint", str(ckpt_v1), "--artifact", str(art_v1), "--out",
                 str(out), "--install-uqlm"]) == 0
    report = json.loads((out / "bench.json").read_text())
    backends = {(r["workload"], r["backend"]) for r in report["rows"]}
    assert ("short", "uqlm") in backends and ("short", "fastnli-int8-cpu") in backends
    assert ("long", "pytorch-fp32-b32") in backends and ("long", "fastnli-fp32-cpu") in backends
    assert ("short", "fastnli-int8-plain-cpu") in backends  # the INT8 graph without the fused attention
    delta = {(r["workload"], r["backend"]): r["ncp_max_abs_delta"] for r in report["rows"]}
    for workload in ("short", "long"):  # fused or not, the same NCP to float rounding
        assert abs(delta[(workload, "fastnli-int8-cpu")] - delta[(workload, "fastnli-int8-plain-cpu")]) <= 1e-4
    for r in report["rows"]:
        if r["backend"] in ("fastnli-fp32-cpu", "pytorch-fp32-b32"):
            assert r["ncp_max_abs_delta"] <= 1e-4  # fp32 parity with uqlm on the same checkpoint
        assert r["seconds"] > 0 and r["pairs"] > 0
    assert report["peaks_gflops"]["fp32"] > 0 and report["peaks_gflops"]["int8"] > 0
    for png in ("throughput_vs_budget.png", "latency_vs_length.png", "roofline.png", "speedup.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| workload | backend |" in (out / "bench.md").read_text()


def test_serve_abuse_bodies_stay_within_the_goal_sizes() -> None:
    """The hostile set of bench/serve_abuse.py: every body is at most 2 MB (the goal's bound) but the one that tests
    the body limit, which must be over it."""
    from bench.serve_abuse import _hostile_cases, pct

    sizes = {name: len(body) for name, body, _, _ in _hostile_cases()}
    assert sizes.pop("3 MB body") > 2_000_000
    assert max(sizes.values()) <= 2_000_000 and min(sizes.values()) > 0  # the default max_body_bytes
    assert [pct([3.0, 1.0, 2.0], q) for q in (0.0, 0.5, 0.99)] == [1.0, 2.0, 3.0]


def test_gpu_check_dry_run_says_no_gpu_and_measures_every_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from bench import gpu_check
    from fastnli.engine.session import gpu_present

    if not gpu_present():  # the detection itself, on a machine without a GPU (CI)
        assert gpu_check.gpu_status() == (False, "no NVIDIA GPU device is present on this machine")
    monkeypatch.setattr(gpu_check, "gpu_status", lambda: (False, "no NVIDIA GPU device is present on this machine"))
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert shown.startswith("NO GPU PRESENT (no NVIDIA GPU device is present on this machine): this is a DRY RUN on "
                            "the CPU with the tiny checkpoint")
    assert "say nothing about a GPU" in shown
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert (report["gpu"], report["dry_run"], report["device"]) == (False, True, "cpu")
    assert report["reason"] == "dry run on the CPU: no NVIDIA GPU device is present on this machine"
    assert [s["stage"] for s in report["export_stages"]] == [  # the graphs a GPU runs: fp32 + FP16, no INT8
        "checkpoint hash", "fp32 graph (optimum)", "tokenizer", "fp16 graph", "hashes + manifest"]
    rows = {(r["workload"], r["backend"]): r for r in report["rows"]}
    for w in ("short", "long"):
        for b in ("pytorch-fp32-b32", "pytorch-fp16-b32", "fastnli-fp32", "fastnli-fp16", "fastnli-fp16-iobinding"):
            r = rows[(w, b)]
            assert r["pairs_per_s"] > 0 and r["argmax_agreement"] == 1.0, (w, b)
        assert rows[(w, "fastnli-fp32")]["max_abs_dprob"] <= 1e-4  # fp32 parity with PyTorch
        assert rows[(w, "fastnli-fp16")]["max_abs_dprob"] <= 2e-2
        # IO binding runs the same graph on the same batches: the engine's FP16 probabilities, bit for bit
        assert rows[(w, "fastnli-fp16-iobinding")]["max_abs_dprob"] == rows[(w, "fastnli-fp16")]["max_abs_dprob"]
        assert rows[(w, "fastnli-fp16-cudagraph")]["note"] == "skipped: needs the CUDA provider"
        assert rows[(w, "pytorch-fp16-b32")]["vs_torch_fp16"] == 1.0
    assert set(report["latency_512_ms"]) == {"fastnli-fp16", "fastnli-fp16-iobinding", "pytorch-fp16"}
    assert report["machine"]["latency_pair_tokens"] == 512
    assert gpu_check.main(["--require-gpu", "--out", str(tmp_path / "none")]) == 2
    assert "--require-gpu was given, so nothing ran" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()


def test_gpu_check_buckets() -> None:
    from bench.gpu_check import BUCKETS, BoundRunner

    assert [BoundRunner.bucket(n) for n in (1, 32, 33, 200, 512, 600)] == [32, 32, 64, 256, 512, BUCKETS[-1]]


def test_long_premise_reports_support_found_and_false_support(tmp_path: Path) -> None:
    """bench.long_premise at a small size with the embedded model: every mode and depth has its accuracy, the share
    of entailed hypotheses found supported and the false support of the same documents without their premise."""
    from conftest import SHARED_DATA

    from bench import long_premise

    assert long_premise.main(["--data", str(SHARED_DATA), "--pairs", "6", "--depths", "0,600", "--queries", "1",
                              "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "long_premise.json").read_text())["needle"]
    assert {(r["mode"], r["depth"]) for r in rows} == {("alone", 0)} | {
        (m, d) for m in ("truncate", "chunk/full", "chunk") for d in (0, 600)}
    meta = json.loads((tmp_path / "long_premise.json").read_text())["meta"]
    assert meta["window_policy"] == read_manifest(DEFAULT_MODEL_DIR).window_policy  # chunk: the model's own policy
    for r in rows:
        assert 0.0 <= r["support_found"] <= 1.0 and 0.0 <= r["accuracy"] <= 1.0
        assert (r["false_support"] is None) == (r["mode"] == "alone")
        assert r["false_support"] is None or 0.0 <= r["false_support"] <= 1.0
    assert "| depth (tokens) | truncate found | truncate false |" in (tmp_path / "long_premise.md").read_text()


def test_batch_split_compares_overheads_with_equal_probabilities(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """bench.batch_split at a small size with the embedded model: each workload has a cell per overhead, the split
    pads less than full batches, and the probabilities do not move."""
    from conftest import SHARED_DATA

    from bench import batch_split

    out = tmp_path / "split.json"
    assert batch_split.main(["--data", str(SHARED_DATA), "--overheads", "0,32", "--repeats", "1", "--snli", "40",
                             "--mnli", "20", "--prompts", "6", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"bench short NCP", "bench mixed NCP", "bench long NCP", "snli/dev", "mnli/dev_matched"}
    for r in results.values():
        full, split = r["cells"]["0"], r["cells"]["32"]
        assert r["max_abs_delta"] <= 1e-6 and full["speedup"] == 1.0
        assert split["padding_efficiency"] >= full["padding_efficiency"] and split["batches"] >= full["batches"]
    assert "| workload (unique pairs) | overhead 0 | overhead 32 |" in capsys.readouterr().out


def test_needle_windows_groups_sentences_and_merges_two_readings_group_by_group() -> None:
    from bench.needle_windows import sentence_groups, union

    pairs, starts = sentence_groups(["A dog runs. It is wet.", "Rain."], ["h1", "h2"])
    assert pairs == [("A dog runs.", "h1"), ("It is wet.", "h1"), ("Rain.", "h2")] and starts.tolist() == [0, 2, 3]
    a, b = np.arange(3.0)[:, None], np.arange(10.0, 13.0)[:, None]
    rows, merged = union(a, np.array([0, 1, 3]), b, np.array([0, 2, 3]))
    assert rows[:, 0].tolist() == [0.0, 10.0, 11.0, 1.0, 2.0, 12.0] and merged.tolist() == [0, 3, 6]


def test_needle_windows_confirmed_reading_needs_a_window_and_one_of_its_sentences_over_their_bars() -> None:
    from bench.needle_windows import confirmed_labels

    probs = np.array([[0.1, 0.3, 0.6], [0.9, 0.1, 0.0],  # supported: entailment whatever the rest says
                      [0.85, 0.1, 0.05], [0.1, 0.8, 0.1],  # contradicting window under the bar, sentence over it
                      [0.85, 0.1, 0.05], [0.1, 0.8, 0.1],  # the same window, its sentences under the sentence bar
                      [0.3, 0.6, 0.1]])  # a window under the confirm bar
    starts = np.array([0, 2, 4, 6, 7])
    confirm = np.array([[[0.9, 0.99]], [[0.85, 0.96]], [[0.85, 0.6]], [[0.3, 0.99]]])
    got = confirmed_labels(probs, starts, confirm, 0.5, 0.95, 0.8, 0.9, 1)
    assert got.tolist() == [2, 0, 1, 1]
    assert confirmed_labels(probs, starts, confirm, 0.5, 0.95, 0.8, 0.5, 1).tolist() == [2, 0, 0, 1]
    assert confirmed_labels(probs, starts, confirm, 0.5, 0.8, 0.99, 0.99, 1).tolist() == [2, 0, 0, 1]  # the bar
    assert confirmed_labels(probs, starts, confirm, 0.5, None, 0.2, 0.9, 1).tolist() == [2, 0, 1, 0]


def test_operator_speed_checks_each_shape_against_numpy_and_names_a_bad_shape() -> None:
    import argparse

    from bench.operator_speed import _shapes, measure, padded_inputs
    from fastnli.engine import fused_attention as fa

    if fa.library() is None:
        pytest.skip("no vector kernel for the operator on this CPU")
    rows = measure([(2, 20), (1, 40)], threads=1, repeats=1, seconds=0.01)
    assert [(r["pairs"], r["positions"]) for r in rows] == [(2, 20), (1, 40)]
    assert all(r["ms"] > 0 and r["gflops"] > 0 for r in rows)
    masked = padded_inputs(3, 10)["masked"]  # padding: each pair keeps its first n positions, n in [5, 10]
    assert masked.shape == (3, 1, 10, 10)
    for pair in masked[:, 0]:
        kept = np.arange(10) < (~pair[0]).sum()
        assert 5 <= kept.sum() <= 10 and (pair == ~(kept[:, None] & kept[None, :])).all()
    with pytest.raises(argparse.ArgumentTypeError, match=r"--shapes takes PAIRSxPOSITIONS,\.\.\. .* not '2x'"):
        _shapes("2x")


def test_needle_windows_reads_windows_alone_under_every_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--readings windows``: only the windows' candidates (every support bar x contradiction bar x fallback), and
    the policy's candidate is the per-label figure averaged (one pair per label)."""
    from conftest import SHARED_DATA

    from bench import needle_windows as nw
    from fastnli.engine.windows import FALLBACKS

    monkeypatch.setattr(nw, "DEPTHS", (0, 500))
    out = nw.measure(DEFAULT_MODEL_DIR, SHARED_DATA, "dev", 3, seed=7, kind="windows")
    cands = out["candidates"]
    assert {c["reading"] for c in cands} == {"windows"}
    assert len(cands) == len(nw.SUPPORT_BARS) * len(nw.CONTRADICTION_BARS) * len(FALLBACKS)
    policy = out["policy"]
    mine = next(c for c in cands if (c["support_bar"], c["contradiction_bar"], c["fallback"])
                == (policy["support_bar"], policy["contradiction_bar"], policy["fallback"]))
    for depth, accuracy in zip(out["depths"], mine["accuracy"]):
        assert accuracy == pytest.approx(np.mean(out["policy_accuracy_by_label"][str(depth)]))
    with pytest.raises(ValueError, match="kind must be 'all', 'windows' or 'confirmed', not 'every'"):
        nw.measure(DEFAULT_MODEL_DIR, SHARED_DATA, "dev", 3, seed=7, kind="every")
