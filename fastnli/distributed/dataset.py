"""``score_dataset``: NCP and its sibling scorers over a Ray dataset, on a pool of actors with one engine each.

The driver resolves the model to one export artifact first (a HF checkpoint is exported once, never per actor),
shares it (:mod:`fastnli.distributed.artifact`), and maps :class:`~fastnli.distributed.actor.NLIScorer` over the
dataset with ``map_batches`` on an actor pool: GPU actors (``num_gpus_per_actor > 0``) run the FP16 graph, CPU
actors the CPU choice of the manifest (INT8 when it passed its agreement check). Inside each batch the kernels
scheduler dedups and packs the pairs as in the single-process :func:`fastnli.score`. Ray restarts an actor that
dies and retries its batches, so the output still has exactly one row per input row.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from fastnli.distributed.actor import NLIScorer, output_columns
from fastnli.distributed.artifact import ShareArg, share_artifact
from fastnli.engine import BatchPolicy, cpu_auto_precision, read_manifest, resolve_artifact
from fastnli.engine.engine import PrecisionArg
from fastnli.scorers.api import UQLM_MAX_LENGTH, check_max_length, check_scorers
from fastnli.scorers.questions import resolve_question_format
from fastnli.scorers.units import resolve_align_units

logger = logging.getLogger("fastnli")

FormatArg = Literal["auto", "jsonl", "parquet"]
_RAY_MISSING = "fastnli.distributed needs Ray Data: pip install 'fastnli[ray]'"


def import_ray() -> Any:
    """``import ray`` (and Ray Data), or ImportError with the install command."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{_RAY_MISSING} ({exc})") from None
    return ray


def infer_format(path: str | Path, fmt: FormatArg = "auto") -> Literal["jsonl", "parquet"]:
    """``jsonl`` or ``parquet`` from ``fmt``, else from the suffix of ``path`` (a directory: of its first file).

    Raises:
        ValueError: when the format cannot be told.
    """
    if fmt in ("jsonl", "parquet"):
        return fmt
    if fmt != "auto":
        raise ValueError(f"format={fmt!r} is not supported; use 'auto', 'jsonl' or 'parquet'")
    p = Path(path)
    if p.is_dir():
        first = next((c for c in sorted(p.iterdir()) if c.is_file() and not c.name.startswith((".", "_"))), None)
        p = first if first is not None else p
    suffix = "".join(p.suffixes[-2:]).lower()
    if suffix.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "jsonl"
    if suffix.endswith(".parquet"):
        return "parquet"
    raise ValueError(f"cannot tell the format of {path}; name it .jsonl or .parquet, or pass format='jsonl' or "
                     "'parquet'")


def read_dataset(paths: str | Path | Sequence[str | Path], format: FormatArg = "auto") -> Any:
    """A ``ray.data.Dataset`` of JSON-lines or Parquet files (a file, a directory, or a list of them)."""
    ray = import_ray()
    many = [str(p) for p in paths] if isinstance(paths, (list, tuple)) else [str(paths)]
    if not many:
        raise ValueError("paths is empty; give at least one JSONL or Parquet file or directory")
    kind = infer_format(many[0], format)
    # Reading is light next to NLI: its tasks reserve no CPU, so a pool that takes every CPU cannot starve them.
    reader = ray.data.read_json if kind == "jsonl" else ray.data.read_parquet
    if "num_cpus" in inspect.signature(reader).parameters:
        return reader(many, num_cpus=0)
    return reader(many, ray_remote_args={"num_cpus": 0})  # Ray before the named remote parameters


def _check_positive(name: str, value: float, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
        need = "a non-negative number" if allow_zero else "a positive number"
        raise ValueError(f"{name} must be {need}; got {value!r}")


def _actor_pool(ray: Any, num_actors: int | tuple[int, int]) -> Any:
    if isinstance(num_actors, tuple):
        if len(num_actors) != 2 or not all(isinstance(n, int) and n >= 1 for n in num_actors) or \
                num_actors[0] > num_actors[1]:
            raise ValueError(f"num_actors={num_actors!r}: give a pool size n >= 1 or (min, max) with 1 <= min <= max")
        return ray.data.ActorPoolStrategy(min_size=num_actors[0], max_size=num_actors[1])
    if isinstance(num_actors, bool) or not isinstance(num_actors, int) or num_actors < 1:
        raise ValueError(f"num_actors={num_actors!r}: give a pool size n >= 1 or (min, max) with 1 <= min <= max")
    return ray.data.ActorPoolStrategy(size=num_actors)


def score_dataset(
    data: Any,
    model: str | Path | None = None,
    *,
    scorers: Sequence[str] = ("noncontradiction",),
    use_best: bool = False,
    max_length: int | None = UQLM_MAX_LENGTH,
    num_actors: int | tuple[int, int] = 1,
    num_cpus_per_actor: float = 1.0,
    num_gpus_per_actor: float = 0.0,
    precision: PrecisionArg = "auto",
    batch_rows: int = 256,
    batch_policy: BatchPolicy | None = None,
    response_column: str = "response",
    samples_column: str = "sampled_responses",
    id_column: str | None = None,
    prompt_column: str = "prompt",
    question_aware: bool | None = None,
    align_units: bool | None = None,
    on_invalid: Literal["raise", "keep"] = "raise",
    preserve_order: bool = True,
    share: ShareArg = "auto",
    cache_dir: str | Path | None = None,
    local_dir: str | Path | None = None,
    check_resources: bool = True,
) -> Any:
    """Score every row of a Ray dataset with NLI consistency scorers on a pool of Ray actors.

    Args:
        data: a ``ray.data.Dataset`` with a string column ``response`` and a list-of-strings column
            ``sampled_responses``, or a path (or list of paths) of JSONL/Parquet files that Ray Data reads.
        model: an export artifact directory, a HF checkpoint directory or a hub id, resolved and exported once on
            the driver (default: the embedded default model).
        scorers, use_best, max_length: as :func:`fastnli.score` (default: NCP only; uqlm's 2000-character cut).
        num_actors: the actor pool: a fixed size (default 1) or ``(min, max)`` for an autoscaling pool.
        num_cpus_per_actor: CPUs reserved per actor, also its ONNX Runtime threads (default 1).
        num_gpus_per_actor: GPUs per actor (default 0: CPU actors); > 0 runs CUDA with the FP16 graph, with the
            engine's CPU fallback.
        precision: the engine's precision (default ``"auto"``: FP16 on GPU actors, the manifest's CPU choice on CPU
            actors).
        batch_rows: dataset rows per engine pass (default 256; each row brings about 2 x its samples of pairs).
        batch_policy: the engine's batch policy (default: the device's).
        response_column, samples_column: the input column names.
        id_column: a column that names rows in error messages; keep one to join results by key.
        prompt_column, question_aware: the question of each row, and whether the model reads each answer with it
            (as :func:`fastnli.score`'s ``prompts`` and ``question_aware``: by default where the model was trained
            question-aware and the dataset has the column).
        align_units: as :func:`fastnli.score`'s (default: the model's manifest says).
        on_invalid: a row that cannot be scored (a field missing or of the wrong type): ``"raise"`` (default) fails
            the run, naming the row and the field; ``"keep"`` gives it null scores and its message in an ``error``
            column (null for the scored rows), and scores the others.
        preserve_order: keep the input's row order (default True; sets ``preserve_order`` in the execution options
            of the dataset's ``DataContext``, shared with the datasets it derives from).
        share: how the artifact reaches the actors: ``"auto"`` (default), ``"path"`` or ``"object_store"``
            (:func:`~fastnli.distributed.artifact.share_artifact`).
        cache_dir: the export cache on the driver (default ``$FASTNLI_CACHE``).
        local_dir: where nodes write object-store copies of the artifact (default ``<FASTNLI_CACHE>/ray-artifacts``).
        check_resources: refuse a pool that the cluster cannot place one actor of right now (default True; turn
            off on an autoscaling cluster that adds GPU nodes on demand).

    Returns:
        A lazy ``ray.data.Dataset``: the input columns plus one float column per scorer (and ``best_response`` with
        ``use_best`` and a semantic scorer, ``error`` with ``on_invalid="keep"``); exactly one row per input row.

    Raises:
        ImportError: without Ray Data (``pip install 'fastnli[ray]'``).
        ValueError: for bad arguments, naming the argument and the fix; a bad row fails the run with an error that
            names the row (its ``id_column`` value, else its place in the batch) and the field.
    """
    ray = import_ray()
    scorer_set = check_scorers(scorers)
    check_max_length(max_length)
    _check_positive("batch_rows", batch_rows)
    if on_invalid not in ("raise", "keep"):
        raise ValueError(f"on_invalid={on_invalid!r}: use 'raise' (a bad row fails the run) or 'keep' (it gets an "
                         "'error' column and null scores)")
    keep_invalid = on_invalid == "keep"
    _check_positive("num_cpus_per_actor", num_cpus_per_actor)
    _check_positive("num_gpus_per_actor", num_gpus_per_actor, allow_zero=True)
    compute = _actor_pool(ray, num_actors)
    if not ray.is_initialized():
        logger.info("Ray is not initialised: starting a local Ray instance (call ray.init(address=...) first to "
                    "use a cluster)")
        ray.init()
    gpu = num_gpus_per_actor > 0
    if check_resources:
        total = ray.cluster_resources()
        for res, need in (("CPU", num_cpus_per_actor), ("GPU", num_gpus_per_actor)):
            if need > total.get(res, 0.0):
                raise ValueError(f"one actor needs {need:g} {res} but the Ray cluster has {total.get(res, 0.0):g}; "
                                 f"lower num_{res.lower()}s_per_actor (0 GPUs: CPU actors), or pass "
                                 "check_resources=False on an autoscaling cluster")

    if model is None:
        from fastnli.default_model import default_model_dir

        model = default_model_dir()
    artifact_dir = resolve_artifact(model, cache_dir)  # the one export, on the driver
    manifest = read_manifest(artifact_dir)
    cpu_prec = precision if precision != "auto" and not gpu else cpu_auto_precision(manifest)
    if gpu:
        gpu_prec = precision if precision != "auto" else next(
            p for p in ("fp16", "fp32", "int8") if p in manifest.precisions)
        ship: tuple[str, ...] = tuple(dict.fromkeys((gpu_prec, cpu_prec)))  # the FP16 graph and the CPU fallback's
    else:
        ship = (cpu_prec,)
    shared = share_artifact(artifact_dir, ship, share=share, local_dir=local_dir)

    ds = read_dataset(data) if isinstance(data, (str, Path, list, tuple)) else data
    schema = ds.schema(fetch_if_missing=False)
    if schema is not None:
        names = list(schema.names)
        for col in (response_column, samples_column):
            if col not in names:
                raise ValueError(f"the dataset has no column {col!r} (columns: {names}); name the columns with "
                                 "response_column= / samples_column=")
        clash = [c for c in output_columns(scorer_set, use_best, keep_invalid) if c in names]
        if clash:
            raise ValueError(f"the dataset already has the output column(s) {clash}; rename or drop them first")
        if question_aware is True and prompt_column not in names:
            raise ValueError(f"question_aware=True needs a {prompt_column!r} column (the question of each row); "
                             f"columns: {names}")
    question_format = None if question_aware is False else resolve_question_format(
        question_aware, [""], manifest.question_format)
    aligned = resolve_align_units(align_units, manifest.align_units)
    if preserve_order:
        ds.context.execution_options.preserve_order = True

    kwargs: dict[str, Any] = {}
    if "udf_modifying_row_count" in inspect.signature(ds.map_batches).parameters:
        kwargs["udf_modifying_row_count"] = False  # one output row per input row
    logger.info("scoring on Ray: %s actors x (%g CPU, %g GPU), precision %s, %d rows per batch, artifact %s (%s)",
                num_actors, num_cpus_per_actor, num_gpus_per_actor, ship[0], batch_rows, artifact_dir,
                "object store" if shared.files else "path")
    return ds.map_batches(
        NLIScorer,
        batch_size=batch_rows,
        batch_format="pyarrow",
        compute=compute,
        num_cpus=num_cpus_per_actor,
        num_gpus=num_gpus_per_actor if gpu else None,
        fn_constructor_kwargs={
            "artifact": shared,
            "device": "cuda" if gpu else "cpu",
            "precision": precision,
            "threads": max(1, int(num_cpus_per_actor)),
            "scorers": scorer_set,
            "use_best": use_best,
            "max_length": max_length,
            "response_column": response_column,
            "samples_column": samples_column,
            "id_column": id_column,
            "batch_policy": batch_policy,
            "prompt_column": prompt_column,
            "question_format": question_format,
            "require_prompts": question_aware is True,
            "keep_invalid": keep_invalid,
            "align_units": aligned,
        },
        **kwargs,
    )


def _write_jsonl(ds: Any, path: Path) -> int:
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            n += batch.num_rows
            f.writelines(json.dumps(rec, ensure_ascii=False) + "\n" for rec in batch.to_pylist())
    return n


def _write_parquet(ds: Any, path: Path) -> int:
    import pyarrow.parquet as pq

    n = 0
    writer = None
    try:
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            n += batch.num_rows
            if writer is None:
                writer = pq.ParquetWriter(path, batch.schema)
            writer.write_table(batch)
        if writer is None:  # no rows: still a valid file, with the dataset's columns
            pq.write_table(ds.schema().base_schema.empty_table(), path)
    finally:
        if writer is not None:
            writer.close()
    return n


def write_scores(ds: Any, output: str | Path, format: FormatArg = "auto") -> int:
    """Stream a scored dataset into one JSONL or Parquet file on the driver, in the dataset's row order.

    Written to ``<output>.tmp`` and renamed into place, so an interrupted run leaves no partial output. For
    outputs too large for one file, use Ray's own writers (``ds.write_parquet(dir)``).

    Returns:
        The number of rows written.
    """
    out = Path(output)
    kind = infer_format(out, format)
    tmp = out.with_name(out.name + ".tmp")
    try:
        n = (_write_jsonl if kind == "jsonl" else _write_parquet)(ds, tmp)
        tmp.replace(out)
    except BaseException:
        _release_failed_run()
        raise
    finally:
        tmp.unlink(missing_ok=True)
    return n


def _release_failed_run() -> None:
    """Free the actors of a Ray Data run that failed, before the driver starts another.

    When the first output of a run fails (a bad row in the first batch to finish), Ray Data (2.60) raises before it
    hands the run's executor to the code that shuts it down; the executor is left to garbage collection, and until
    then its actors keep their CPUs, so the driver's next run can wait for them forever. Collecting now shuts it down
    (its ``__del__``) and frees them.
    """
    import gc

    gc.collect()
