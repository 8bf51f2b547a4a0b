"""The training tool (tools/default_model/train.py): its loss terms, checked against their formulas written out, and its
teacher options."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA

torch = pytest.importorskip("torch")



@pytest.fixture(scope="module")
def tool():  # type: ignore[no-untyped-def]
    from tools.default_model import train

    return train


def _kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def _softmax(z: list[float]) -> list[float]:
    e = [math.exp(v - max(z)) for v in z]
    return [v / sum(e) for v in e]


def test_rdrop_loss_is_cross_entropy_plus_half_the_symmetric_kl(tool) -> None:  # type: ignore[no-untyped-def]
    first = [[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]]
    second = [[1.0, 0.0, 0.0], [-0.5, 1.5, 0.3]]
    labels = [0, 2]
    logits = torch.tensor(first + second, dtype=torch.float64)
    got = float(tool.rdrop_loss(logits, torch.tensor(labels), alpha=0.7, label_smoothing=0.0))
    ce = [-math.log(_softmax(row)[y]) for row, y in zip(first + second, labels + labels)]
    kl = [_kl(_softmax(a), _softmax(b)) + _kl(_softmax(b), _softmax(a)) for a, b in zip(first, second)]
    want = sum(ce) / len(ce) + 0.7 * (sum(kl) / len(kl)) / 2
    assert got == pytest.approx(want, rel=1e-12)


def test_rdrop_loss_of_identical_passes_is_the_plain_loss(tool) -> None:  # type: ignore[no-untyped-def]
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]], dtype=torch.float64)
    labels = torch.tensor([1, 0])
    plain = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.05)
    got = tool.rdrop_loss(torch.cat([logits, logits]), labels, alpha=5.0, label_smoothing=0.05)
    assert float(got) == pytest.approx(float(plain), rel=1e-12)


def test_distillation_loss_is_t_squared_kl_teacher_to_student(tool) -> None:  # type: ignore[no-untyped-def]
    student, teacher, t = [[0.3, -0.2, 1.0]], [[1.2, 0.1, -0.4]], 2.0
    got = float(tool.distillation_loss(torch.tensor(student, dtype=torch.float64),
                                       torch.tensor(teacher, dtype=torch.float64), t))
    want = t * t * _kl(_softmax([v / t for v in teacher[0]]), _softmax([v / t for v in student[0]]))
    assert got == pytest.approx(want, rel=1e-12)


def test_distillation_from_log_probabilities_equals_distillation_from_logits(tool) -> None:  # type: ignore[no-untyped-def]
    # --teacher-engine hands the loss log-probabilities: they differ from logits by a per-row constant, which the
    # tempered softmax removes, so the loss must be the same
    student = torch.tensor([[0.3, -0.2, 1.0], [2.0, 0.0, -1.0]], dtype=torch.float64)
    teacher = torch.tensor([[1.2, 0.1, -0.4], [-3.0, 0.5, 0.5]], dtype=torch.float64)
    from_logits = tool.distillation_loss(student, teacher, 2.0)
    from_logp = tool.distillation_loss(student, torch.log_softmax(teacher, -1), 2.0)
    assert float(from_logp) == pytest.approx(float(from_logits), rel=1e-12)


def test_mixed_distillation_distils_only_rows_with_a_teacher(tool) -> None:  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    student, labels = torch.randn(6, 3), torch.randint(0, 3, (6,))
    teacher = torch.log_softmax(torch.randn(6, 3), -1)
    every = tool.mixed_distillation_loss(student, labels, teacher, 0.5, 2.0, 0.05)
    plain = 0.5 * torch.nn.functional.cross_entropy(student, labels, label_smoothing=0.05) + 0.5 * \
        tool.distillation_loss(student, teacher, 2.0)
    assert float(every) == pytest.approx(float(plain), rel=1e-6)
    teacher[:3] = float("nan")  # generated rows: cross-entropy alone
    ce = torch.nn.functional.cross_entropy(student, labels, label_smoothing=0.05, reduction="none")
    kd = torch.stack([tool.distillation_loss(student[i:i + 1], teacher[i:i + 1], 2.0) for i in range(3, 6)])
    expected = torch.cat([ce[:3], 0.5 * ce[3:] + 0.5 * kd]).mean()
    assert float(tool.mixed_distillation_loss(student, labels, teacher, 0.5, 2.0, 0.05)) == pytest.approx(
        float(expected), rel=1e-6)


def test_engine_teacher_gives_the_engines_log_probabilities_in_input_order(tool) -> None:  # type: ignore[no-untyped-def]
    from fastnli.engine import NLIEngine

    rows = [
        {"premise": "A man is playing a guitar on stage.", "hypothesis": "A man is performing music.",
         "label": "entailment", "source": "snli/train"},
        {"premise": "A dog runs through the snow.", "hypothesis": "A cat sleeps on a sofa.",
         "label": "contradiction", "source": "snli/train"},
        {"premise": "Two women are talking in a cafe.", "hypothesis": "The women are sisters.",
         "label": "neutral", "source": "snli/train"},
    ]
    split = tool.make_split("train", rows)
    logp, record = tool.engine_teacher_logprobs("default", split)
    want = NLIEngine.from_pretrained(device="cpu").predict(list(zip(split.premises, split.hypotheses)))
    assert logp.shape == (3, 3) and logp.dtype == np.float32
    np.testing.assert_allclose(np.exp(logp), want, atol=1e-6)
    assert record["engine"] == "default"
    # the record says which model taught and how that model was made (the shipped model's quality.json)
    from fastnli.default_model import DEFAULT_MODEL_DIR

    quality = json.loads(tool.DEFAULT_MODEL_QUALITY.read_text())
    assert record["artifact_hash"] == json.loads((DEFAULT_MODEL_DIR / "manifest.json").read_text())["artifact_hash"]
    assert record["lineage"]["command"] == quality["training"]["command"]
    assert record["lineage"]["accuracy"] == quality["accuracy"]
    assert record["lineage"]["artifact_hash"] == record["artifact_hash"]
    assert record["train_accuracy"] == pytest.approx(float((want.argmax(1) == split.labels).mean()))


def test_a_teacher_exported_from_a_checkpoint_of_this_tool_has_its_training_as_lineage(tool, ckpt_bert, art_bert,  # type: ignore[no-untyped-def]
                                                                                       tmp_path) -> None:
    import shutil

    ckpt, art = tmp_path / "teacher", tmp_path / "teacher-onnx"
    shutil.copytree(ckpt_bert, ckpt)
    shutil.copytree(art_bert, art)
    manifest = json.loads((art / "manifest.json").read_text())
    (art / "manifest.json").write_text(json.dumps({**manifest, "source": str(ckpt)}))
    assert tool.teacher_lineage(art) is None  # no training log beside the checkpoint
    log = {"command": ["train.py", "--lr", "3e-5"], "base_model": {"model_safetensors_sha256": "e" * 64},
           "best": {"full": {"snli/dev": 0.88, "lingnli/val": 0.72}}}
    (ckpt / tool.TRAINING_LOG).write_text(json.dumps(log))
    assert tool.teacher_lineage(art) == {
        "artifact_hash": manifest["artifact_hash"], "precisions": ["fp32", "int8"], "command": log["command"],
        "base_model": log["base_model"], "accuracy": {"snli/dev": {"fp32": 0.88}, "lingnli/val": {"fp32": 0.72}},
        "teacher": None}
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text().replace("}", ', "x": 1}', 1))
    assert tool.teacher_lineage(art) is None  # the checkpoint changed since the export: its log is not the teacher's


def test_base_weights_are_named_by_their_hash(tool) -> None:  # type: ignore[no-untyped-def]
    from tools.default_model import backbone

    assert tool.base_weights_record(backbone.WEIGHTS_SHA256)["weights"] == (
        "sentence-transformers/all-mpnet-base-v2 (Apache-2.0)")
    assert tool.base_weights_record("0" * 64) == {"package": tool.BASE_PACKAGE, "model_safetensors_sha256": "0" * 64,
                                                  "weights": "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0)"}


def test_teacher_and_teacher_engine_are_exclusive(tool, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        tool.parse_args(["--base", str(tmp_path), "--out", "x", "--teacher", "ckpt", "--teacher-engine", "default"])
    assert "--teacher and --teacher-engine are exclusive: pick one teacher" in capsys.readouterr().err


@pytest.fixture()
def quiet_main(tool, monkeypatch):  # type: ignore[no-untyped-def]
    """Run the tool's ``main`` in-process without leaving its process-wide settings behind (signal handlers, torch
    threads and deterministic algorithms)."""
    monkeypatch.setattr(tool.signal, "signal", lambda *_args: None)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield tool.main
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def _tiny_run(ckpt: Path, out: Path, *extra: str) -> list[str]:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
    return ["--base", str(ckpt), "--out", str(out), "--data", str(SHARED_DATA), "--limit-train", "96", "--limit-eval", "24", "--eval-slice", "16",
            "--batch-size", "8", "--epochs", "2", "--eval-every", "5", "--rdrop-alpha", "0.5", "--threads", "1",
            "--log-level", "WARNING", *extra]


def test_a_resumed_run_gives_the_weights_of_an_unbroken_run(quiet_main, tool, ckpt_bert, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert quiet_main(_tiny_run(ckpt_bert, tmp_path / "whole")) == 0
    assert not (tmp_path / "whole" / tool.RESUME_FILE).exists()  # removed once a run completes
    # stopped mid-way through the second epoch (12 steps per epoch), after a slice evaluation, then resumed
    assert quiet_main(_tiny_run(ckpt_bert, tmp_path / "broken", "--stop-after-steps", "17")) == 0
    state = tmp_path / "broken" / tool.RESUME_FILE
    assert state.is_file()
    assert json.loads((tmp_path / "broken" / "training_log.json").read_text())["stop_reason"] == (
        "--stop-after-steps 17")
    assert quiet_main(_tiny_run(ckpt_bert, tmp_path / "broken", "--resume")) == 0
    assert not state.exists()
    whole = (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert (tmp_path / "broken" / "model.safetensors").read_bytes() == whole
    logs = [json.loads((tmp_path / d / "training_log.json").read_text()) for d in ("whole", "broken")]
    strip = [[{k: v for k, v in e.items() if k not in ("eval_s", "elapsed_s")} for e in log["evals"]] for log in logs]
    assert strip[0] == strip[1] and logs[0]["best"] == logs[1]["best"]
    # the saved best checkpoint may come from before the break: the weights where training ended must match too
    assert logs[1]["last_weights_sha256"] == logs[0]["last_weights_sha256"]
    assert [(i["first_step"], i["last_step"]) for i in logs[1]["invocations"]] == [(0, 17), (17, 24)]
    first, second = logs[1]["invocations"]  # each with its own command and wall time, for the model card
    assert "--stop-after-steps" in first["command"] and "--resume" in second["command"]
    assert first["wall_s"] > 0 and 0 < second["wall_s"] <= logs[1]["timing_s"]["total"]


def test_resume_refuses_other_recipe_arguments_and_a_missing_state(quiet_main, tool, ckpt_bert, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"--resume: no resumable state at .*resume_state\.pt \(a run writes it"):
        quiet_main(_tiny_run(ckpt_bert, out, "--resume"))
    assert quiet_main(_tiny_run(ckpt_bert, out, "--stop-after-steps", "3")) == 0
    with pytest.raises(SystemExit, match=r"written with other arguments: --lr 0\.0001 \(now 0\.0002\); resume with"):
        quiet_main(_tiny_run(ckpt_bert, out, "--resume", "--lr", "2e-4"))


def test_a_state_written_before_pad_to_multiple_existed_resumes_at_its_default(quiet_main, tool, ckpt_bert,  # type: ignore[no-untyped-def]
                                                                                 tmp_path) -> None:
    out = tmp_path / "run"
    assert quiet_main(_tiny_run(ckpt_bert, out, "--stop-after-steps", "3")) == 0
    state = torch.load(out / tool.RESUME_FILE, weights_only=False)
    del state["recipe"]["pad_to_multiple"]  # as an older tool wrote it
    torch.save(state, out / tool.RESUME_FILE)
    with pytest.raises(SystemExit, match=r"other arguments: --pad-to-multiple 1 \(now 32\)"):
        quiet_main(_tiny_run(ckpt_bert, out, "--resume", "--pad-to-multiple", "32"))
    assert quiet_main(_tiny_run(ckpt_bert, out, "--resume", "--stop-after-steps", "4")) == 0


def test_collate_pads_to_a_multiple_within_the_cap(tool) -> None:  # type: ignore[no-untyped-def]
    split = tool.Split("s", ["p"] * 2, ["h"] * 2, np.zeros(2, dtype=np.int64), ["x"] * 2,
                       [np.arange(1, 6), np.arange(1, 8)], [np.zeros(5, np.int64), np.ones(7, np.int64)],
                       np.array([5, 7]))
    idx = np.array([0, 1])
    for multiple, cap, width in ((1, None, 7), (4, None, 8), (4, 512, 8), (32, 20, 20), (4, 6, 7)):
        batch = tool.collate(split, idx, 0, multiple, cap)
        assert tuple(batch["input_ids"].shape) == (2, width), (multiple, cap)
        assert batch["attention_mask"].sum(1).tolist() == [5, 7]
        assert batch["input_ids"][1, :7].tolist() == list(range(1, 8)) and not batch["input_ids"][:, 7:].any()
        assert batch["token_type_ids"][1].tolist() == [1] * 7 + [0] * (width - 7)


class _PairTokenizer:
    """Ids 1..n of a pair's words (premise, then hypothesis); token types only when asked for, as HF does."""

    def __init__(self, input_names: list[str]) -> None:
        self.model_input_names = input_names

    def __call__(self, premises, hypotheses, **kwargs):  # type: ignore[no-untyped-def]
        pairs = [(p.split(), h.split()) for p, h in zip(premises, hypotheses)]
        out = {"input_ids": [list(range(1, len(p) + len(h) + 1)) for p, h in pairs]}
        if kwargs.get("return_token_type_ids"):
            out["token_type_ids"] = [[0] * len(p) + [1] * len(h) for p, h in pairs]
        return out


@pytest.mark.parametrize("typed", [True, False])
def test_backbones_without_token_types_get_batches_without_them(tool, typed) -> None:  # type: ignore[no-untyped-def]
    names = ["input_ids", "token_type_ids", "attention_mask"] if typed else ["input_ids", "attention_mask"]
    split = tool.Split("s", ["a b", "c"], ["d", "e f g"], np.zeros(2, dtype=np.int64), ["x"] * 2)
    tool.tokenize(_PairTokenizer(names), split, 512)
    batch = tool.collate(split, np.array([0, 1]), 0)
    assert sorted(batch) == sorted(names)
    assert batch["attention_mask"].sum(1).tolist() == [3, 4]
    if typed:
        assert batch["token_type_ids"].tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]


def test_extra_rows_join_the_training_data_and_the_log(quiet_main, tool, ckpt_bert, tmp_path) -> None:  # type: ignore[no-untyped-def]
    extra = tmp_path / "extra.jsonl"
    rows = [{"premise": "1989", "hypothesis": "1991", "label": "contradiction", "source": "answers/qa",
             "category": "year_swap"}, {"premise": "In 1989.", "hypothesis": "1989", "label": "entailment",
                                        "source": "answers/qa", "category": "format_variant"}]
    extra.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = _tiny_run(ckpt_bert, tmp_path / "run", "--extra-train", str(extra), "--epochs", "1")
    assert quiet_main(args) == 0
    log = json.loads((tmp_path / "run" / "training_log.json").read_text())
    assert log["args"]["extra_train"] == [str(extra)]  # paths inside lists are written as strings
    assert log["data"]["extra_train"]["rows"] == 2
    assert log["data"]["extra_train"]["rows_per_category"] == {"format_variant": 1, "year_swap": 1}
    assert log["data"]["train_rows_used"] == 98


def test_a_base_recovered_from_a_graph_is_logged_and_its_marker_not_passed_on(quiet_main, tool, ckpt_bert,  # type: ignore[no-untyped-def]
                                                                             tmp_path) -> None:
    """A base written by recover.py names its graph in config.json: the run logs it as its base's origin, and the
    checkpoint it trains does not carry the marker (its weights are trained, not recovered)."""
    import shutil

    base = tmp_path / "recovered"
    shutil.copytree(ckpt_bert, base)
    config = json.loads((base / "config.json").read_text())
    origin = {"artifact_hash": "a" * 64, "graph_sha256": "b" * 64}
    (base / "config.json").write_text(json.dumps({**config, "fastnli_recovered_from": origin}))
    assert quiet_main(_tiny_run(base, tmp_path / "run")) == 0
    log = json.loads((tmp_path / "run" / "training_log.json").read_text())
    assert log["base_model"]["recovered_from"] == origin
    assert "fastnli_recovered_from" not in json.loads((tmp_path / "run" / "config.json").read_text())


def test_repeat_rows_appends_copies_of_the_files_rows_in_their_order(tool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
    rows = [{"premise": f"p{i}", "hypothesis": f"h{i}", "label": label, "source": source, "category": "long"}
            for i, (source, label) in enumerate([("long/kept", "neutral"), ("long/sibling", "entailment"),
                                                 ("long/hard", "neutral"), ("long/sibling", "neutral")])]
    extra = tmp_path / "rows.jsonl"
    extra.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--base", str(tmp_path), "--out", "x", "--data", str(SHARED_DATA), "--limit-train", "10",
            "--extra-train", str(extra)]
    train, _, info = tool.load_data(tool.parse_args(
        [*base, "--repeat-rows", "long/sibling", "--repeat-rows", "long/kept,long/sibling:neutral"]))
    # the files' rows, then the siblings, then the neutral kept and sibling rows: copies of the files' rows only
    assert train.premises[10:] == ["p0", "p1", "p2", "p3", "p1", "p3", "p0", "p3"]
    assert train.sources[10:14] == [tool.EXTRA_PREFIX + r["source"] for r in rows]
    assert info["extra_train"]["rows"] == 8
    assert info["extra_train"]["repeated"] == [{"spec": "long/sibling", "rows": 2},
                                               {"spec": "long/kept,long/sibling:neutral", "rows": 2}]
    with pytest.raises(ValueError, match=r"--repeat-rows 'long/gone': no --extra-train row has such a source"):
        tool.load_data(tool.parse_args([*base, "--repeat-rows", "long/gone"]))


@pytest.mark.parametrize(("argv", "message"), [
    (["--repeat-rows", "long/kept"], "--repeat-rows repeats --extra-train rows: give --extra-train too"),
    (["--extra-train", "r.jsonl", "--repeat-rows", "long/kept:maybe"],
     "--repeat-rows 'long/kept:maybe': expected SOURCES[:LABEL], sources comma-separated, LABEL one of "
     "contradiction, neutral, entailment"),
    (["--teacher-cache", "t.npz"], "--teacher-cache holds --teacher-engine's probabilities: give --teacher-engine too"),
])
def test_row_and_cache_options_refuse_what_they_cannot_do(tool, capsys, tmp_path, argv, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        tool.parse_args(["--base", str(tmp_path), "--out", "x", *argv])
    assert message in capsys.readouterr().err


def test_teacher_cache_is_written_once_then_read_and_refuses_other_pairs_or_teachers(tool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = [{"premise": "A dog runs through the snow.", "hypothesis": "An animal is outside.", "label": "entailment",
             "source": "snli/train"},
            {"premise": "Two women are talking in a cafe.", "hypothesis": "The women are asleep.",
             "label": "contradiction", "source": "snli/train"}]
    split, cache = tool.make_split("train", rows), tmp_path / "teacher.npz"
    computed, record = tool.cached_teacher_logprobs("default", split, cache)
    assert cache.is_file() and "cache" not in record
    read, cached = tool.cached_teacher_logprobs("default", split, cache)
    np.testing.assert_array_equal(read, computed)
    assert cached == {**record, "cache": str(cache)}
    other = tool.make_split("train", [rows[0]])
    with pytest.raises(SystemExit, match=r"holds the teacher's probabilities of other training pairs \(2 pairs"):
        tool.cached_teacher_logprobs("default", other, cache)
    with np.load(cache) as z:
        logp, digest = z["logp"], z["pairs_sha256"]
    with cache.open("wb") as f:  # the same pairs, another teacher
        np.savez(f, logp=logp, pairs_sha256=digest, record=np.array(json.dumps({**record, "artifact_hash": "f" * 64})))
    with pytest.raises(SystemExit, match=r"was written by the teacher ffffffffffff, but --teacher-engine default is "):
        tool.cached_teacher_logprobs("default", split, cache)
    # a teacher that is not on this machine: the cache stands for it
    read, _ = tool.cached_teacher_logprobs(str(tmp_path / "gone"), split, cache)
    np.testing.assert_array_equal(read, computed)


def test_device_cuda_without_a_gpu_says_so(quiet_main, ckpt_bert, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match=r"--device cuda: torch .* sees no GPU here; train with --device cpu"):
        quiet_main(_tiny_run(ckpt_bert, tmp_path / "run", "--device", "cuda"))


def test_allocator_hint_names_a_jemalloc_to_preload_unless_one_is(tool, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(tool.sys, "platform", "linux")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    lib = tmp_path / "libjemalloc.so"
    lib.write_bytes(b"")
    monkeypatch.setattr(tool, "jemalloc_library", lambda: lib)
    assert tool.allocator_hint("cpu") == (
        "glibc's malloc gives each step's memory back to the kernel and faults it in again (a third of the CPU time in "
        f"page faults); train faster with LD_PRELOAD={lib} MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 set in the "
        "environment (the process then grows with every new batch width: --pad-to-multiple 16 bounds the widths)")
    monkeypatch.setattr(tool, "jemalloc_library", lambda: None)
    assert "apt install libjemalloc2" in tool.allocator_hint("cpu")
    assert tool.allocator_hint("cuda") is None
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")
    assert tool.allocator_hint("cpu") is None
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(tool.sys, "platform", "darwin")
    assert tool.allocator_hint("cpu") is None

