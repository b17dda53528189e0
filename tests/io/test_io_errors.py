"""Hostile and corrupt inputs to the checkpoint readers: each class of defect a fuzzing pass found,
reproduced; each must end in one :class:`SpecboundError` line, never in a wrong
number, a hang, a traceback or an allocation the file cannot back."""

import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

import specbound
import specbound.io.base
from specbound import SpecboundError
from specbound.io import open_checkpoint
from specbound.io.safetensors_file import SafetensorsCheckpoint

torch = pytest.importorskip("torch")


def _state_dict(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _as_pickle(folder, **save_kwargs):
    """The folder with its weights as pytorch_model.bin (torch.save) instead of safetensors."""
    sd = _state_dict(folder)
    (folder / "model.safetensors").unlink()
    torch.save(sd, str(folder / "pytorch_model.bin"), **save_kwargs)
    return folder


# --- a zip .bin whose tensor bytes were altered ---------------------------------------------------


def test_zip_pickle_with_altered_bytes_is_refused(healthy):
    """torch.load(mmap=True) never checks CRCs: a flipped weight byte was analysed silently."""
    folder = _as_pickle(healthy)
    path = folder / "pytorch_model.bin"
    reference = specbound.analyze(folder, threads=1)
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)  # the largest tensor's bytes
        offset = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data = bytearray(path.read_bytes())
    data[offset + info.file_size // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(SpecboundError, match="CRC-32"):
        specbound.analyze(folder, threads=1)
    assert reference.bounds  # the healthy file was analysed


def test_legacy_torch_save_is_read(healthy, tiny_bert_dir):
    """A legacy (non-zip) torch.save file cannot be memory-mapped; it is read into memory instead."""
    folder = _as_pickle(healthy, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(folder / "pytorch_model.bin")
    legacy = specbound.analyze(folder, threads=1)
    assert legacy.bounds == specbound.analyze(tiny_bert_dir, threads=1).bounds


# --- declared sizes bounded before allocation -----------------------------------------------------


def test_stride_zero_giant_pickled_tensor_is_refused(healthy):
    """A 2 kB pickle holding a 10^6 x 10^6 stride-0 view: refused before its float64 copy."""
    sd = _state_dict(healthy)
    name = "encoder.layer.0.attention.self.query.weight"
    sd[name] = torch.zeros(1).expand(10**6, 10**6)
    (healthy / "model.safetensors").unlink()
    torch.save(sd, str(healthy / "pytorch_model.bin"))
    config = json.loads((healthy / "config.json").read_text())
    config.update(hidden_size=10**6, intermediate_size=10**6, num_attention_heads=1)
    (healthy / "config.json").write_text(json.dumps(config))
    ckpt = open_checkpoint(healthy)
    with pytest.raises(SpecboundError, match="lies about the tensor's size"):
        ckpt.read(name)


def test_lying_safetensors_header_is_refused_before_allocation(tmp_path, monkeypatch):
    """A header declaring 10^12 values: whatever the parser lets through, the one size check
    refuses it before any allocation."""

    path = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    ckpt = SafetensorsCheckpoint("x", {}, {"w": path})
    monkeypatch.setattr(type(ckpt), "shape", lambda self, name: (10**6, 10**6))
    monkeypatch.setattr(type(ckpt), "dtype", lambda self, name: "F32")
    with pytest.raises(SpecboundError, match="lies about the tensor's size"):
        ckpt.read("w")


def test_a_tensor_larger_than_memory_is_refused(healthy, monkeypatch):
    monkeypatch.setattr(specbound.io.base, "available_memory", lambda: 1000)
    with pytest.raises(SpecboundError, match="memory is available"):
        open_checkpoint(healthy).read("encoder.layer.0.attention.self.query.weight")


# --- paths confined ---------------------------------------------------------------------------------


def _cache(root, repo_id, folder, ref_text):
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / "0123456789abcdef"
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        shutil.copy(f, snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(ref_text)
    return repo


@pytest.mark.parametrize("ref_text", ["../../..", "/etc", "../snapshots/../../.."])
def test_cache_ref_cannot_escape_the_cache(tiny_bert_dir, tmp_path, monkeypatch, ref_text):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache(tmp_path / "hub", "org/m", tiny_bert_dir, ref_text)
    with pytest.raises(SpecboundError, match="corrupt|not a commit"):
        open_checkpoint("org/m")


@pytest.mark.parametrize("source", ["org/m@../../..", "org/m@../../../x", "org/m@.."])
def test_hub_id_revision_cannot_escape_the_cache(tiny_bert_dir, tmp_path, monkeypatch, source):
    """``org/m@../../..`` resolved to ``<cache>/..``: a model placed there was opened."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache(tmp_path / "hub", "org/m", tiny_bert_dir, "0123456789abcdef")
    for target in (tmp_path, tmp_path / "x"):  # where the escaping revisions lead
        shutil.copytree(tiny_bert_dir, target, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path / "hub")
    with pytest.raises(SpecboundError, match="'..' component"):
        open_checkpoint(source)


@pytest.mark.parametrize("kind", ["safetensors", "pickle"])
@pytest.mark.parametrize("shard", ["../outside.bin", "/etc/passwd", "sub/../../x"])
def test_shard_indexes_cannot_name_files_outside_the_folder(healthy, kind, shard):
    name = "model.safetensors.index.json" if kind == "safetensors" else "pytorch_model.bin.index.json"
    (healthy / "model.safetensors").unlink()
    (healthy / name).write_text(json.dumps({"weight_map": {"encoder.layer.0.attention.self.query.weight": shard}}))
    with pytest.raises(SpecboundError, match="outside its folder"):
        open_checkpoint(healthy)


@pytest.mark.parametrize("weight_map", [["a", "b"], {"x": 3}, {"x": ""}, {"x": ["a"]}, "text"])
def test_pickle_index_of_the_wrong_types(healthy, weight_map):
    (healthy / "model.safetensors").unlink()
    (healthy / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(SpecboundError, match="weight_map"):
        open_checkpoint(healthy)


# --- malformed folders and files --------------------------------------------------------------------


def test_a_folder_named_model_safetensors(healthy):
    (healthy / "model.safetensors").unlink()
    (healthy / "model.safetensors").mkdir()
    with pytest.raises(SpecboundError, match="is a folder, not a file"):
        open_checkpoint(healthy)


@pytest.mark.parametrize("where", ["config.json", "model.safetensors.index.json"])
def test_deeply_nested_json_is_one_line(healthy, where):
    (healthy / where).write_text("[" * 5000 + "]" * 5000)
    if where != "config.json":
        (healthy / "model.safetensors").unlink()
    with pytest.raises(SpecboundError, match="nested more than"):
        open_checkpoint(healthy)


def test_config_not_utf8(healthy):
    (healthy / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(SpecboundError, match="UnicodeDecodeError"):
        open_checkpoint(healthy)


def test_unreadable_files_are_one_line(healthy, monkeypatch):
    """PermissionError (simulated: the tests may run as root, who reads anything)."""

    real = Path.open

    def deny(self, *args, **kwargs):
        if self.name == "config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", deny)
    with pytest.raises(SpecboundError, match="Permission denied; check the permissions"):
        open_checkpoint(healthy)


# --- in-memory sources --------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [123, 1.5, None.__class__, object()])
def test_analyze_of_a_non_model(source):
    with pytest.raises(SpecboundError, match="expected a model folder"):
        specbound.analyze(source, config={"model_type": "bert"})


@pytest.mark.parametrize("value", [[1.0, 2.0], "weights", 3, None])
def test_state_dict_holding_non_tensors(value):
    sd = {"encoder.layer.0.attention.self.query.weight": value}
    with pytest.raises(SpecboundError, match="expected tensor names"):
        specbound.analyze(sd, config={"model_type": "bert"})


def test_state_dict_with_non_string_names():
    with pytest.raises(SpecboundError, match="expected tensor names"):
        specbound.analyze({1: np.zeros((2, 2))}, config={"model_type": "bert"})


def test_zip_end_record_claiming_several_disks(healthy):
    """Found by the fuzz suite: zipfile.is_zipfile itself raised BadZipFile ("zipfiles that span
    multiple disks are not supported")."""
    folder = _as_pickle(healthy)
    path = folder / "pytorch_model.bin"
    data = bytearray(path.read_bytes())
    locator = data.rfind(b"PK\x06\x07")  # torch writes zip64: its end locator holds the number of disks
    assert locator > 0
    data[locator + 16] = 2
    path.write_bytes(bytes(data))
    with pytest.raises(SpecboundError, match="corrupt PyTorch zip checkpoint"):
        specbound.analyze(folder, threads=1)


def test_a_header_backed_by_a_sparse_file_is_refused_by_memory(tmp_path, monkeypatch):
    """A consistent header over a sparse file: 4 GiB of declared float32 (the file really is that
    long, and safetensors accepts it); its 8 GiB float64 healthy is refused before allocation."""

    n = 1 << 15
    path = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [n, n], "data_offsets": [0, 4 * n * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 4 * n * n)  # sparse: no disk used
    monkeypatch.setattr(specbound.io.base, "available_memory", lambda: 2 << 30)
    ckpt = SafetensorsCheckpoint("x", {}, {"w": path})
    assert ckpt.shape("w") == (n, n)
    with pytest.raises(SpecboundError, match="needs 8.0 GiB and 2.0 GiB of memory is available"):
        ckpt.read("w")
