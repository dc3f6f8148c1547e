"""Integers given as text (an option, a shape ``204_640_360``, a mesh ``2x8``): ASCII digits
only, and bounded before they are converted.

Python's ``int()`` takes any Unicode digit (``"٣"`` is 3) and refuses more than 4,300 digits
with a ``ValueError`` that names neither the option nor the limit; ``parse_int`` takes what a
user types on purpose and says in one short reason what was expected.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_int(text: str, *, minimum: int, maximum: int) -> int:
    """The integer ``text`` spells in ASCII digits (with an optional sign), from ``minimum`` to
    ``maximum``; else ``ValueError`` whose message is the reason, e.g. ``"must be at most 1024"``
    (the caller names the option and the value)."""
    raw = str(text)
    if not _INTEGER.fullmatch(raw):
        raise ValueError("expected an integer in ASCII digits")
    negative = raw.startswith("-")
    digits = raw.lstrip("+-").lstrip("0") or "0"
    bound = minimum if negative else maximum
    if len(digits) > len(str(abs(bound))) + 1:  # far beyond the bound: never converted
        raise ValueError(f"must be at least {minimum}" if negative else f"must be at most {maximum}")
    number = -int(digits) if negative else int(digits)
    if number < minimum:
        raise ValueError(f"must be at least {minimum}")
    if number > maximum:
        raise ValueError(f"must be at most {maximum}")
    return number


def brief(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters (a 5,000-digit number in a message
    would drown the reason)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 12]}...({len(text)} chars)"
