"""Tests of the LRU result cache: order, both bounds, counters, copies, thread safety."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from fastnli.engine import ResultCache
from fastnli.engine.result_cache import ENTRY_OVERHEAD_BYTES

ART = "sha256:abc"


def key(i: int, art: str = ART) -> tuple[str, str, str]:
    return (art, f"premise {i}", f"hypothesis {i}")


def rows(*values: float) -> np.ndarray:
    return np.array([[v, 1.0 - v, 0.0] for v in values], dtype=np.float32)


def entry_size(k: tuple[str, str, str], width: int = 3, itemsize: int = 4) -> int:
    return sum(len(s.encode("utf-8")) for s in k) + width * itemsize + ENTRY_OVERHEAD_BYTES


def test_get_put_and_counters() -> None:
    cache = ResultCache()
    assert cache.get_many([key(0), key(1)]) == [None, None]
    assert (cache.hits, cache.misses, cache.entries, cache.nbytes) == (0, 2, 0, 0)
    cache.put_many([key(0), key(1)], rows(0.25, 0.5))
    got = cache.get_many([key(1), key(2), key(0)])
    assert got[1] is None
    assert got[0] is not None and got[2] is not None
    np.testing.assert_array_equal(got[0], rows(0.5)[0])
    np.testing.assert_array_equal(got[2], rows(0.25)[0])
    assert (cache.hits, cache.misses, cache.entries, len(cache)) == (2, 3, 2, 2)
    assert cache.nbytes == entry_size(key(0)) + entry_size(key(1))
    # keys are directed and include the artifact hash
    assert cache.get_many([(ART, "hypothesis 0", "premise 0"), key(0, art="sha256:other")]) == [None, None]


def test_stores_read_only_copies() -> None:
    cache = ResultCache()
    values = rows(0.25)
    cache.put_many([key(0)], values)
    values[0, 0] = 9.0  # the caller's buffer is reused
    got = cache.get_many([key(0)])[0]
    assert got is not None and got[0] == 0.25
    with pytest.raises(ValueError):
        got[0] = 1.0


def test_lru_order_and_entry_bound() -> None:
    cache = ResultCache(max_entries=3)
    cache.put_many([key(0), key(1), key(2)], rows(0, 0.1, 0.2))
    cache.get_many([key(0)])  # 0 becomes most recent: LRU order is now 1, 2, 0
    cache.put_many([key(3)], rows(0.3))
    assert cache.get_many([key(1)]) == [None]
    assert cache.evictions == 1 and cache.entries == 3
    cache.put_many([key(2)], rows(0.9))  # replacing refreshes recency and keeps the count
    assert cache.entries == 3 and cache.evictions == 1
    cache.put_many([key(4), key(5)], rows(0.4, 0.5))  # evicts 0 and 3, keeps 2
    present = [v is not None for v in cache.get_many([key(i) for i in range(6)])]
    assert present == [False, False, True, False, True, True]
    got = cache.get_many([key(2)])[0]
    assert got is not None and got[0] == np.float32(0.9)
    assert cache.evictions == 3


def test_byte_bound() -> None:
    one = entry_size(key(0))
    cache = ResultCache(max_entries=1000, max_bytes=3 * one + 1)
    cache.put_many([key(i) for i in range(5)], rows(*[i / 10 for i in range(5)]))
    assert cache.entries == 3 and cache.nbytes == 3 * one and cache.evictions == 2
    assert [v is not None for v in cache.get_many([key(i) for i in range(5)])] == [False, False, True, True, True]
    # wider values cost more bytes: one float64 row of width 40 replaces several small entries
    wide = np.zeros((1, 40), dtype=np.float64)
    big = entry_size(key(9), width=40, itemsize=8)
    cache = ResultCache(max_bytes=big + one)
    cache.put_many([key(0), key(1)], rows(0, 0.1))
    cache.put_many([key(9)], wide)
    assert cache.nbytes == big + one and cache.entries == 2 and cache.nbytes <= cache.max_bytes
    # an entry larger than the whole budget is not stored and evicts nothing
    cache.put_many([key(10)], np.zeros((1, 10_000)))
    assert cache.entries == 2 and cache.get_many([key(10)]) == [None]


def test_unicode_key_bytes() -> None:
    k = (ART, "Café crème", "東京")
    cache = ResultCache()
    cache.put_many([k], rows(0.1))
    assert cache.nbytes == len(ART) + len("Café crème".encode()) + len("東京".encode()) + 12 + ENTRY_OVERHEAD_BYTES


def test_clear() -> None:
    cache = ResultCache()
    cache.put_many([key(0)], rows(0.1))
    cache.get_many([key(0), key(1)])
    cache.clear()
    assert (cache.entries, cache.nbytes, cache.hits, cache.misses) == (0, 0, 1, 1)
    cache.clear(reset_stats=True)
    assert (cache.hits, cache.misses, cache.evictions) == (0, 0, 0)


def test_errors() -> None:
    with pytest.raises(ValueError, match=re.escape("max_entries must be >= 1, got 0")):
        ResultCache(max_entries=0)
    with pytest.raises(TypeError, match=re.escape("max_bytes must be an int, got float 1.5")):
        ResultCache(max_bytes=1.5)  # type: ignore[arg-type]
    cache = ResultCache()
    with pytest.raises(ValueError, match=re.escape("values must have one row per key, got 1 rows for 2 keys")):
        cache.put_many([key(0), key(1)], rows(0.1))
    with pytest.raises(ValueError, match=re.escape("values must be 2-D (n, K), got shape (3,)")):
        cache.put_many([key(0)], rows(0.1)[0])
    with pytest.raises(
        TypeError,
        match=re.escape("keys[1] must be a tuple (artifact_hash, premise, hypothesis) of 3 str, got ('a', 'b')"),
    ):
        cache.put_many([key(0), ("a", "b")], rows(0.1, 0.2))  # type: ignore[list-item]
    assert cache.entries == 0  # a bad batch stores nothing


def test_thread_safety_smoke() -> None:
    cache = ResultCache(max_entries=50, max_bytes=50 * entry_size(key(0)) + 10_000)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                ids = rng.integers(0, 120, size=8)
                keys = [key(int(i)) for i in ids]
                got = cache.get_many(keys)
                for i, g in zip(ids, got, strict=True):
                    assert g is None or g[0] == np.float32(i)
                cache.put_many(keys, np.array([[i, 0.0, 0.0] for i in ids], dtype=np.float32))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.entries <= 50 and cache.nbytes <= cache.max_bytes
    assert cache.hits + cache.misses == 4 * 200 * 8
    stored = cache.get_many(list(cache._data))
    assert cache.nbytes == sum(entry_size(k) for k in cache._data) and all(v is not None for v in stored)


def test_engines_sharing_a_cache_get_their_own_results(art_bert) -> None:  # type: ignore[no-untyped-def]
    """One artifact's fp32 and INT8 graphs (and INT8 kernel modes) give different numbers: a shared cache must
    not hand one engine another's results."""
    from fastnli.engine import NLIEngine, SessionConfig

    pairs = [(f"premise number {i} about a dog", f"hypothesis {i} about a cat") for i in range(12)]
    want = {p: NLIEngine(art_bert, device="cpu", precision=p).predict(pairs) for p in ("fp32", "int8")}
    assert not np.array_equal(want["fp32"], want["int8"])
    cache = ResultCache(max_entries=1000)
    engines = {p: NLIEngine(art_bert, device="cpu", precision=p, result_cache=cache) for p in ("fp32", "int8")}
    for p in ("fp32", "int8"):
        np.testing.assert_array_equal(engines[p].predict(pairs), want[p])
        assert engines[p].last_stats.cache_hits == 0
    for p in ("fp32", "int8"):  # second calls: served from the cache, still each its own
        np.testing.assert_array_equal(engines[p].predict(pairs), want[p])
        assert engines[p].last_stats.cache_hits == len(pairs)
    modes = [NLIEngine(art_bert, device="cpu", precision="int8", result_cache=cache,
                       session_config=SessionConfig(exact_int8=exact)) for exact in (True, False)]
    assert [m.exact_int8 for m in modes] == [True, False] and not engines["fp32"].exact_int8  # what each runs
    modes[0].predict(pairs)
    modes[1].predict(pairs)
    assert modes[0].last_stats.cache_hits + modes[1].last_stats.cache_hits == len(pairs)  # one mode is the default's
