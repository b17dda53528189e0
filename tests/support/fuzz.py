"""What every fuzz test asserts: a hostile input ends in a result or in one SpecboundError line, never
in another exception (a traceback), a hang or an allocation its file cannot back."""

from __future__ import annotations

import contextlib
import os
import signal

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from specbound.errors import SpecboundError

# Each example must finish within this many seconds (a hang fails the test instead of stalling CI).
EXAMPLE_SECONDS = 20
# The whole suite runs in well under a minute on one core: a few dozen examples per test, the same
# ones every run (CI must not flake).  A long local hunt draws new ones:
#   SPECBOUND_FUZZ_EXAMPLES=2000 SPECBOUND_FUZZ_RANDOM=1 python -m pytest tests/fuzz
# and every failure it finds becomes a file in tests/fuzz/corpus/ (test_fuzz_corpus.py).
FUZZ = settings(
    max_examples=int(os.environ.get("SPECBOUND_FUZZ_EXAMPLES", 25)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=not os.environ.get("SPECBOUND_FUZZ_RANDOM"),
    database=None,
)


@contextlib.contextmanager
def time_limit(seconds: float = EXAMPLE_SECONDS):
    """Fail (rather than hang) when the block runs longer than ``seconds`` (main thread, Unix)."""

    def expired(signum, frame):
        raise TimeoutError(f"a fuzz example ran for more than {seconds} s (a hang?)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def clean_outcome(call, *args, **kwargs):
    """``call(*args, **kwargs)``: its result, or the SpecboundError it raised (checked to be one
    non-empty line); any other exception propagates and fails the test."""
    with time_limit():
        try:
            return call(*args, **kwargs)
        except SpecboundError as exc:
            message = str(exc)
            assert message and "\n" not in message, repr(message)
            assert "Traceback" not in message
            return exc


# A JSON value of any shape (the documents a hostile file may hold).
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def mutate(data: bytes, edits) -> bytes:
    """Apply ``(kind, position, value)`` edits: overwrite a byte, truncate, or insert bytes."""
    out = bytearray(data)
    for kind, position, value in edits:
        at = position % (len(out) + 1)
        if kind == "set" and out:
            out[at % len(out)] = value[0] if value else 0
        elif kind == "truncate":
            del out[at:]
        else:
            out[at:at] = value
    return bytes(out)


EDITS = st.lists(
    st.tuples(st.sampled_from(["set", "truncate", "insert"]), st.integers(0, 2**31), st.binary(min_size=1, max_size=8)),
    min_size=1,
    max_size=4,
)
