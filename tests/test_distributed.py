"""fastnli.distributed on a local Ray cluster (ray.init(num_cpus=2)): parity with the single-process scorer, row
count and order, export once, the object-store artifact, an actor killed mid-run, the CLI, and error messages."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from bench.workloads import short_workload  # noqa: E402
from fastnli.distributed import score_dataset, share_artifact, write_scores  # noqa: E402
from fastnli.engine import NLIEngine, read_manifest  # noqa: E402
from fastnli.engine.batches import BatchPolicy  # noqa: E402
from fastnli.scorers import score  # noqa: E402

pytestmark = pytest.mark.slow
SCORERS = ("noncontradiction", "entailment", "semantic_negentropy", "semantic_sets_confidence")


@pytest.fixture(scope="module")
def cluster() -> object:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _rows(prompts: int, samples: int = 5, seed: int = 7) -> list[dict]:
    w = short_workload(prompts, samples, seed)
    return [{"id": i, "response": r, "sampled_responses": s} for i, (r, s) in
            enumerate(zip(w.responses, w.sampled_responses))]


def _single_process(rows: list[dict], art: Path, scorers=SCORERS, use_best: bool = False):
    engine = NLIEngine.from_pretrained(art, device="cpu", precision="fp32")
    return score([r["response"] for r in rows], [r["sampled_responses"] for r in rows], scorers=scorers,
                 engine=engine, use_best=use_best)


def _assert_same(out: list[dict], rows: list[dict], expected, scorers=SCORERS) -> None:
    assert [r["id"] for r in out] == [r["id"] for r in rows]  # one row per input, in input order
    assert [r["response"] for r in out] == [r["response"] for r in rows]
    assert [list(r["sampled_responses"]) for r in out] == [r["sampled_responses"] for r in rows]
    for s in scorers:
        # fp32 on both sides; batches differ (per Ray batch vs one pass), so only float rounding may differ
        np.testing.assert_allclose([r[s] for r in out], expected.column(s), rtol=0, atol=1e-6, err_msg=s)


def test_matches_single_process_scorer(cluster, art_v1: Path) -> None:
    rows = _rows(60)
    ds = ray.data.from_items(rows, override_num_blocks=6)
    out = score_dataset(ds, art_v1, scorers=SCORERS, use_best=True, precision="fp32", num_actors=2,
                        batch_rows=7).take_all()
    expected = _single_process(rows, art_v1, use_best=True)
    _assert_same(out, rows, expected)
    assert [r["best_response"] for r in out] == [r.best_response for r in expected]


def test_checkpoint_is_exported_once_and_shared_through_the_object_store(cluster, ckpt_v1: Path, tmp_path: Path
                                                                         ) -> None:
    rows = _rows(24, seed=8)
    cache, local = tmp_path / "cache", tmp_path / "node-local"
    ds = score_dataset(ray.data.from_items(rows), ckpt_v1, precision="fp32", num_actors=2, batch_rows=5,
                       share="object_store", cache_dir=cache, local_dir=local)
    out = ds.take_all()
    exported = list((cache / "artifacts").iterdir())
    assert len(exported) == 1  # the driver exported the checkpoint once; actors only load
    _assert_same(out, rows, _single_process(rows, exported[0]), scorers=("noncontradiction",))
    copies = list(local.iterdir())
    assert len(copies) == 1 and not any(p.name.startswith(".") for p in local.iterdir())  # one copy per node
    copy = read_manifest(copies[0])
    assert copy.artifact_hash == read_manifest(exported[0]).artifact_hash
    assert sorted(copy.precisions) == ["fp32"]  # only the graph the actors run travelled
    assert sorted(p.name for p in copies[0].glob("*.onnx")) == ["model_fp32.onnx"]


def _actor_pids() -> set[int]:
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"NLIScorer" in (d / "cmdline").read_bytes():
                    pids.add(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the actor processes through /proc")
def test_actor_killed_mid_run_still_gives_one_row_per_input(cluster, art_v1: Path) -> None:
    rows = _rows(160, samples=6, seed=9)
    # One pair per ORT run makes each batch slow enough (~0.1 s) that the kill lands while work is left.
    ds = score_dataset(ray.data.from_items(rows, override_num_blocks=16), art_v1, precision="fp32", num_actors=2,
                       batch_rows=4, batch_policy=BatchPolicy(max_batch_tokens=4096, max_batch_size=1))
    out: list[dict] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                out.extend(batch.to_pylist())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    deadline = time.monotonic() + 120
    while not out and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    before = _actor_pids()
    assert before, "no NLIScorer actor process found"
    assert 0 < len(out) < len(rows), f"the kill must land mid-run; {len(out)} of {len(rows)} rows were done"
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    t.join(timeout=180)
    assert not t.is_alive() and not errors, errors
    assert victim not in _actor_pids()
    _assert_same(out, rows, _single_process(rows, art_v1, scorers=("noncontradiction",)),
                 scorers=("noncontradiction",))


def test_cli_scores_a_jsonl_file_on_ray_like_the_single_process_cli(cluster, art_v1: Path, tmp_path: Path) -> None:
    from fastnli.cli import main

    rows = _rows(20, seed=10)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["score", "--model", str(art_v1), "--precision", "fp32", "--scorers",
            "noncontradiction,semantic_negentropy", "--use-best"]
    # the form: fastnli score --ray ADDRESS INPUT OUTPUT
    assert main([*args, "--ray", "auto", "--actors", "2", "--batch-rows", "3", str(src), str(tmp_path / "ray.jsonl")
                 ]) == 0
    assert main([*args, str(src), "-o", str(tmp_path / "local.jsonl")]) == 0
    got = [json.loads(x) for x in (tmp_path / "ray.jsonl").read_text().splitlines()]
    want = [json.loads(x) for x in (tmp_path / "local.jsonl").read_text().splitlines()]
    assert [sorted(g) for g in got] == [sorted(w) for w in want]
    for g, w in zip(got, want):
        assert {k: v for k, v in g.items() if not isinstance(v, float)} == \
            {k: v for k, v in w.items() if not isinstance(v, float)}
        for k in ("noncontradiction", "semantic_negentropy"):
            assert g[k] == pytest.approx(w[k], abs=1e-6)
    assert main([*args, "--ray", "auto", str(src), str(tmp_path / "ray.parquet")]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "ray.parquet")
    assert table.column("id").to_pylist() == [r["id"] for r in rows]


def test_bad_row_fails_with_its_id_and_field(cluster, art_v1: Path) -> None:
    rows = _rows(12, seed=11)
    rows[5]["sampled_responses"] = []
    ds = score_dataset(ray.data.from_items(rows), art_v1, precision="fp32", id_column="id", batch_rows=4)
    with pytest.raises(Exception, match=re.escape("row id=5: field 'sampled_responses' must be a non-empty list of "
                                                  "strings")):
        ds.take_all()


def test_cli_on_ray_keeps_invalid_rows_in_place(cluster, art_v1: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from fastnli.cli import main

    rows = _rows(6, seed=12)
    rows[1]["sampled_responses"] = []
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["score", "--model", str(art_v1), "--precision", "fp32", "--ray", "auto", "--batch-rows", "4", str(src),
            str(tmp_path / "ray.jsonl")]
    # The default stops at a bad row, naming it by --id-column. (With bad rows in several batches, Ray's batches run
    # concurrently and the first to fail is the one named: one bad row here.)
    assert main([*args, "--id-column", "id"]) == 2
    assert "error: row id=1: field 'sampled_responses' must be a non-empty list of strings (a bad row stops a Ray " \
        "run; --on-invalid keep writes it with an 'error' field instead)" in " ".join(capsys.readouterr().err.split())
    rows[4]["response"] = None  # (a field of another type fails Arrow's read of the column: one type per column)
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*args, "--on-invalid", "keep"]) == 0
    out = [json.loads(x) for x in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert [r["id"] for r in out] == [r["id"] for r in rows]
    assert [r["error"] for r in out] == [
        None, "row 1 of a batch (response {!r}): field 'sampled_responses' must be a non-empty list of strings"
        .format(rows[1]["response"][:60]), None, None, "row 0 of a batch (response 'None'): field 'response' must be a "
        "string, got NoneType", None]
    good = [r for r in rows if r["id"] not in (1, 4)]
    want = _single_process(good, art_v1, scorers=("noncontradiction",)).column("noncontradiction")
    assert [r["noncontradiction"] for r in out if r["error"] is None] == pytest.approx(want, abs=1e-6)
    assert out[1]["noncontradiction"] is None and out[4]["noncontradiction"] is None


def test_output_column_clash_and_missing_column(cluster, art_v1: Path) -> None:
    rows = [{"response": "a", "sampled_responses": ["b"], "noncontradiction": 0.5}]
    with pytest.raises(ValueError, match=re.escape("the dataset already has the output column(s) "
                                                   "['noncontradiction']; rename or drop them first")):
        score_dataset(ray.data.from_items(rows), art_v1)
    with pytest.raises(ValueError, match=re.escape("the dataset has no column 'answer' (columns: ['response', "
                                                   "'sampled_responses', 'noncontradiction']); name the columns with "
                                                   "response_column= / samples_column=")):
        score_dataset(ray.data.from_items(rows), art_v1, response_column="answer")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_actors": 0}, "num_actors=0: give a pool size n >= 1 or (min, max) with 1 <= min <= max"),
    ({"num_actors": (3, 2)}, "num_actors=(3, 2): give a pool size n >= 1 or (min, max) with 1 <= min <= max"),
    ({"batch_rows": 0}, "batch_rows must be a positive number; got 0"),
    ({"num_gpus_per_actor": 1}, "one actor needs 1 GPU but the Ray cluster has 0; lower num_gpus_per_actor (0 GPUs: "
                                "CPU actors), or pass check_resources=False on an autoscaling cluster"),
    ({"scorers": ["ncp"]}, "scorers=['ncp']: unknown ['ncp']; choose from"),
    ({"on_invalid": "skip"}, "on_invalid='skip': use 'raise' (a bad row fails the run) or 'keep' (it gets an 'error' "
                             "column and null scores)"),
])
def test_bad_arguments_name_the_argument_and_the_fix(cluster, art_v1: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        score_dataset(ray.data.from_items([{"response": "a", "sampled_responses": ["b"]}]), art_v1, **kwargs)


def test_share_artifact_refuses_a_precision_it_lacks(cluster, art_v1_fp32: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("has no ['int8'] graph (it has ['fp32']); re-export it with those "
                                                   "precisions")):
        share_artifact(art_v1_fp32, ["int8"])


def test_write_scores_refuses_an_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("cannot tell the format of")):
        write_scores(None, tmp_path / "out.txt")


def test_actor_reads_answers_with_their_question_when_told(art_v1: Path) -> None:
    """The actor itself (no cluster): with a question format each row's prompt goes in front of its answers, and the
    scores equal fastnli.score's question-aware ones; without the column it refuses only when prompts are required."""
    import pyarrow as pa

    from fastnli.distributed.actor import NLIScorer
    from fastnli.distributed.artifact import share_artifact
    from fastnli.scorers.questions import QUESTION_FORMAT

    shared = share_artifact(art_v1, ("fp32",), share="path")
    table = pa.table({"response": ["1989", "Paris"], "sampled_responses": [["1991", "In 1989."], ["Lyon"]],
                      "prompt": ["When did the Wall fall?", "Capital of France?"]})
    actor = NLIScorer(shared, precision="fp32", question_format=QUESTION_FORMAT)
    got = actor(table).column("noncontradiction").to_pylist()
    lib = score(["1989", "Paris"], [["1991", "In 1989."], ["Lyon"]], engine=actor.engine,
                prompts=["When did the Wall fall?", "Capital of France?"], question_aware=True)
    assert got == lib.column("noncontradiction")
    plain = NLIScorer(shared, precision="fp32", require_prompts=True)
    with pytest.raises(ValueError, match=re.escape("question_aware=True needs a 'prompt' column (the question of "
                                                   "each row); columns: ['response', 'sampled_responses']")):
        plain(table.drop(["prompt"]))


def test_actor_aligns_units_when_told(art_v1: Path) -> None:
    """The actor itself (no cluster): with ``align_units`` its scores equal fastnli.score's aligned ones."""
    import pyarrow as pa

    from fastnli.distributed.actor import NLIScorer
    from fastnli.distributed.artifact import share_artifact

    shared = share_artifact(art_v1, ("fp32",), share="path")
    responses, samples = ["It is 569 km long."], [["It is 354 miles long.", "It is 182 miles long."]]
    table = pa.table({"response": responses, "sampled_responses": samples})
    for align in (False, True):
        actor = NLIScorer(shared, precision="fp32", align_units=align)
        got = actor(table).column("noncontradiction").to_pylist()
        assert got == score(responses, samples, engine=actor.engine, align_units=align).column("noncontradiction")
    assert got != score(responses, samples, engine=actor.engine, align_units=False).column("noncontradiction")
