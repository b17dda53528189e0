"""A hostile hub server (HF_ENDPOINT at 127.0.0.1) and a hostile cache: every answer that would become
a path outside the cache is refused in one line before huggingface_hub writes anything, and a walk of
the file system around the cache (its parents up to the test's folder, the working directory, the
output folder) finds nothing created or changed outside it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support.hub_server import HubServer, isolate_hub_environment, walk_outside
from support.numpy_bert import write_tiny_bert
from support.one_line import assert_one_line_error, run_cli

import specbound
from specbound.cli import main
from specbound.errors import SpecboundError
from specbound.io.hub_errors import show_details

pytest.importorskip("huggingface_hub")

REPO = "org/tiny-bert"
SHA = "a" * 40


@pytest.fixture
def world(tmp_path, monkeypatch):
    """``(root, cache)``: the cache four folders below ``root``, so that ``../../../../x`` from the
    cache's deepest folders still lands inside ``root``, where the walk sees it."""
    root = tmp_path / "root"
    cache = root / "a" / "b" / "c" / "d" / "cache"
    cache.mkdir(parents=True)
    isolate_hub_environment(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    work = root / "work"
    work.mkdir()
    (work / "keep.txt").write_text("the user's file")
    monkeypatch.chdir(work)
    return root, cache


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("served") / "tiny", seed=11)


def _refused(root, cache, needles, call):
    before = walk_outside(root, cache)
    with pytest.raises(SpecboundError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    assert walk_outside(root, cache) == before, "a file outside the cache was created or changed"
    assert not (root.parent / "x").exists() and not Path("/x").exists()
    return message


HOSTILE_INFO = {
    "relative sha": ({"sha": "../../../../x"}, "the commit"),
    "absolute sha": ({"sha": "ABSOLUTE"}, "the commit"),
    "no sha": ({"sha": None}, "the commit"),
    "siblings an object": ({"siblings": {"config.json": {"size": 3}}}, "model info"),
    "sizes strings": (
        {"siblings": [{"rfilename": "config.json", "size": "12"}, {"rfilename": "model.safetensors", "size": "1e9"}]},
        "the size",
    ),
    "sibling escaping": (
        {"siblings": [{"rfilename": "../config.json", "size": 3}, {"rfilename": "model.safetensors", "size": 3}]},
        "sibling file name",
    ),
    "sibling absolute": ({"siblings": [{"rfilename": "/etc/config.json", "size": 3}]}, "sibling file name"),
}

HOSTILE_HEADERS = {
    "etag escaping": ({"ETag": '"../../../x"'}, "ETag"),
    "linked etag escaping": ({"X-Linked-Etag": '"../../../x"'}, "X-Linked-Etag"),
    "etag absolute": ({"ETag": '"ABSOLUTE"'}, "ETag"),
    "repo commit escaping": ({"X-Repo-Commit": "../../../../x"}, "X-Repo-Commit"),
    "linked size text": ({"X-Linked-Size": "-5"}, "X-Linked-Size"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_INFO))
def test_hostile_model_info_refused(world, model, case, monkeypatch):
    root, cache = world
    patch, needle = HOSTILE_INFO[case]
    patch = {k: (str(root / "abs") if v == "ABSOLUTE" else v) for k, v in patch.items()}
    with HubServer({REPO: model}, info_patch=patch) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        _refused(root, cache, [needle, "refused"], lambda: specbound.analyze(REPO, threads=1))
        assert hub.fetched() == set()  # nothing downloaded
    assert not (root / "abs").exists()


@pytest.mark.parametrize("case", sorted(HOSTILE_HEADERS))
def test_hostile_headers_refused(world, model, case, monkeypatch):
    root, cache = world
    patch, needle = HOSTILE_HEADERS[case]
    patch = {k: v.replace("ABSOLUTE", str(root / "abs")) for k, v in patch.items()}
    with HubServer({REPO: model}, header_patch=patch) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        _refused(root, cache, [needle, "refused"], lambda: specbound.analyze(REPO, threads=1))
        assert hub.fetched() == set()
    assert not (root / "abs").exists()


def test_streamed_hostile_answers_refused(world, model, monkeypatch):
    """``--stream`` writes nothing, but a lying size or commit is still refused."""
    root, cache = world
    with HubServer({REPO: model}, info_patch={"sha": "../../x"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        _refused(root, cache, ["the commit"], lambda: specbound.analyze(REPO, threads=1, stream=True))
    with HubServer({REPO: model}, header_patch={"X-Repo-Commit": "../x"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        _refused(root, cache, ["X-Repo-Commit"], lambda: specbound.analyze(REPO, threads=1, stream=True))


def test_honest_server_still_fetches(world, model, monkeypatch):
    """The checks refuse nothing a Hub-like server sends: the fetch writes only inside the cache."""
    root, cache = world
    before = walk_outside(root, cache)
    with HubServer({REPO: model}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        result = specbound.analyze(REPO, threads=1)
    assert result.bounds
    assert walk_outside(root, cache) == before
    assert (cache / "models--org--tiny-bert" / "snapshots" / SHA / "config.json").is_file()


def _cached(cache: Path, model: Path) -> Path:
    """A hand-made cache entry of ``REPO`` at ``SHA``: blobs, links and ``refs/main``."""
    repo = cache / "models--org--tiny-bert"
    snapshot = repo / "snapshots" / SHA
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        blob = repo / "blobs" / name.replace(".", "_")
        blob.write_bytes((model / name).read_bytes())
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    return repo


def test_snapshot_link_out_of_the_cache_refused(world, model, monkeypatch):
    root, cache = world
    repo = _cached(cache, model)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert specbound.analyze(REPO, threads=1).bounds  # the healthy entry reads
    outside = root / "secret.json"
    outside.write_bytes((model / "config.json").read_bytes())
    link = repo / "snapshots" / SHA / "config.json"
    link.unlink()
    link.symlink_to(outside)
    _refused(root, cache, ["is a link leading out of its cache entry"], lambda: specbound.analyze(REPO, threads=1))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "folder-link"])
def test_hostile_refs_main_refused_quickly(world, model, monkeypatch, kind):
    """A ``refs/main`` that is a FIFO (a read blocks) or ``/dev/zero`` (a read never ends): refused in
    one line within seconds, before huggingface_hub's offline lookup opens it."""
    root, cache = world
    repo = _cached(cache, model)
    ref = repo / "refs" / "main"
    ref.unlink()
    if kind == "fifo":
        os.mkfifo(ref)
    elif kind == "dev-zero":
        ref.symlink_to("/dev/zero")
    elif kind == "huge":
        ref.write_bytes(b"a" * 100_000)
    else:
        ref.symlink_to(root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    _refused(root, cache, ["cache ref"], lambda: specbound.analyze(REPO, threads=1))
    assert time.monotonic() - start < 10


def test_cli_empty_revision_and_huge_budget(capsys, world):
    rc, out, err = run_cli(capsys, REPO, "--revision", "")
    assert_one_line_error(rc, out, err, ["--revision names an empty revision"])
    rc, out, err = run_cli(capsys, f"{REPO}@")
    assert_one_line_error(rc, out, err, [f"{REPO}@"])  # refused, never read as the main branch
    rc, out, err = run_cli(capsys, REPO, "--disk-budget", "1e400")
    assert rc == 2 and "Traceback" not in err and "more bytes than any disk holds" in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err


def _cli(capfd, *args):
    capfd.readouterr()
    rc = main(["analyze", *args])
    out, err = capfd.readouterr()
    return rc, out, err.splitlines()


@pytest.mark.parametrize(
    "server",
    [
        {"cut_always": ("config.json",)},
        {"get_patch": {"Content-Length": "100"}},
        {"get_patch": {"Content-Length": "100000"}},
    ],
)
def test_cut_short_or_wrong_length_is_one_line(world, model, monkeypatch, capfd, caplog, server):
    """huggingface_hub's retry lines (a body cut short, a GET whose Content-Length the HEAD did not
    say) are kept off stderr: one line, exit 2; --verbose shows them.  A later run against an honest
    server fetches again: the folder the failed fetch left is not read as the model."""

    root, cache = world
    monkeypatch.setattr("time.sleep", lambda seconds: None)  # huggingface_hub waits 1 s per retry
    with HubServer({REPO: model}, **server) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        caplog.set_level("INFO")
        rc, out, lines = _cli(capfd, REPO)
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("specbound: error: could not fetch"), lines
        assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]  # reached no handler
        try:
            rc, out, lines = _cli(capfd, REPO, "--verbose")
        finally:
            show_details(False)
        assert rc == 2 and lines[-1].startswith("specbound: error: "), lines
        if "cut_always" in server:  # each retry of the cut body, said by huggingface_hub (its handler's
            # stream is whatever sys.stderr was at its import; the records reach the root logger too)
            said = [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")]
            assert any("resume download" in m for m in said), said
    with HubServer({REPO: model}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        rc, out, lines = _cli(capfd, REPO, "--quiet")
        assert rc == 0, lines
        assert hub.fetched() == {"config.json", "model.safetensors"}
