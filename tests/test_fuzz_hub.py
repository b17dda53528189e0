"""Generated hostile hub answers (a commit, ETags, X-Repo-Commit, sibling names and sizes drawn from
path-traversal pieces, absolute paths, control characters and numbers of every type): each ends in a
result or one SpecboundError line, and nothing outside the cache is created or changed.  Bounded:
a few examples against a live local server, more against the checks alone."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specbound
from specbound.errors import SpecboundError
from specbound.io import hub_answers
from support.fuzz import FUZZ, time_limit
from support.hub_server import HubServer, isolate_hub_environment, walk_outside
from support.numpy_bert import write_tiny_bert

pytest.importorskip("huggingface_hub")

REPO = "org/tiny-bert"
PIECES = [
    "..",
    ".",
    "/",
    "x",
    "a" * 40,
    "b" * 64,
    "\\",
    "\x00",
    "\n",
    "~",
    "C:",
    "%2e%2e",
    '"',
    "W/",
    "",
    "config.json",
    "snapshots",
    "blobs",
    "refs",
]
hostile_text = st.lists(st.sampled_from(PIECES), min_size=0, max_size=6).map("".join) | st.text(max_size=30)
any_json = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | hostile_text
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)

CHECKS = [
    (hub_answers.check_commit, hostile_text),
    (hub_answers.check_etag, hostile_text),
    (hub_answers.check_filename, hostile_text),
    (hub_answers.check_size, any_json),
]


def _stays_inside(value: str, etag: bool) -> bool:
    root = "/r/o/o/t"
    if etag:  # huggingface_hub's _normalize_etag: what it makes the blob's name
        value = value.lstrip("W/").strip('"')
    joined = os.path.normpath(os.path.join(root, value))
    return joined.startswith(root + "/") and "\\" not in value and "\x00" not in value


@settings(FUZZ, max_examples=200)
@given(st.sampled_from(range(len(CHECKS))).flatmap(lambda i: st.tuples(st.just(i), CHECKS[i][1])))
def test_checks_accept_only_what_stays_in_the_cache(case):
    index, value = case
    check = CHECKS[index][0]
    try:
        accepted = check(value, "http://127.0.0.1:1")
    except SpecboundError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("the hub server ")
        return
    if check is hub_answers.check_size:
        assert isinstance(accepted, int) and 0 <= accepted <= hub_answers.MAX_SIZE
    else:
        assert _stays_inside(accepted, check is hub_answers.check_etag), accepted


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("fuzz_hub") / "tiny", seed=12)


answer = st.one_of(
    st.tuples(st.just("info"), st.sampled_from(["sha"]), hostile_text),
    st.tuples(
        st.just("info"),
        st.just("siblings"),
        st.one_of(
            any_json,
            st.lists(st.fixed_dictionaries({"rfilename": hostile_text | any_json, "size": any_json}), max_size=3),
        ),
    ),
    st.tuples(
        st.just("header"),
        st.sampled_from(["ETag", "X-Linked-Etag", "X-Repo-Commit", "X-Linked-Size"]),
        hostile_text.filter(lambda t: t.isascii() and t.isprintable() and t == t.strip()),
    ),
)


@settings(FUZZ, max_examples=min(FUZZ.max_examples, 8))
@given(answer)
def test_hostile_answers_write_nothing_outside_the_cache(served, monkeypatch, case):
    where, key, value = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"  # its parent is this test's own: a /tmp/x of another program is no escape
        cache = root / "a" / "b" / "c" / "d" / "cache"
        cache.mkdir(parents=True)
        isolate_hub_environment(monkeypatch, root)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        patch = {key: value}
        before = walk_outside(root, cache)
        with HubServer(
            {REPO: served},
            info_patch=patch if where == "info" else None,
            header_patch=patch if where == "header" else None,
        ) as hub:
            monkeypatch.setenv("HF_ENDPOINT", hub.url)
            with time_limit():
                try:
                    specbound.analyze(REPO, threads=1)
                except SpecboundError as exc:
                    assert "\n" not in str(exc)
        assert walk_outside(root, cache) == before, case
        assert not (root.parent / "x").exists()
