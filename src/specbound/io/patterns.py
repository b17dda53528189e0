"""Regular expressions that come from files (a family spec's ``ignore`` patterns, a
compressed-tensors config's ``re:`` targets), compiled and matched so that a bad one is a one-line
error, never a traceback or a hang: they are compiled and matched with the ``regex`` module, whose
matcher can be interrupted, and a match taking more than :data:`PATTERN_TIMEOUT` seconds is refused.
A real pattern takes microseconds; a catastrophically backtracking one (``^(\\w+\\.?)+:$`` in
Python's ``re``) takes minutes per name."""

from __future__ import annotations

import regex

PATTERN_TIMEOUT = 0.25


def compile_pattern(pattern: str) -> regex.Pattern:
    """``pattern`` compiled; a ValueError saying why when it is not a regular expression."""
    try:
        return regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression ({exc})") from None


def bounded_search(pattern: regex.Pattern, text: str, anchored: bool = False) -> bool:
    """Whether ``pattern`` is found in ``text`` (at its start when ``anchored``, as ``re.match``);
    a ValueError when the search takes more than :data:`PATTERN_TIMEOUT` seconds."""
    try:
        found = (pattern.match if anchored else pattern.search)(text, timeout=PATTERN_TIMEOUT)
    except TimeoutError:
        raise ValueError(
            f"pattern {pattern.pattern!r} takes more than {PATTERN_TIMEOUT} s on {text!r} "
            f"(catastrophic backtracking, e.g. a repeated group that can match the same text in many "
            f"ways); anchor it and avoid nested repeats"
        ) from None
    return found is not None
