"""Export a HF NLI checkpoint to an ONNX artifact: fp32 (optimum-onnx) → FP16 (GPU) → INT8 (CPU) + manifest.

The artifact directory holds ``model_fp32.onnx``, ``model_fp16.onnx``, ``model_int8.onnx`` (those asked for), the
tokenizer files and ``manifest.json`` with validation figures of every graph against PyTorch fp32 on the built-in
probe set. It is written into a temporary sibling directory and renamed into place at the end, so an interrupted
export never leaves a directory that loads; the next export into the same folder removes such leftovers
(:func:`clean_leftovers`). Needs the export extra: ``pip install 'fastnli[export]'``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from fastnli.engine.batches import CPU_POLICY, score_unique
from fastnli.engine.labels import canonical_columns
from fastnli.engine.manifest import (
    DEVICE_PRECISIONS,
    MANIFEST_NAME,
    PRECISIONS,
    Manifest,
    PrecisionEntry,
    Validation,
    check_local_path,
    checkpoint_hash,
    precisions_for,
    sha256_file,
)
from fastnli.engine.session import auto_device
from fastnli.engine.tokenize import PairTokenizer
from fastnli.exporter.attention import (
    SHIFT_RECIPE,
    WINDOW_RECIPE,
    attention_recipe,
    position_window_export,
    relative_shift_export,
)
from fastnli.exporter.precision import needs_calibration, to_fp16, to_int8
from fastnli.exporter.probe import probe_pairs
from fastnli.exporter.stages import Stages

logger = logging.getLogger("fastnli")

GRAPH_FILES = {p: f"model_{p}.onnx" for p in PRECISIONS}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                    "merges.txt", "spm.model", "added_tokens.json")
_EXPORT_EXTRA = "pip install 'fastnli[export]'  (optimum-onnx, transformers<4.58, torch)"


def _require_export_deps() -> None:
    missing = []
    for mod in ("torch", "transformers", "optimum.exporters.onnx", "onnx"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ImportError(f"exporting a checkpoint needs {', '.join(missing)}; install them with: {_EXPORT_EXTRA}")


def resolve_checkpoint(model: str | Path) -> tuple[Path, str]:
    """Return ``(local_dir, source_name)`` for a local checkpoint directory or a HF hub id (downloaded once); a
    missing local path raises FileNotFoundError (:func:`~fastnli.engine.manifest.check_local_path`)."""
    check_local_path(model)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a HF checkpoint directory")
        return path.resolve(), str(path.resolve())
    if path.exists():
        raise ValueError(f"model={str(model)!r} is a file; pass a checkpoint directory or a HF hub id")
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(repo_id=str(model), allow_patterns=[
            "*.json", "*.safetensors", "*.txt", "*.model", "pytorch_model*.bin"])
    except Exception as exc:  # offline, unknown repo, bad id: say both readings of the name
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise FileNotFoundError(f"model {str(model)!r} is neither a local directory ({path.absolute()} does not "
                                f"exist) nor a HF hub model that could be fetched ({type(exc).__name__}: {reason})"
                                ) from exc
    return Path(local), str(model)


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("fastnli", "transformers", "optimum", "optimum-onnx", "onnx", "torch", "tokenizers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    for dist in ("onnxruntime-gpu", "onnxruntime"):
        try:
            out["onnxruntime"] = f"{metadata.version(dist)} ({dist})"
            break
        except metadata.PackageNotFoundError:
            continue
    return out


def _torch_probs(ckpt: Path, pairs: Sequence[tuple[str, str]], columns: list[int], max_length: int) -> np.ndarray:
    """PyTorch fp32 reference probabilities (canonical order) on ``pairs``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForSequenceClassification.from_pretrained(ckpt, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for i in range(0, len(pairs), 16):
            chunk = pairs[i:i + 16]
            enc = tok([p for p, _ in chunk], [h for _, h in chunk], padding=True, truncation="longest_first",
                      max_length=max_length, return_tensors="pt")
            out.append(torch.softmax(model(**enc).logits.float(), dim=-1).numpy()[:, columns])
    return np.concatenate(out)


def onnx_probs(graph: Path, tokenizer: PairTokenizer, pairs: Sequence[tuple[str, str]], columns: list[int],
               pad_id: int) -> tuple[np.ndarray, float]:
    """Probabilities of one ONNX graph on CPU through the engine's own path, and the seconds it took."""
    from fastnli.engine.session import SessionConfig, create_session

    sess, _ = create_session(graph, "cpu", SessionConfig())
    names = [i.name for i in sess.get_inputs()]
    t0 = time.perf_counter()
    probs = score_unique(lambda feed: sess.run(None, feed)[0], tokenizer, [p for p, _ in pairs],
                         [h for _, h in pairs], names, columns, pad_id, CPU_POLICY)
    return probs, time.perf_counter() - t0


def calibration_feeds(tokenizer: PairTokenizer, pairs: Sequence[tuple[str, str]], input_names: Sequence[str],
                      pad_id: int, rows: int = 32) -> list[dict[str, np.ndarray]]:
    """The graph's input dicts for ``pairs``, length-sorted batches of up to ``rows`` pairs (INT8 calibration)."""
    from fastnli.kernels import fill_batch, plan_batches

    want_types = "token_type_ids" in input_names
    flat, offsets, types = tokenizer.encode([p for p, _ in pairs], [h for _, h in pairs], with_type_ids=want_types)
    plan = plan_batches(np.diff(offsets), 1 << 30, rows, 1)
    feeds = []
    for b in range(plan.num_batches):
        ids, mask, tt = fill_batch(flat, offsets, plan.batch_rows(b), int(plan.seq_lens[b]), pad_id, types)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}
        feeds.append({k: v for k, v in feed.items() if k in input_names and v is not None})
    return feeds


def _validation(ref: np.ndarray, got: np.ndarray, seconds: float) -> Validation:
    d = np.abs(ref.astype(np.float64) - got.astype(np.float64))
    return Validation(n_pairs=len(ref), max_abs_dprob=float(d.max()), mean_abs_dprob=float(d.mean()),
                      argmax_agreement=float(np.mean(ref.argmax(1) == got.argmax(1))), seconds=round(seconds, 4))


#: A leftover of an interrupted export: ``.<name>.partial-<pid>-<hex>`` (or ``.old-`` of a replaced artifact).
_LEFTOVER = re.compile(r"^\..+\.(partial|old)-(?:(\d+)-)?[0-9a-f]{8}$")
#: Seconds after which a leftover that names no process is removed.
_LEFTOVER_AGE_S = 24 * 3600


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def clean_leftovers(parent: Path) -> list[Path]:
    """Remove the folders that interrupted exports left in ``parent``: those whose exporting process (named in the
    folder's name) is gone, and those that name none and are older than a day. Returns what was removed."""
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for path in parent.iterdir():
        m = _LEFTOVER.match(path.name)
        if not m or not path.is_dir():
            continue
        pid = m.group(2)
        stale = (not _pid_alive(int(pid))) if pid else time.time() - path.stat().st_mtime > _LEFTOVER_AGE_S
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("removed %d folders left by interrupted exports in %s", len(removed), parent)
    return removed


def _place(tmp: Path, out: Path) -> None:
    """Atomically move the finished artifact ``tmp`` to ``out`` (replacing an older artifact there)."""
    if out.exists():
        if any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
            raise FileExistsError(f"{out} exists and is not a fastnli artifact; choose an empty or new directory")
        old = out.with_name(f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def planned_stages(precisions: Sequence[str], validate: bool) -> list[str]:
    """The stage names of an export of ``precisions`` (fp32 first), in the order they run."""
    stages = ["checkpoint hash", "fp32 graph (optimum)", "tokenizer"]
    stages += [f"{p} graph" for p in precisions if p != "fp32"]
    if validate:
        stages += ["PyTorch fp32 reference"] + [f"validate {p}" for p in precisions]
    return stages + ["hashes + manifest"]


def export_precisions(precisions: Sequence[str] | None, device: str = "auto") -> list[str]:
    """The precisions an export writes, fp32 first: ``precisions`` when given (checked), else those ``device`` runs
    (:data:`~fastnli.engine.manifest.DEVICE_PRECISIONS`; ``"auto"`` is this machine's device,
    :func:`~fastnli.engine.session.auto_device`).

    Raises:
        ValueError: for an unknown precision or device, naming the valid ones.
    """
    if precisions is None:
        if device not in ("auto", *DEVICE_PRECISIONS):
            raise ValueError(f"device={device!r} is not supported; use 'auto', 'cpu' or 'cuda'")
        chosen: Sequence[str] = precisions_for(auto_device() if device == "auto" else device)
    else:
        if isinstance(precisions, str):
            raise TypeError(f"precisions={precisions!r} must be a list of names, e.g. [{precisions!r}]")
        bad = [p for p in precisions if p not in PRECISIONS]
        if bad:
            raise ValueError(f"precisions={list(precisions)!r}: {bad} unknown; choose from {list(PRECISIONS)}")
        chosen = precisions
    return ["fp32"] + [p for p in PRECISIONS if p in chosen and p != "fp32"]


def export(
    model: str | Path,
    out_dir: str | Path,
    precisions: Sequence[str] | None = None,
    opset: int | None = None,
    validate: bool = True,
    int8_recipe: dict[str, Any] | None = None,
    calibration_pairs: Sequence[tuple[str, str]] | None = None,
    device: str = "auto",
    progress: bool = False,
    relative_shift: bool = True,
    position_window: bool = True,
) -> Manifest:
    """Export ``model`` (HF hub id or local checkpoint directory) to an ONNX artifact in ``out_dir``.

    Each stage is logged when it starts and ends (``fastnli`` logger, INFO) and timed into the manifest's
    ``export_stages``.

    Args:
        model: a HF hub id (e.g. ``"microsoft/deberta-large-mnli"``) or a local checkpoint directory.
        out_dir: artifact directory; written atomically (an existing artifact there is replaced).
        precisions: any of ``"fp32"``, ``"fp16"``, ``"int8"``; fp32 is always exported, as the other two are derived
            from it. Default None: the precisions ``device`` runs (CPU: fp32 + int8; CUDA: fp32 + fp16).
        opset: ONNX opset (default: optimum's choice for the architecture).
        validate: score the probe set with PyTorch fp32 and every graph and record the agreement (default True).
        int8_recipe: overrides :data:`fastnli.exporter.precision.INT8_RECIPE` (e.g. ``op_types`` with ``"Gather"`` to
            quantize the embedding tables too, as the embedded default model does to fit its size budget).
        calibration_pairs: (premise, hypothesis) pairs the INT8 recipes that calibrate (``"outliers"``,
            ``"method": "static"``) measure activations on (default: the built-in probe set); unused by the others.
        device: the device the artifact is for when ``precisions`` is None: ``"auto"`` (default: CUDA when this
            machine's ONNX Runtime lists it and a GPU is present, else CPU), ``"cpu"`` or ``"cuda"``.
        progress: show the stages as a rich progress bar on stderr (default False).
        relative_shift: export DeBERTa v1's position terms as a relative shift instead of gathers where that is
            exact (v1 with a relative span of at least the longest input, as deberta-large-mnli;
            :mod:`fastnli.exporter.attention`; recorded in the fp32 recipe). Default True: the same function, long
            pairs measured 0.87-0.89x the time on INT8 and 0.80x on fp32 (docs/benchmarks.md).
        position_window: where the shift does not apply, export DeBERTa's position terms with the projections of
            the whole relative-position table (constants ORT folds) and, on v2/v3, on the rows each input reaches
            instead of all ``2 * position_buckets`` (:mod:`fastnli.exporter.attention`; recorded in the fp32
            recipe). Default True: the same function, short v2/v3 pairs measured 0.67x the time on INT8.

    Returns:
        The written manifest.
    """
    wanted = export_precisions(precisions, device)
    _require_export_deps()
    ckpt, source = resolve_checkpoint(model)
    config = json.loads((ckpt / "config.json").read_text())
    columns = canonical_columns(config.get("id2label") or {})  # refuse a non-NLI head before any work

    from optimum.exporters.onnx import main_export
    from transformers import AutoTokenizer

    out = Path(out_dir).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(out.parent)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    logger.info("exporting %s as %s to %s", source, "+".join(wanted), out)
    try:
        with Stages(f"export of {ckpt.name}", planned_stages(wanted, validate), progress) as stages:
            t0 = time.perf_counter()
            with stages.stage("checkpoint hash"):
                src_hash = checkpoint_hash(ckpt)
            with stages.stage("fp32 graph (optimum)"):
                export_dir = tmp / "_optimum"
                attention = attention_recipe(config, relative_shift, position_window)  # which patch applies, if any
                with relative_shift_export(config if attention == SHIFT_RECIPE else {}), \
                        position_window_export(config if attention == WINDOW_RECIPE else {}):
                    main_export(str(ckpt), output=export_dir, task="text-classification", opset=opset,
                                device="cpu", do_validation=False, no_post_process=True)
                os.replace(export_dir / "model.onnx", tmp / GRAPH_FILES["fp32"])
                shutil.rmtree(export_dir)
            with stages.stage("tokenizer"):
                hf_tok = AutoTokenizer.from_pretrained(ckpt)
                hf_tok.save_pretrained(tmp)
                if not (tmp / "tokenizer.json").is_file():
                    raise ValueError(f"{source}: its tokenizer has no fast (tokenizer.json) form; fastnli needs one")
                pad_id = int(hf_tok.pad_token_id if hf_tok.pad_token_id is not None else 0)
                max_length = int(min(getattr(hf_tok, "model_max_length", 512) or 512,
                                     config.get("max_position_embeddings", 512) or 512))

                import onnx

                fp32_model = onnx.load(str(tmp / GRAPH_FILES["fp32"]), load_external_data=False)
                graph_opset = max(o.version for o in fp32_model.opset_import if o.domain in ("", "ai.onnx"))
                inputs = [i.name for i in fp32_model.graph.input]
                del fp32_model
            recipes: dict[str, dict[str, Any]] = {"fp32": {"exporter": "optimum-onnx main_export",
                                                           "task": "text-classification"}}
            if attention:
                recipes["fp32"]["attention"] = attention
            if "fp16" in wanted:
                with stages.stage("fp16 graph"):
                    recipes["fp16"] = to_fp16(tmp / GRAPH_FILES["fp32"], tmp / GRAPH_FILES["fp16"])
            if "int8" in wanted:
                with stages.stage("int8 graph"):
                    feeds = None
                    if needs_calibration(int8_recipe):
                        pairs = calibration_pairs or probe_pairs()
                        feeds = calibration_feeds(PairTokenizer(tmp / "tokenizer.json", max_length), pairs, inputs,
                                                  pad_id)
                    recipes["int8"] = to_int8(tmp / GRAPH_FILES["fp32"], tmp / GRAPH_FILES["int8"], int8_recipe,
                                              feeds)
                    if feeds is not None:
                        recipes["int8"]["calibration_pairs"] = len(pairs)

            entries: dict[str, PrecisionEntry] = {}
            validations: dict[str, Validation] = {}
            if validate:
                pairs = probe_pairs()
                with stages.stage("PyTorch fp32 reference"):
                    ref = _torch_probs(ckpt, pairs, columns, max_length)
                ptok = PairTokenizer(tmp / "tokenizer.json", max_length)
                for p in wanted:
                    with stages.stage(f"validate {p}"):
                        got, secs = onnx_probs(tmp / GRAPH_FILES[p], ptok, pairs, columns, pad_id)
                        validations[p] = _validation(ref, got, secs)
                        logger.info("%s vs PyTorch fp32: max |dprob| %.2e, argmax agreement %.4f", p,
                                    validations[p].max_abs_dprob, validations[p].argmax_agreement)
            with stages.stage("hashes + manifest"):
                for p in wanted:
                    f = tmp / GRAPH_FILES[p]
                    entries[p] = PrecisionEntry(file=f.name, bytes=f.stat().st_size, sha256=sha256_file(f),
                                                validation=validations.get(p), recipe=recipes[p])
                tok_files = sorted(n for n in _TOKENIZER_FILES if (tmp / n).is_file())
                import hashlib

                art = hashlib.sha256(src_hash.encode())
                for p in wanted:
                    art.update(entries[p].sha256.encode())
                art.update(sha256_file(tmp / "tokenizer.json").encode())
                manifest = Manifest(
                    source=source, source_hash=src_hash, model_type=str(config.get("model_type", "")),
                    id2label={str(k): str(v) for k, v in config["id2label"].items()}, columns=columns,
                    max_length=max_length, inputs=inputs, pad_token_id=pad_id, tokenizer_files=tok_files,
                    opset=graph_opset, versions=_versions(), precisions=entries, artifact_hash=art.hexdigest(),
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                )
            manifest.export_stages = stages.record()
            (tmp / MANIFEST_NAME).write_text(manifest.to_json())
            _place(tmp, out)
        logger.info("exported %s to %s in %.1f s", source, out, time.perf_counter() - t0)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
