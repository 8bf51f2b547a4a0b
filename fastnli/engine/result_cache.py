"""A thread-safe LRU cache of per-pair model results, bounded by entry count and by memory.

Keys are ``(artifact_hash, premise, hypothesis)``; the engine's first element is the artifact hash with the precision
and INT8 kernel mode it runs (``<hash>/int8/exact-int8``), which ties a result to the graph and kernels that produced
it, so one cache can serve several models and precisions without mixing their results.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["ENTRY_OVERHEAD_BYTES", "ResultCache"]

#: Bytes charged per entry on top of its key strings and value: the OrderedDict node, the key tuple, the ndarray
#: header (an estimate of CPython's real cost, so that ``max_bytes`` bounds the real footprint roughly).
ENTRY_OVERHEAD_BYTES = 256

CacheKey = tuple[str, str, str]


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _key_bytes(key: CacheKey) -> int:
    return _utf8_len(key[0]) + _utf8_len(key[1]) + _utf8_len(key[2])


def _check_key(key: object, i: int) -> CacheKey:
    if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(s, str) for s in key)):
        raise TypeError(
            f"keys[{i}] must be a tuple (artifact_hash, premise, hypothesis) of 3 str, got {key!r:.80}"
        )
    return key  # type: ignore[return-value]


class ResultCache:
    """LRU cache mapping ``(artifact_hash, premise, hypothesis)`` to one result row (e.g. the 3 NLI probabilities).

    Both bounds always hold after :meth:`put_many`: at most ``max_entries`` entries and at most ``max_bytes`` bytes,
    where an entry's size is the UTF-8 length of its three key strings + its value's ``nbytes`` +
    :data:`ENTRY_OVERHEAD_BYTES`. The least recently used entries (by :meth:`get_many` hit or :meth:`put_many`) are
    evicted first. An entry larger than ``max_bytes`` on its own is not stored. All methods are thread-safe.

    Args:
        max_entries: entry limit (default 100,000), ``>= 1``.
        max_bytes: memory limit in bytes (default 256 MiB), ``>= 1``.

    Attributes:
        hits, misses: lookups by :meth:`get_many` that found / did not find their key.
        evictions: entries dropped to honour the bounds.
    """

    def __init__(self, max_entries: int = 100_000, max_bytes: int = 256 * 2**20) -> None:
        for name, value in (("max_entries", max_entries), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[CacheKey, tuple[np.ndarray, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def entries(self) -> int:
        """Number of cached entries."""
        return len(self._data)

    @property
    def nbytes(self) -> int:
        """Accounted size of the cached entries in bytes (see the class docstring)."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return (
            f"ResultCache(entries={self.entries}/{self.max_entries}, nbytes={self._nbytes}/{self.max_bytes}, "
            f"hits={self.hits}, misses={self.misses}, evictions={self.evictions})"
        )

    def get_many(self, keys: Sequence[CacheKey]) -> list[np.ndarray | None]:
        """Look up ``keys``; returns one read-only row per key, or None where it is not cached.

        Found entries become the most recently used.
        """
        out: list[np.ndarray | None] = []
        with self._lock:
            data = self._data
            for key in keys:
                item = data.get(key)
                if item is None:
                    out.append(None)
                else:
                    data.move_to_end(key)
                    out.append(item[0])
            found = sum(1 for v in out if v is not None)
            self.hits += found
            self.misses += len(out) - found
        return out

    def put_many(self, keys: Sequence[CacheKey], values: np.ndarray) -> None:
        """Store ``values[i]`` (copied, read-only) under ``keys[i]``, replacing any old value, then evict the least
        recently used entries until both bounds hold.

        Args:
            keys: ``n`` keys ``(artifact_hash, premise, hypothesis)``.
            values: ``(n, K)`` array, one row per key.

        Raises:
            TypeError: a key is not a tuple of 3 str.
            ValueError: ``values`` is not 2-D or has a different number of rows than ``keys``.
        """
        vals = np.asarray(values)
        if vals.ndim != 2:
            raise ValueError(f"values must be 2-D (n, K), got shape {vals.shape}; use values.reshape(len(keys), -1)")
        if vals.shape[0] != len(keys):
            raise ValueError(f"values must have one row per key, got {vals.shape[0]} rows for {len(keys)} keys")
        prepared: list[tuple[CacheKey, np.ndarray, int]] = []
        for i, key in enumerate(keys):
            k = _check_key(key, i)
            row = vals[i].copy()  # its own buffer, so that evicting the entry frees exactly row.nbytes
            row.flags.writeable = False
            size = _key_bytes(k) + row.nbytes + ENTRY_OVERHEAD_BYTES
            if size <= self.max_bytes:
                prepared.append((k, row, size))
        with self._lock:
            data = self._data
            for k, row, size in prepared:
                old = data.pop(k, None)
                if old is not None:
                    self._nbytes -= old[1]
                data[k] = (row, size)
                self._nbytes += size
            while len(data) > self.max_entries or self._nbytes > self.max_bytes:
                _, (_, size) = data.popitem(last=False)
                self._nbytes -= size
                self.evictions += 1

    def clear(self, reset_stats: bool = False) -> None:
        """Drop every entry; with ``reset_stats`` also zero the hits, misses and evictions counters."""
        with self._lock:
            self._data.clear()
            self._nbytes = 0
            if reset_stats:
                self.hits = self.misses = self.evictions = 0
