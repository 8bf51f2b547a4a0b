"""The export artifact's ``manifest.json``: what was exported, from what, with which tools, and how well it agrees.

An artifact directory is loadable only when it holds a ``manifest.json`` whose ``complete`` field is true and
whose graph files exist inside the directory (a name that is absolute or climbs out with ``..`` is refused). The export writes the manifest last, inside a temporary directory that is renamed into place, so an
interrupted export never leaves a loadable directory. A graph is used only when its size and sha256 are the ones the
manifest records (:func:`verify_graph`; a file already verified is not hashed again while its size and modification
time stay the same).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")

#: The graphs a device runs, which an export made for it holds: the CPU runs INT8 (fp32 when INT8 misses its agreement
#: gate), CUDA runs FP16 with fp32 as its reference (and its CPU fallback).
DEVICE_PRECISIONS: dict[str, tuple[str, ...]] = {"cpu": ("fp32", "int8"), "cuda": ("fp32", "fp16")}


def precisions_for(device: str, precision: str = "auto") -> tuple[str, ...]:
    """The graphs an artifact needs for an engine on ``device`` (``"cpu"`` or ``"cuda"``) running ``precision``.

    ``precision="auto"`` gives the device's :data:`DEVICE_PRECISIONS`; a named precision gives fp32 (the reference
    every other graph is derived from and validated against) and that one. Order follows :data:`PRECISIONS`.

    Raises:
        ValueError: for a device or precision fastnli does not know, naming the valid ones.
    """
    if device not in DEVICE_PRECISIONS:
        raise ValueError(f"device={device!r} has no precision set; use one of {sorted(DEVICE_PRECISIONS)} (resolve "
                         "'auto' first)")
    if precision == "auto":
        return DEVICE_PRECISIONS[device]
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported; use 'auto' or one of {list(PRECISIONS)}")
    return tuple(p for p in PRECISIONS if p in ("fp32", precision))

#: Files of a HF checkpoint that determine its outputs (hashed into ``source_hash``).
_HASHED_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.json",
                 "merges.txt", "spm.model", "tokenizer_config.json", "special_tokens_map.json")


@dataclass
class Validation:
    """Agreement of one precision with PyTorch fp32 on the probe set (probabilities in [0, 1])."""

    n_pairs: int
    max_abs_dprob: float
    mean_abs_dprob: float
    argmax_agreement: float  # share of probe pairs with the same argmax label, in [0, 1]
    seconds: float  # time to score the probe set on CPU with this graph


@dataclass
class PrecisionEntry:
    """One exported graph."""

    file: str
    bytes: int
    sha256: str
    validation: Validation | None = None
    recipe: dict[str, Any] = field(default_factory=dict)


@dataclass
class Manifest:
    """Everything needed to load, trust and reproduce an export artifact."""

    source: str
    source_hash: str
    model_type: str
    id2label: dict[str, str]
    columns: list[int]  # logit column of contradiction, neutral, entailment
    max_length: int
    inputs: list[str]  # graph input names, e.g. ["input_ids", "attention_mask"]
    pad_token_id: int
    tokenizer_files: list[str]
    opset: int
    versions: dict[str, str]
    precisions: dict[str, PrecisionEntry]
    artifact_hash: str = ""
    #: how the model reads an answer with its question (fastnli.scorers.questions), when it was trained so
    question_format: str | None = None
    #: how the model reads long premises, when it was measured to read them better than ``WindowPolicy()``:
    #: :class:`fastnli.engine.windows.WindowPolicy` fields (the engine's default policy)
    window_policy: dict[str, Any] | None = None
    #: whether scorers rewrite a hypothesis's quantities in the premise's units for this model by default
    #: (:func:`fastnli.scorers.units.align_units`), when it was measured to judge pairs better so
    align_units: bool = False
    #: the export's stages in order, ``{"stage": name, "seconds": wall-clock s, "cpu_seconds": the export process's
    #: CPU s}`` (empty for artifacts written before stages were timed)
    export_stages: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    created: str = ""
    complete: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        precisions = {}
        for name, entry in data.pop("precisions").items():
            entry = dict(entry)
            val = entry.pop("validation", None)
            precisions[name] = PrecisionEntry(validation=Validation(**val) if val else None, **entry)
        return cls(precisions=precisions, **data)


def read_manifest(artifact_dir: str | Path) -> Manifest:
    """Read and check an artifact's manifest.

    Raises:
        FileNotFoundError: when the directory has no ``manifest.json`` (not an export artifact, or an interrupted
            export).
        ValueError: when the manifest is incomplete, of an unknown format version, or names a missing graph file.
    """
    path = Path(artifact_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {artifact_dir} is not a fastnli export artifact (create one "
                                "with `fastnli export MODEL --out DIR`)")
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a readable manifest ({exc}); re-run the export") from None
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {data.get('format_version')!r} is not supported (this fastnli "
                         f"reads version {FORMAT_VERSION}); re-export the model with this fastnli version")
    try:
        manifest = Manifest.from_dict(data)
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path} is malformed ({type(exc).__name__}: {exc}); re-run the export") from None
    if not manifest.complete:
        raise ValueError(f"{path}: the export did not complete; re-run `fastnli export`")
    if not isinstance(manifest.align_units, bool):
        raise ValueError(f"{path}: field 'align_units' must be true or false; got {manifest.align_units!r}")
    for name, entry in manifest.precisions.items():
        if not artifact_file(artifact_dir, entry.file, f"{path}: precision {name!r}").is_file():
            raise ValueError(f"{path}: precision {name!r} names {entry.file!r}, which is missing; re-run the export")
    for name in manifest.tokenizer_files:
        artifact_file(artifact_dir, name, f"{path}: tokenizer_files")
    return manifest


def artifact_file(artifact_dir: str | Path, name: str, where: str) -> Path:
    """The path of the file ``name`` of an artifact; ValueError (naming ``where``) when ``name`` is absolute or
    climbs out with ``..``: a manifest never makes the engine read a file it does not name inside the directory (a
    link placed in the directory is the directory owner's choice, and a graph's content is verified anyway)."""
    rel = Path(name)
    if rel.is_absolute() or rel.drive or ".." in rel.parts:
        raise ValueError(f"{where} names {name!r}, which is outside the artifact directory {Path(artifact_dir)}; a "
                         "manifest may only name files inside it: re-export the model")
    return Path(artifact_dir) / rel


#: (resolved path, size, mtime in ns) -> sha256 of the graphs verified in this process
_VERIFIED: dict[tuple[str, int, int], str] = {}
_VERIFIED_LOCK = threading.Lock()


def verify_graph(artifact_dir: str | Path, entry: PrecisionEntry) -> Path:
    """The graph file of ``entry``, after checking that its size and sha256 are the manifest's.

    The hash (about 1 s per GB) is computed once per file version: while a file keeps its size and modification
    time, a later load in the same process trusts the earlier result.

    Raises:
        ValueError: the file is outside the artifact, or its size or sha256 differ from the manifest's (the graph
            was edited, truncated or replaced after export): re-export the model.
    """
    path = artifact_file(artifact_dir, entry.file, f"{Path(artifact_dir) / MANIFEST_NAME}")
    st = path.stat()
    if st.st_size != entry.bytes:
        raise ValueError(f"{path} is {st.st_size} bytes but the manifest records {entry.bytes}: the graph was "
                         "truncated or replaced after export; re-export the model (`fastnli export`)")
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(key)
    digest = known or sha256_file(path)
    if digest != entry.sha256:
        raise ValueError(f"{path} has sha256 {digest[:16]}… but the manifest records {entry.sha256[:16]}…: the graph "
                         "was changed after export, so its results would not be the artifact's; re-export the model "
                         "(`fastnli export`)")
    with _VERIFIED_LOCK:
        _VERIFIED[key] = digest
    return path


def looks_like_local_path(name: str | Path) -> bool:
    """True when ``name`` reads as a filesystem path rather than a HF hub id (``"name"`` or ``"org/name"``): it starts
    with ``.``, ``/``, ``~`` or ``\\``, holds a backslash or a drive letter, ends with ``/``, or holds more than one
    ``/`` (a hub id holds at most one)."""
    text = str(name)
    return (text.startswith((".", "/", "~", "\\")) or "\\" in text or text.endswith("/") or text.count("/") > 1
            or (len(text) > 1 and text[1] == ":" and text[0].isalpha()))


def check_local_path(name: str | Path) -> None:
    """Raise FileNotFoundError when ``name`` reads as a local path (:func:`looks_like_local_path`) that does not
    exist, so that a mistyped directory is reported as such instead of being looked up on the model hub."""
    path = Path(name).expanduser()
    if looks_like_local_path(name) and not path.exists():
        raise FileNotFoundError(f"model {str(name)!r} does not exist: {path.absolute()} is not a file or directory "
                                "(a name that starts with '.', '/' or '~' is a local path; a HF hub id reads "
                                "'org/name'); check the path, or export a model with `fastnli export MODEL --out DIR`")


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checkpoint_hash(checkpoint_dir: str | Path) -> str:
    """SHA-256 over a HF checkpoint's config, weights and tokenizer files (names and contents, sorted by name)."""
    root = Path(checkpoint_dir)
    h = hashlib.sha256()
    found = False
    for name in sorted(_HASHED_FILES):
        p = root / name
        if p.is_file():
            found = True
            h.update(name.encode())
            h.update(sha256_file(p).encode())
    for p in sorted(root.glob("model-*.safetensors")) + sorted(root.glob("pytorch_model-*.bin")):
        found = True
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    if not found:
        raise FileNotFoundError(f"{root} holds no config, weights or tokenizer files: not a HF checkpoint directory")
    return h.hexdigest()
