"""Checkpoint formats and sources: PyTorch pickles (single, sharded, training checkpoints, bf16),
a weights file named directly, hub ids from the local cache, and in-memory models."""

import json
import pickle
import shutil

import numpy as np
import pytest

import specbound
from specbound import SpecboundError

torch = pytest.importorskip("torch")
import os

from safetensors.numpy import load_file  # noqa: E402
from support.conformance import check_reader  # noqa: E402
from support.tiny_models import build_tiny_model

from specbound.io import hub_cache


@pytest.fixture(scope="module")
def reference(tiny_bert_cls_dir):
    return specbound.analyze(tiny_bert_cls_dir, threads=1)


def _same(a, b, rel=1e-12):
    assert a.model == b.model
    for name, value in a.bounds.items():
        assert b.bounds[name] == pytest.approx(value, rel=rel), name
    np.testing.assert_allclose(a.matrices["spectral_norm"], b.matrices["spectral_norm"], rtol=rel)
    np.testing.assert_allclose(a.matrices["norm_1_1"], b.matrices["norm_1_1"], rtol=rel)


def _state_dict(folder):
    return {k: torch.from_numpy(v.copy()) for k, v in load_file(str(folder / "model.safetensors")).items()}


def _pickle_folder(src, dst, shards=1, wrap=None, dtype=None):
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    sd = _state_dict(src)
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    if shards == 1:
        torch.save(sd if wrap is None else {wrap: sd, "step": 7}, dst / "pytorch_model.bin")
        return dst
    names = sorted(sd)
    weight_map = {}
    for i in range(shards):
        part = {n: sd[n] for n in names[i::shards]}
        fname = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save(part, dst / fname)
        weight_map.update({n: fname for n in part})
    (dst / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def test_pytorch_bin_single_and_sharded(tiny_bert_cls_dir, tmp_path):
    check_reader(_pickle_folder(tiny_bert_cls_dir, tmp_path / "single"), tiny_bert_cls_dir)
    check_reader(_pickle_folder(tiny_bert_cls_dir, tmp_path / "sharded", shards=3), tiny_bert_cls_dir)


def test_training_checkpoint_file_named_directly(tiny_bert_cls_dir, tmp_path):
    folder = _pickle_folder(tiny_bert_cls_dir, tmp_path / "ckpt", wrap="model")
    target = folder / "step7.pt"
    (folder / "pytorch_model.bin").rename(target)
    check_reader(target, tiny_bert_cls_dir)


def test_safetensors_file_named_directly(tiny_bert_cls_dir):
    check_reader(tiny_bert_cls_dir / "model.safetensors", tiny_bert_cls_dir)


def test_bf16_pickle_is_upcast_exactly(tiny_bert_cls_dir, tmp_path):
    folder = _pickle_folder(tiny_bert_cls_dir, tmp_path / "bf16", dtype=torch.bfloat16)
    ours = specbound.analyze(folder, threads=1)
    sd = {k: v.to(torch.bfloat16).float() for k, v in _state_dict(tiny_bert_cls_dir).items()}
    config = json.loads((tiny_bert_cls_dir / "config.json").read_text())
    _same(ours, specbound.analyze(sd, config=config, threads=1))
    fp32 = specbound.analyze(tiny_bert_cls_dir, threads=1)  # bf16 rounding really reached the numbers
    assert not np.allclose(ours.matrices["spectral_norm"], fp32.matrices["spectral_norm"], rtol=1e-6)


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_PICKLE",))


def test_pickle_that_would_run_code_is_refused(tiny_bert_cls_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "evil"
    folder.mkdir()
    shutil.copy(tiny_bert_cls_dir / "config.json", folder / "config.json")
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"x": _Boom()}))
    with pytest.raises(SpecboundError, match=r"weights_only=True"):
        specbound.analyze(folder)
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()


def _fake_cache(root, repo_id, folder, commit="0123456789abcdef0123456789abcdef01234567"):
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        shutil.copy(f, snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return commit


def test_hub_id_from_local_cache(tiny_bert_cls_dir, tmp_path, monkeypatch, reference):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    commit = _fake_cache(tmp_path / "hub", "google/bert_uncased_L-2_H-128_A-2", tiny_bert_cls_dir)
    _same(reference, specbound.analyze("google/bert_uncased_L-2_H-128_A-2", threads=1))
    _same(reference, specbound.analyze(f"google/bert_uncased_L-2_H-128_A-2@{commit[:10]}", threads=1))
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub
    _same(reference, specbound.analyze("google/bert_uncased_L-2_H-128_A-2", threads=1))


def test_hub_id_missing_from_cache(tmp_path, monkeypatch):
    """Offline (HF_HUB_OFFLINE), a hub id not in the cache is one line saying so; tests/io/test_hub_fetch.py
    holds the download."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecboundError, match=r"org/absent is not in the local .*HF_HUB_OFFLINE is set: unset"):
        specbound.analyze("org/absent")
    (tmp_path / "models--org--present" / "snapshots" / "abc").mkdir(parents=True)
    with pytest.raises(SpecboundError, match=r"revision 'v2' is not"):
        specbound.analyze("org/present@v2")
    (tmp_path / "models--org--present" / "snapshots" / "def").mkdir()
    with pytest.raises(SpecboundError, match=r"2 snapshots .* no refs/main: pass org/present@<commit>"):
        specbound.analyze("org/present")


def test_in_memory_module_and_state_dict(tiny_bert_cls_dir, reference):
    model = build_tiny_model("bert_cls")  # the same seed and config as the saved folder
    _same(reference, specbound.analyze(model, threads=1))
    config = json.loads((tiny_bert_cls_dir / "config.json").read_text())
    _same(reference, specbound.analyze(model.state_dict(), config=config, threads=1))
    _same(reference, specbound.analyze(model, threads=1, jobs=3))  # layers read from memory in threads
    with pytest.raises(SpecboundError, match="needs its config"):
        specbound.analyze(model.state_dict())


def test_wrapper_module_prefix(tiny_bert_cls_dir, reference):
    """A state dict saved from a wrapper (DataParallel's ``module.``) keeps the family's own prefix
    after it (``module.bert.``) and the wrapper before the head (``module.classifier.weight``, which
    the spec's ``^classifier\\.`` still ignores)."""
    config = json.loads((tiny_bert_cls_dir / "config.json").read_text())
    wrapped = {"module." + k: v for k, v in _state_dict(tiny_bert_cls_dir).items()}
    assert "module.classifier.weight" in wrapped and "module.bert.pooler.dense.weight" in wrapped
    _same(reference, specbound.analyze(wrapped, config=config, threads=1))


def test_hub_id_through_huggingface_hub(tiny_bert_cls_dir, tmp_path, monkeypatch, reference):
    """With huggingface_hub installed, its offline lookup resolves tags and refs/pr/N (stored under
    refs/refs/pr/N); without it, this package's own reading of the cache gives the same folder."""
    pytest.importorskip("huggingface_hub")

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo_id = "google/bert_uncased_L-2_H-128_A-2"
    commit = _fake_cache(tmp_path / "hub", repo_id, tiny_bert_cls_dir)
    repo = tmp_path / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs" / "v1.0").write_text(commit)
    (repo / "refs" / "refs" / "pr").mkdir(parents=True)
    (repo / "refs" / "refs" / "pr" / "3").write_text(commit)
    calls = []
    real = hub_cache.hub_library_snapshot
    monkeypatch.setattr(hub_cache, "hub_library_snapshot", lambda *a: calls.append(a) or real(*a))
    for revision in ("main", "v1.0", "refs/pr/3", commit):
        assert real(repo_id, revision, tmp_path / "hub") == repo / "snapshots" / commit, revision
        _same(reference, specbound.analyze(f"{repo_id}@{revision}", threads=1))
    assert len(calls) == 4
    assert real(repo_id, "v9", tmp_path / "hub") is None  # absent: the fallback explains what is there
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (online, v9 would be fetched)
    with pytest.raises(SpecboundError, match=r"revision 'v9' is not"):
        specbound.analyze(f"{repo_id}@v9")
    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)  # not installed: the fallback
    assert hub_cache.resolve_hub_id(f"{repo_id}@refs/pr/3") == repo / "snapshots" / commit
