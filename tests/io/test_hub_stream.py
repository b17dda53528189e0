"""A hub model streamed (``--stream``, or over the disk budget): each shard's header, then each tensor,
read by HTTP range requests from a local stand-in for the Hub (HF_ENDPOINT at 127.0.0.1); nothing is
downloaded, the disk used stays below one layer's bytes (measured on every request the server
answers), the analysis equals the local folder's exactly, and every failure is one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file
from support.hub_server import HubServer
from support.numpy_bert import write_tiny_bert
from support.same_numbers import numbers

import specbound
from specbound.errors import SpecboundError, SpecboundWarning
from specbound.io import hub_stream
from specbound.io.hub_fetch import MAX_SHARDS, parse_size
from specbound.io.hub_stream import StreamedCheckpoint

pytest.importorskip("huggingface_hub")

REPO = "org/tiny-bert"
LAYERS = 4


def _tree_bytes(*folders: Path) -> int:
    """Bytes of the files under ``folders`` (a cache snapshot's links to its blobs not counted twice).  Sampled
    while the client writes: a file removed between the listing and its ``lstat`` (a temporary file, a lock)
    holds no disk any more and counts 0."""
    total = 0
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                try:
                    st = os.lstat(os.path.join(root, name))
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def _layer_bytes(folder: Path) -> dict[int, int]:
    """Stored bytes of each layer's tensors, from the safetensors headers."""
    out: dict[int, int] = {}
    for shard in folder.glob("*.safetensors"):
        with open(shard, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, entry in header.items():
            layer = re.match(r"encoder\.layer\.(\d+)\.", name)
            if layer:
                start, end = entry["data_offsets"]
                out[int(layer.group(1))] = out.get(int(layer.group(1)), 0) + end - start
    return out


def _sharded(local: Path, folder: Path, parts: int = 2) -> Path:
    """``local``'s tensors in ``parts`` shards with their index."""
    tensors = load_file(str(local / "model.safetensors"))
    names = sorted(tensors)
    folder.mkdir()
    shutil.copy(local / "config.json", folder)
    weight_map = {}
    for i in range(parts):
        shard = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        keys = names[i::parts]
        save_file({k: tensors[k] for k in keys}, str(folder / shard))
        weight_map.update({k: shard for k in keys})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.fixture
def hub_env(hub_env, tmp_path):
    """tests/io/conftest.py's, and temporary files under ``tmp_path``."""
    (tmp_path / "tmp").mkdir()
    hub_env.setenv("TMPDIR", str(tmp_path / "tmp"))  # temp files land where the disk is measured
    hub_env.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return hub_env


def test_stream_reads_ranges_disk_below_a_layer_and_equals_local(tmp_path, hub_env):
    """Sharded, streamed: the same numbers as the local folder, only ranges of the shards read, and the
    disk (the HF cache plus the temp folder) sampled on every request stays below one layer's bytes.
    The full fetch of the same model, measured the same way, holds the whole weights: the measure sees
    what a download writes."""
    local = write_tiny_bert(tmp_path / "local", seed=11, L=LAYERS)
    served = _sharded(local, tmp_path / "served")
    layer = _layer_bytes(served)
    assert sorted(layer) == list(range(LAYERS))
    reference = specbound.analyze(local, threads=1, jobs=1)
    watched = (tmp_path / "cache", tmp_path / "tmp", tmp_path / "home")
    peaks = []
    with HubServer({REPO: served}) as hub:
        hub.on_request = lambda: peaks.append(_tree_bytes(*watched))
        hub_env.setenv("HF_ENDPOINT", hub.url)
        streamed = specbound.analyze(REPO, stream=True, threads=1, jobs=1)
        peaks.append(_tree_bytes(*watched))
        stream_sent, stream_log = hub.sent, list(hub.log)
        hub.log.clear()
        hub.sent = 0
        full_peaks, peaks = peaks, []
        fetched = specbound.analyze(REPO, threads=1, jobs=1)  # the full fetch, for comparison
        peaks.append(_tree_bytes(*watched))
        full_sent = hub.sent
    assert numbers(streamed) == numbers(reference)  # exactly: the same bytes, the same arithmetic
    assert numbers(fetched) == numbers(reference)
    assert streamed.location == f"{REPO}@{'a' * 40} (streamed from {hub.url})"
    stream_peak = max(full_peaks)
    assert stream_peak < min(layer.values()), (stream_peak, layer)
    weights = sum(p.stat().st_size for p in served.glob("*.safetensors"))
    assert max(peaks) >= weights  # the download, measured the same way
    gets = [(p, r) for m, p, r in stream_log if m == "GET" and "/resolve/" in p]
    assert all(r.startswith("bytes=") for _, r in gets)  # every weights byte by a range
    assert all(f"/resolve/{'a' * 40}/" in p for p, _ in gets)  # pinned to the commit main named
    ranges = [r for p, r in gets if p.endswith(".safetensors")]
    tensors = sum(len(load_file(str(s))) for s in served.glob("*.safetensors"))
    # one or two ranges per shard for its header (its first 4 KiB, then the rest of a longer header),
    # then one per matrix read: q, k, v, o, ff_in, ff_out of each layer; biases, norms and embeddings
    # are never read
    assert 2 * 1 + 6 * LAYERS <= len(ranges) <= 2 * 2 + 6 * LAYERS < 2 * 2 + tensors
    print(
        f"\nbytes sent: --stream {stream_sent:,}, full fetch {full_sent:,}; peak disk --stream {stream_peak:,} "
        f"(one layer: {min(layer.values()):,} bytes)"
    )
    assert stream_sent < full_sent


def test_auto_stream_over_disk_budget(tmp_path, hub_env):
    """Weights over ``disk_budget``: streamed, said in one warning; under it: downloaded."""
    local = write_tiny_bert(tmp_path / "local", seed=12, L=2)
    reference = specbound.analyze(local, threads=1, jobs=1)
    with HubServer({REPO: local}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        with pytest.warns(
            SpecboundWarning,
            match=r"exceed the disk budget \(0\.00 GB\): streaming them by HTTP "
            r"range requests.*--disk-budget",
        ) as caught:
            streamed = specbound.analyze(REPO, disk_budget="1kB", threads=1, jobs=1)
        assert len(caught) == 1 and "\n" not in str(caught[0].message)
        assert not (tmp_path / "cache" / "models--org--tiny-bert").exists()
        assert numbers(streamed) == numbers(reference)
        downloaded = specbound.analyze(REPO, disk_budget="1GB", threads=1, jobs=1)
        assert hub.fetched() >= {"config.json", "model.safetensors"}
        hub.log.clear()
        cached = specbound.analyze(REPO, stream=True, threads=1, jobs=1)  # in the cache: read from there
        assert hub.log == []
    assert numbers(downloaded) == numbers(cached) == numbers(reference)
    assert (tmp_path / "cache" / "models--org--tiny-bert").is_dir()


@pytest.mark.parametrize(
    "text, expected",
    [("20GB", 20 * 10**9), ("1.5GiB", 3 * 2**29), ("500M", 5 * 10**8), ("1000", 1000), ("2 kB", 2000), (7, 7)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_refuses():
    for bad in ("twenty", "-5GB", "5 XB", ""):
        with pytest.raises(SpecboundError, match=r"^expected a size in bytes such as 20GB"):
            parse_size(bad)
    with pytest.raises(SpecboundError, match=r"^expected a size in bytes such as 20GB, .* found 'lots'"):
        specbound.analyze(None, disk_budget="lots")  # refused before anything is read


def test_dropped_connections_retried_then_one_line(tmp_path, hub_env):
    """A range cut mid-body resumes from the byte where it stopped; a connection that keeps dropping
    is one line after ``RETRIES`` retries."""

    hub_env.setattr(hub_stream, "_BACKOFF_S", 0.0)
    hub_env.setattr(hub_stream, "_BODY_CHUNK", 64)  # pieces arrive before the cut: the retry resumes
    local = write_tiny_bert(tmp_path / "local", seed=13, L=2)
    reference = specbound.analyze(local, threads=1, jobs=1)
    with HubServer({REPO: local}, cut_ranges=2) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        assert numbers(specbound.analyze(REPO, stream=True, threads=1, jobs=1)) == numbers(reference)
        asked = [
            tuple(map(int, r[len("bytes=") :].split("-")))
            for m, p, r in hub.log
            if m == "GET" and p.endswith(".safetensors")
        ]
        resumed = [(a, b) for a, b in asked if any(a0 < a and b0 == b for a0, b0 in asked)]
        assert hub.cut_ranges == 0 and len(resumed) == 2  # each retry asks for the bytes not received only
        hub.cut_ranges = 10**6
        with pytest.raises(
            SpecboundError,
            match=r"^the connection to http://127.0.0.1:\d+ dropped 4 times while "
            r"reading model.safetensors of org/tiny-bert .*check the network",
        ):
            specbound.analyze(REPO, stream=True, threads=1, jobs=1)


def test_wrong_length_lying_header_gated_offline_are_one_line(tmp_path, hub_env):
    local = write_tiny_bert(tmp_path / "local", seed=14, L=2)
    lying = tmp_path / "lying"
    shutil.copytree(local, lying)
    data = (lying / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    name = "encoder.layer.1.output.dense.weight"
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start + 10**9, end + 10**9]  # far beyond the file
    raw = json.dumps(header).encode()
    (lying / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
    n = len(raw)
    with HubServer(
        {REPO: local, "org/lying": lying, "org/short": local, "org/gated": local}, gated=("org/gated",)
    ) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(
            SpecboundError,
            match=r"^cannot read the safetensors header of model.safetensors "
            r"\(org/lying, [\d,]+ bytes as the server reports\): tensor "
            rf"'{re.escape(name)}' lies at data bytes .* beyond",
        ):
            specbound.analyze("org/lying", stream=True)
        assert not any(
            r and int(r.split("=")[1].split("-")[0]) > 8 + n for m, p, r in hub.log if "org/lying" in p and m == "GET"
        )  # refused before any tensor's bytes
        hub.short.add("model.safetensors")
        with pytest.raises(
            SpecboundError,
            match=r"answered the range bytes=\d+-\d+ of model.safetensors "
            r"\(org/tiny-bert\) with [\d,]+ bytes, expected HTTP 206 and [\d,]+",
        ):
            specbound.analyze(REPO, stream=True)
        hub.short.clear()

        def revoke_at_first_tensor():  # access withdrawn mid-analysis: the first tensor's range is refused
            method, _, asked = hub.log[-1]
            if method == "GET" and asked and int(asked.split("=")[1].split("-")[0]) > 8 + n:
                hub.gated.add(REPO)

        hub.on_request = revoke_at_first_tensor
        with pytest.raises(SpecboundError, match=r"^org/tiny-bert is gated on .*accept its terms"):
            specbound.analyze(REPO, stream=True)
        hub.on_request = None
        with pytest.raises(SpecboundError, match=r"^org/gated is gated .*accept its terms.*HF_TOKEN"):
            specbound.analyze("org/gated", stream=True)
        hub_env.setenv("HF_TOKEN", "hf_granted")
        assert numbers(specbound.analyze("org/gated", stream=True, threads=1, jobs=1)) == numbers(
            specbound.analyze(local, threads=1, jobs=1)
        )
    hub_env.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        SpecboundError,
        match=r"^--stream reads org/tiny-bert over the network and HF_HUB_OFFLINE "
        r"is set",
    ):
        specbound.analyze(REPO, stream=True)
    with pytest.raises(SpecboundError, match=r"reads a hub id ORG/NAME by HTTP range requests; .*local"):
        specbound.analyze(local, stream=True)


def test_server_refuses_ranges_it_does_not_understand(tmp_path):
    """The stand-in answers a Range it cannot serve with 416, never with other bytes."""
    from huggingface_hub import get_session

    local = write_tiny_bert(tmp_path / "local", seed=15, L=1)
    size = (local / "model.safetensors").stat().st_size
    with HubServer({REPO: local}) as hub:
        url = f"{hub.url}/{REPO}/resolve/main/model.safetensors"
        for bad in ("bytes=0-1,4-5", "bytes=-100", f"bytes={size}-", "bytes=9-3", "lines=0-3"):
            assert get_session().get(url, headers={"Range": bad}).status_code == 416, bad
        ok = get_session().get(url, headers={"Range": "bytes=2-5"})
        assert ok.status_code == 206 and ok.content == (local / "model.safetensors").read_bytes()[2:6]
        assert ok.headers["Content-Range"] == f"bytes 2-5/{size}"


def test_hub_server_tree_and_paths_info(tmp_path, hub_env):
    """The stand-in answers the listing routes huggingface_hub's HfApi and HfFileSystem use."""
    from huggingface_hub import HfApi

    local = write_tiny_bert(tmp_path / "local", seed=16, L=1)
    with HubServer({REPO: local}) as hub:
        api = HfApi(endpoint=hub.url)
        tree = {e.path: e.size for e in api.list_repo_tree(REPO)}
        assert tree == {p.name: p.stat().st_size for p in local.iterdir()}
        info = api.get_paths_info(REPO, ["config.json"])
        assert [(i.path, i.size) for i in info] == [("config.json", (local / "config.json").stat().st_size)]
        from huggingface_hub import HfFileSystem

        fs = HfFileSystem(endpoint=hub.url)
        assert sorted(fs.ls(REPO, detail=False)) == sorted(f"{REPO}/{p.name}" for p in local.iterdir())
        with fs.open(f"{REPO}/model.safetensors", "rb") as f:
            f.seek(8)
            assert f.read(16) == (local / "model.safetensors").read_bytes()[8:24]


def test_finished_layers_are_released(tmp_path, hub_env):
    """Memory bounded by a layer: when a tensor of layer l is read, no tensor read for layer l - 2 or
    before is alive (the pipeline reads one layer ahead; each layer's arrays are dropped after it)."""
    local = write_tiny_bert(tmp_path / "local", seed=17, L=LAYERS)
    with HubServer({REPO: local}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)

        alive: list[tuple[int, weakref.ref]] = []
        violations = []
        read = StreamedCheckpoint.read

        def watched(self, name, **options):
            array = read(self, name, **options)
            layer = int(re.match(r"encoder\.layer\.(\d+)\.", name).group(1))
            violations.extend((layer, old) for old, ref in alive if old <= layer - 2 and ref() is not None)
            alive.append((layer, weakref.ref(array)))
            return array

        hub_env.setattr(StreamedCheckpoint, "read", watched)
        specbound.analyze(REPO, stream=True, threads=1, jobs=1)
    assert len(alive) == LAYERS * 6 and violations == []


def test_cli_stream_and_disk_budget(tmp_path, hub_env):
    """The CLI: ``--stream`` prints the same tables as the local folder; an unreadable budget is a
    usage error naming the forms it takes."""
    local = write_tiny_bert(tmp_path / "local", seed=18, L=2)
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "cache"),
        "HF_HUB_DISABLE_XET": "1",
        "PYTHONPATH": ":".join(p for p in sys.path if p),
    }

    def run(*args):
        command = [sys.executable, "-m", "specbound.cli", "analyze", *args, "--threads", "1"]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    with HubServer({REPO: local}) as hub:
        env["HF_ENDPOINT"] = hub.url
        streamed = run(REPO, "--stream", "--format", "json")
        assert streamed.returncode == 0, streamed.stderr[-2000:]
        assert not (tmp_path / "cache" / "models--org--tiny-bert").exists()
        budget = run(REPO, "--disk-budget", "1kB", "--quiet")
        assert budget.returncode == 0, budget.stderr[-2000:]
        assert [ln for ln in budget.stderr.splitlines() if "disk budget" in ln] == [budget.stderr.strip()]
        bad = run(REPO, "--disk-budget", "lots")
        folder = run(str(local), "--stream")
    assert bad.returncode == 2 and "expected a size in bytes such as 20GB" in bad.stderr
    assert folder.returncode == 2 and len(folder.stderr.strip().splitlines()) == 1
    assert "is not one: leave --stream out for a local model" in folder.stderr
    doc, ref = json.loads(streamed.stdout), json.loads(run(str(local), "--format", "json").stdout)
    for d in (doc, ref):
        d.pop("source"), d.pop("location", None)
        for row in d["matrices"]:
            row.pop("tensors", None)
    assert doc == ref


def test_many_shards_one_request_each(tmp_path, hub_env):
    """Many tiny shards (3,000 once took over 60 s): streaming reads each shard's header with
    one range request (its size from the listing, no HEAD per shard); a fetch downloads them all
    (HEAD + GET each, several at a time); both equal the local analysis."""
    local = write_tiny_bert(tmp_path / "local", seed=31, L=2, N=8, H=2, d_ff=8)
    tensors = load_file(str(local / "model.safetensors"))
    sharded = _sharded(local, tmp_path / "sharded", parts=len(tensors))  # one tensor per shard
    reference = specbound.analyze(local, threads=1)
    with HubServer({REPO: sharded}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        streamed = specbound.analyze(REPO, threads=1, stream=True)
        shard_requests = [(m, p) for m, p, _ in hub.log if p.endswith(".safetensors")]
        assert not [r for r in shard_requests if r[0] == "HEAD"]
        headers_read = {p for m, p in shard_requests}
        assert len(headers_read) == len(tensors)
        assert len(shard_requests) == len(tensors) + 6 * 2  # a header each, then the 6 matrices of each layer
        hub.log.clear()
        fetched = specbound.analyze(REPO, threads=1)
        assert len([1 for m, p, _ in hub.log if m == "GET" and p.endswith(".safetensors")]) == len(tensors)
    for a in (streamed, fetched):
        assert a.bounds == pytest.approx(reference.bounds, rel=1e-12)


@pytest.mark.parametrize("stream", [False, True])
def test_an_index_of_thousands_of_shards_is_one_line_at_once(tmp_path, hub_env, stream):
    """A weight map of 3,000 tiny shards once took 44-91 s to fetch; an index naming more shard
    files than any published model is refused before any shard is requested."""

    local = write_tiny_bert(tmp_path / "local", seed=32, L=2, N=8, H=2, d_ff=8)
    sharded = _sharded(local, tmp_path / "sharded", parts=2)
    index = sharded / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"].update({f"extra.{i}": f"extra-{i:05d}.safetensors" for i in range(3000)})
    index.write_text(json.dumps(doc))
    with HubServer({REPO: sharded}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        start = time.perf_counter()
        with pytest.raises(
            SpecboundError, match=f"names 3,002 shard files; specbound fetches or streams at most {MAX_SHARDS:,}"
        ) as exc:
            specbound.analyze(REPO, threads=1, stream=stream)
        assert time.perf_counter() - start < 30 and "\n" not in str(exc.value)
        assert not [p for _, p, _ in hub.log if p.endswith(".safetensors")]  # no shard requested
