"""Hub conventions: a hub analysis is named ``ORG/NAME@commit`` (text header,
JSON ``source``, notebook view, store records), the snapshot folder only its ``location``; the cache
gets ``refs/<revision>`` as huggingface_hub writes it, so transformers offline and ``scan_cache_dir()``
read what specbound fetched; a 404 or 401 says the repository does not exist or is private."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file
from support.hub_server import HubServer
from support.numpy_bert import write_tiny_bert

import specbound
from specbound.errors import SpecboundError
from specbound.records.view import format_summary
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store

pytest.importorskip("huggingface_hub")

REPO = "org/tiny-bert"
SHA = "c" * 40


def test_hub_analysis_is_named_org_name_at_commit(tmp_path, hub_env):
    local = write_tiny_bert(tmp_path / "local", seed=21)
    snapshot = tmp_path / "cache" / "models--org--tiny-bert" / "snapshots" / SHA
    with HubServer({REPO: local}, commit=SHA) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        fetched = specbound.analyze(REPO, threads=1)
    cached = specbound.analyze(REPO, threads=1)  # from the cache now
    for a in (fetched, cached):
        assert a.source == f"{REPO}@{SHA}"
        assert a.location == str(snapshot)
        assert a.to_dict()["source"] == f"{REPO}@{SHA}"
        header = format_summary(a).splitlines()
        assert header[0] == f"specbound: {REPO}@{SHA}", header[:2]
        assert header[1].startswith("from ") and header[1].endswith(f"snapshots/{SHA}"), header[:2]
        assert f"{REPO}@{SHA[:8]}" in a._repr_html_()

    report = run_sweep(expand_sources([REPO]), tmp_path / "store", progress=False)
    assert len(report.written) == 1
    assert list(Store(tmp_path / "store").table()["source"]) == [f"{REPO}@{SHA}"]


def test_streamed_analysis_is_named_org_name_at_commit(tmp_path, hub_env):
    local = write_tiny_bert(tmp_path / "local", seed=22)
    with HubServer({REPO: local}, commit=SHA) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        a = specbound.analyze(REPO, threads=1, stream=True)
    assert a.source == f"{REPO}@{SHA}" and a.to_dict()["source"] == f"{REPO}@{SHA}"
    assert "streamed" in a.location


def test_refs_written_and_read_by_other_tools(tmp_path, hub_env):
    """refs/main holds the commit as huggingface_hub writes it; scan_cache_dir() lists the ref and
    transformers with HF_HUB_OFFLINE=1 loads the model specbound fetched (its tensors, unchanged)."""
    local = write_tiny_bert(tmp_path / "local", seed=23)
    cache = tmp_path / "cache"
    with HubServer({REPO: local}, commit=SHA) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        specbound.analyze(REPO, threads=1)
    ref = cache / "models--org--tiny-bert" / "refs" / "main"
    assert ref.read_bytes() == SHA.encode()
    from huggingface_hub import scan_cache_dir

    (repo,) = scan_cache_dir(cache).repos
    assert repo.repo_id == REPO
    (revision,) = repo.revisions
    assert revision.commit_hash == SHA and revision.refs == frozenset({"main"})
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from huggingface_hub import constants

    # HF_HUB_OFFLINE=1 as transformers reads it (huggingface_hub's constants, set at its import), in
    # this process: nothing but the cache answers (the server is gone as well)
    hub_env.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_env.setenv("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModel.from_pretrained(
        REPO, cache_dir=str(cache), local_files_only=True, ignore_mismatched_sizes=True
    )
    loaded = model.encoder.layer[0].attention.self.query.weight.detach().numpy()
    expected = load_file(str(local / "model.safetensors"))["encoder.layer.0.attention.self.query.weight"]
    np.testing.assert_array_equal(loaded, expected)


def test_not_found_and_unauthorised_say_private(tmp_path, hub_env):
    local = write_tiny_bert(tmp_path / "local", seed=24)
    with HubServer(
        {REPO: local, "org/plain404": local, "org/secret": local}, bare_status={"org/plain404": 404, "org/secret": 401}
    ) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        for repo in ("org/absent", "org/plain404", "org/secret"):
            with pytest.raises(SpecboundError) as info:
                specbound.analyze(repo, threads=1)
            message = str(info.value)
            assert "no such repository, or it is private" in message and "HF_TOKEN" in message, message
            assert "retry later" not in message
