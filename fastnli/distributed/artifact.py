"""Export once, load everywhere: how an export artifact reaches the engines of Ray actors.

The driver resolves the model to one export artifact (exporting a HF checkpoint once, into the cache) before any
actor starts; actors only ever *load* it. It reaches them either by **path** (a single-node cluster or a shared
filesystem) or through Ray's **object store**: the driver puts the manifest, the tokenizer files and the graphs the
actors will run (not every precision of the artifact) into the object store once, and each node writes them to a
local directory the first time an actor there needs them (written to a temporary sibling and renamed into place,
so actors of one node share one copy and an interrupted copy never loads).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastnli.engine.engine import cache_root
from fastnli.engine.manifest import MANIFEST_NAME, Manifest, read_manifest

logger = logging.getLogger("fastnli")

ShareArg = Literal["auto", "path", "object_store"]


@dataclass(frozen=True)
class SharedArtifact:
    """An export artifact as Ray actors receive it (made by :func:`share_artifact` on the driver).

    Attributes:
        path: the artifact directory on the driver.
        artifact_hash: the manifest's ``artifact_hash``: a copy is used only when its manifest carries the same one.
        precisions: the graphs the actors may load (the others are not shipped through the object store).
        files: file name -> Ray ``ObjectRef`` of the file's bytes, when shared through the object store; else None.
        local_dir: where a node writes object-store copies (None: ``<FASTNLI_CACHE>/ray-artifacts`` of that node).
    """

    path: str
    artifact_hash: str
    precisions: tuple[str, ...]
    files: dict[str, Any] | None = None
    local_dir: str | None = None

    def open(self) -> Path:
        """The artifact directory to load on this node: this node's copy of the object-store files (written on
        first use) when the artifact travelled that way, else the driver's path.

        Raises:
            FileNotFoundError: when the artifact was shared by path and this node does not see it there.
        """
        if self.files is not None:
            root = Path(self.local_dir) if self.local_dir else cache_root() / "ray-artifacts"
            return _materialize(root / self.artifact_hash[:24], self.artifact_hash, self.files)
        here = Path(self.path)
        if not _has_artifact(here, self.artifact_hash):
            raise FileNotFoundError(
                f"the export artifact {self.path} (hash {self.artifact_hash[:12]}) is not visible on this Ray node; "
                "put it on a filesystem every node mounts at that path, or pass share='object_store'")
        return here


def _has_artifact(path: Path, artifact_hash: str) -> bool:
    try:
        return read_manifest(path).artifact_hash == artifact_hash
    except (FileNotFoundError, ValueError, OSError):
        return False


def _materialize(target: Path, artifact_hash: str, files: dict[str, Any]) -> Path:
    import ray

    if _has_artifact(target, artifact_hash):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in sorted(files, key=lambda n: n == MANIFEST_NAME):  # the manifest last
            (tmp / name).write_bytes(ray.get(files[name]))
        try:
            os.rename(tmp, target)
        except OSError:  # another actor of this node finished first
            if not _has_artifact(target, artifact_hash):
                raise
        else:
            logger.info("wrote the object-store copy of artifact %s to %s", artifact_hash[:12], target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _graph_files(artifact_dir: Path, manifest: Manifest, precisions: Iterable[str]) -> list[str]:
    """The graph files of ``precisions`` with any external-data files beside them (``<graph>.data``, ...)."""
    names: list[str] = []
    for prec in precisions:
        graph = manifest.precisions[prec].file
        names.append(graph)
        names += sorted(p.name for p in artifact_dir.iterdir() if p.name.startswith(graph) and p.name != graph)
    return names


def _reduced_manifest(artifact_dir: Path, precisions: tuple[str, ...]) -> bytes:
    """The manifest with only the shipped precisions (a copy that lists a graph it lacks would not load)."""
    data = json.loads((artifact_dir / MANIFEST_NAME).read_text())
    data["precisions"] = {k: v for k, v in data["precisions"].items() if k in precisions}
    return json.dumps(data, indent=2, sort_keys=True).encode()


def share_artifact(artifact_dir: str | Path, precisions: Iterable[str], share: ShareArg = "auto",
                   local_dir: str | Path | None = None) -> SharedArtifact:
    """Prepare an artifact for Ray actors (call on the driver, after ``ray.init``).

    Args:
        artifact_dir: an export artifact directory (``fastnli export``).
        precisions: the graphs actors may load, e.g. ``("fp16", "int8")`` for GPU actors with a CPU fallback.
        share: ``"path"`` (actors read ``artifact_dir``: one node, or a shared filesystem), ``"object_store"`` (the
            files travel through Ray's object store), or ``"auto"`` (default: path when the cluster has one node,
            else object store).
        local_dir: where nodes write object-store copies (default: ``<FASTNLI_CACHE>/ray-artifacts`` per node).

    Raises:
        ValueError: for an unknown ``share``, or a precision the artifact lacks.
    """
    import ray

    if share not in ("auto", "path", "object_store"):
        raise ValueError(f"share={share!r} is not supported; use 'auto', 'path' or 'object_store'")
    path = Path(artifact_dir).resolve()
    manifest = read_manifest(path)
    wanted = tuple(dict.fromkeys(precisions))
    missing = [p for p in wanted if p not in manifest.precisions]
    if missing:
        raise ValueError(f"the artifact {path} has no {missing} graph (it has {sorted(manifest.precisions)}); "
                         "re-export it with those precisions")
    if share == "auto":
        alive = [n for n in ray.nodes() if n.get("Alive")]
        share = "path" if len(alive) <= 1 else "object_store"
    files = None
    if share == "object_store":
        names = [*manifest.tokenizer_files, *_graph_files(path, manifest, wanted)]
        files = {name: ray.put((path / name).read_bytes()) for name in names}
        files[MANIFEST_NAME] = ray.put(_reduced_manifest(path, wanted))
        logger.info("artifact %s shared through the object store (%s, %.1f MB)", path.name, ", ".join(wanted),
                    sum((path / n).stat().st_size for n in names) / 1e6)
    return SharedArtifact(path=str(path), artifact_hash=manifest.artifact_hash, precisions=wanted, files=files,
                          local_dir=str(local_dir) if local_dir is not None else None)
