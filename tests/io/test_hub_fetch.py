"""A hub id not in the local cache is fetched through huggingface_hub from a local stand-in for the
Hub (HF_ENDPOINT at 127.0.0.1): only config.json and the safetensors weights, never a duplicate in
another format; the analysis equals the local folder's; failures are one line with the fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from support.hub_server import HubServer
from support.numpy_bert import write_tiny_bert

import specbound
from specbound.errors import SpecboundError
from specbound.io.shard_index import _inside

pytest.importorskip("huggingface_hub")

REPO = "org/tiny-bert"
DUPLICATES = ("pytorch_model.bin", "model.onnx", "tf_model.h5", "model.gguf", "onnx/model.onnx")


def _same(a, b):
    for name, value in a.bounds.items():
        assert b.bounds[name] == pytest.approx(value, rel=1e-12), name
    np.testing.assert_allclose(a.matrices["spectral_norm"], b.matrices["spectral_norm"], rtol=1e-12)
    np.testing.assert_allclose(a.matrices["norm_1_1"], b.matrices["norm_1_1"], rtol=1e-12)


def _served(tmp_path, local: Path) -> Path:
    """The local model plus the duplicates a hub repository often holds beside it (their bytes are
    never read: any fetch of them is the failure)."""
    served = tmp_path / "served"
    shutil.copytree(local, served)
    for name in DUPLICATES:
        (served / name).parent.mkdir(exist_ok=True)
        (served / name).write_bytes(b"not the weights the analysis reads" * 10)
    (served / "README.md").write_text("a model card")
    return served


def test_fetch_only_needed_files_and_same_analysis(tmp_path, hub_env):
    local = write_tiny_bert(tmp_path / "local", seed=3)
    reference = specbound.analyze(local, threads=1)
    with HubServer({REPO: _served(tmp_path, local)}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        fetched = specbound.analyze(REPO, threads=1)
        assert hub.fetched() == {"config.json", "model.safetensors"}
        assert ("GET", f"/api/models/{REPO}/revision/main", "") in hub.log
        _same(reference, fetched)
        hub.log.clear()
        again = specbound.analyze(REPO, threads=1)  # now cached: no request at all
        assert hub.log == []
    _same(reference, again)
    hub_env.setenv("HF_HUB_OFFLINE", "1")  # the server is gone: the cache alone answers
    _same(reference, specbound.analyze(REPO, threads=1))
    snapshot = tmp_path / "cache" / "models--org--tiny-bert" / "snapshots" / ("a" * 40)
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors"]


def test_fetch_sharded_by_revision(tmp_path, hub_env):
    """A sharded checkpoint: the index first, then the shards it names, at a commit hash revision."""
    local = write_tiny_bert(tmp_path / "local", seed=4)
    reference = specbound.analyze(local, threads=1)
    tensors = load_file(str(local / "model.safetensors"))
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(local / "config.json", sharded)
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(sharded / shard))
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}})
    )
    commit = "b" * 40
    with HubServer({REPO: _served(tmp_path, sharded)}, commit=commit) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        _same(reference, specbound.analyze(f"{REPO}@{commit}", threads=1))
        assert hub.fetched() == {"config.json", "model.safetensors.index.json", *shards}


def test_resumes_after_dropped_connection(tmp_path, hub_env):
    """A connection dropped mid-file: the download continues from where it stopped (a Range request)."""
    local = write_tiny_bert(tmp_path / "local", seed=5)
    reference = specbound.analyze(local, threads=1)
    half = (local / "model.safetensors").stat().st_size // 2
    from huggingface_hub import constants

    hub_env.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1024)  # (10 MB chunks: a tiny file is one chunk)
    with HubServer({REPO: local}, cut=("model.safetensors",)) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        _same(reference, specbound.analyze(REPO, threads=1))
    gets = [r for m, p, r in hub.log if m == "GET" and p.endswith("/model.safetensors")]
    assert len(gets) == 2 and gets[0] == "" and gets[1].startswith("bytes="), gets
    assert 0 < int(gets[1][len("bytes=") :].rstrip("-")) <= half


def test_errors_are_one_line(tmp_path, hub_env):
    local = write_tiny_bert(tmp_path / "local", seed=6)
    binonly = tmp_path / "binonly"
    binonly.mkdir()
    shutil.copy(local / "config.json", binonly)
    (binonly / "pytorch_model.bin").write_bytes(b"x" * 100)
    with HubServer({REPO: local, "org/gated": local, "org/binonly": binonly}, gated=("org/gated",)) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(SpecboundError, match=r"^org/absent is not a model on .*check the id, or set HF_TOKEN"):
            specbound.analyze("org/absent")
        with pytest.raises(SpecboundError, match=r"^org/gated is gated .*accept its terms.*HF_TOKEN"):
            specbound.analyze("org/gated")
        hub_env.setenv("HF_TOKEN", "hf_granted")  # the token of an account that accepted the terms
        _same(specbound.analyze(local, threads=1), specbound.analyze("org/gated", threads=1))
        hub_env.delenv("HF_TOKEN")
        with pytest.raises(SpecboundError, match=r"has no revision 'v9' .*pass a branch, tag or commit"):
            specbound.analyze(f"{REPO}@v9")
        with pytest.raises(SpecboundError, match=r"holds no safetensors weights \(config.json, pytorch_model.bin\)"):
            specbound.analyze("org/binonly")
        assert hub.fetched() == {"config.json", "model.safetensors"}  # the gated one, with the token
        url = hub.url
    hub_env.setenv("HF_ENDPOINT", url)  # the server is gone: the network is down
    with pytest.raises(SpecboundError, match=r"^could not fetch org/tiny-bert from .*check the network"):
        specbound.analyze(REPO)
    hub_env.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecboundError, match=r"HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE to download it"):
        specbound.analyze(REPO)


def test_cli_fetch_revision_option(tmp_path, hub_env):
    """The CLI: ``--revision`` is the same as ``@REV``; an error is one line with exit status 2."""
    local = write_tiny_bert(tmp_path / "local", seed=7)
    with HubServer({REPO: local}) as hub:
        env = {
            **__import__("os").environ,
            "HF_ENDPOINT": hub.url,
            "HF_HUB_CACHE": str(tmp_path / "cache"),
            "HF_HUB_DISABLE_XET": "1",
            "PYTHONPATH": ":".join(p for p in sys.path if p),
        }
        run = subprocess.run(
            [sys.executable, "-m", "specbound.cli", "analyze", REPO, "--revision", "a" * 40],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert hub.fetched() == {"config.json", "model.safetensors"}
        bad = subprocess.run(
            [sys.executable, "-m", "specbound.cli", "analyze", "org/absent"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "is not a model on" in bad.stderr


def test_cache_snapshot_shards_resolve_only_into_blobs(tmp_path):
    """In a cache snapshot the shard index may name links into ``<repo>/blobs``, and nothing else
    outside the snapshot: a link elsewhere, or a name with ``..``, is refused."""

    repo = tmp_path / "models--org--m"
    snap, blobs = repo / "snapshots" / ("c" * 40), repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    (blobs / "0123").write_bytes(b"x")
    (tmp_path / "elsewhere").write_bytes(b"x")
    (snap / "model-1.safetensors").symlink_to("../../blobs/0123")
    (snap / "model-2.safetensors").symlink_to(tmp_path / "elsewhere")
    assert _inside(snap, "model-1.safetensors")
    assert not _inside(snap, "model-2.safetensors")
    assert not _inside(snap, "../../blobs/0123")
    plain = tmp_path / "plain"  # not a snapshot: the link into a blobs-like folder is outside
    plain.mkdir()
    (plain / "model-1.safetensors").symlink_to(blobs / "0123")
    assert not _inside(plain, "model-1.safetensors")
