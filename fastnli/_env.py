"""``FASTNLI_*`` environment settings, read when a setting is needed (never at import), with errors that name the
variable, its value and the fix.

Every setting of the package goes through these helpers: an unset or blank variable gives the default.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import overload

__all__ = ["env_choice", "env_flag", "env_float", "env_int", "env_str"]


def _raw(name: str) -> str | None:
    raw = os.environ.get(name)
    return None if raw is None or raw.strip() == "" else raw


def _where(sets: str | None) -> str:
    return f" (it sets {sets})" if sets else ""


def env_str(name: str, default: str | None = None) -> str | None:
    """The value of ``name`` with surrounding blanks removed, or ``default`` when unset or blank."""
    raw = _raw(name)
    return default if raw is None else raw.strip()


@overload
def env_int(name: str, default: int, minimum: int | None = None, sets: str | None = None) -> int: ...
@overload
def env_int(name: str, default: None, minimum: int | None = None, sets: str | None = None) -> int | None: ...
def env_int(name: str, default: int | None, minimum: int | None = None, sets: str | None = None) -> int | None:
    """``name`` as a whole number (``default`` when unset or blank), at least ``minimum`` when given.

    Raises:
        ValueError: naming the variable and its value, e.g. ``FASTNLI_THREADS='two' is not an integer; set it to a
            whole number such as 2, or unset it``.
    """
    raw = _raw(name)
    if raw is None:
        return default
    example = default if default else max(2, minimum or 0)
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer{_where(sets)}; set it to a whole number such as "
                         f"{example}, or unset it") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={raw!r} is below {minimum}{_where(sets)}; set it to {minimum} or more, or unset it")
    return value


@overload
def env_float(name: str, default: float, minimum: float | None = None, sets: str | None = None) -> float: ...
@overload
def env_float(name: str, default: None, minimum: float | None = None, sets: str | None = None) -> float | None: ...
def env_float(name: str, default: float | None, minimum: float | None = None,
              sets: str | None = None) -> float | None:
    """``name`` as a number (``default`` when unset or blank), at least ``minimum`` when given; errors as
    :func:`env_int`."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number{_where(sets)}; set it to a number such as "
                         f"{default if default else 1}, or unset it") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={raw!r} is below {minimum}{_where(sets)}; set it to {minimum} or more, or unset it")
    return value


def env_flag(name: str) -> bool | None:
    """``name`` as a switch: ``1``/``true``/``yes``/``on`` → True, ``0``/``false``/``no``/``off`` → False, unset,
    blank or ``auto`` → None (the caller decides)."""
    raw = _raw(name)
    value = "" if raw is None else raw.strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r} is not a switch; set it to 1 (on) or 0 (off), or unset it (auto)")


def env_choice(name: str, default: str, choices: Sequence[str]) -> str:
    """``name`` (lower-cased) as one of ``choices``, or ``default`` when unset or blank."""
    raw = _raw(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name}={raw!r} is not one of {listed}; set it to one of them, or unset it "
                         f"(default {default!r})")
    return value
