"""Broken checkpoints refused by the io stage (opening, headers, tensor reads): every one made from a
healthy tiny BERT by one edit, the healthy copy analysed first, so each case fails for the reason
it names and no other."""

import json
import shutil
import struct
import warnings

import numpy as np
import pytest
from safetensors.numpy import save_file
from support.one_line import (
    INDEX,
    WEIGHTS,
    assert_api_error,
    assert_broken_checkpoint_error,
    assert_one_line_error,
    data_start,
    edit_tensors,
    run_cli,
)

import specbound
from specbound import SpecboundError
from specbound.io.safetensors_file import SafetensorsCheckpoint


def missing_path(d):
    return d.parent / "no-such-model", ["no-such-model", "does not exist"]


def a_file_not_a_folder(d):
    return d / "config.json", ["expected a model folder or a weights file", str(d / "config.json")]


def no_config(d):
    (d / "config.json").unlink()
    return d, ["no config.json", "save_pretrained"]


def config_not_json(d):
    (d / "config.json").write_text('{"model_type": "bert",')
    return d, ["cannot read the model config", "config.json", "as JSON"]


def config_no_weights(d):
    (d / WEIGHTS).unlink()
    return d, ["has no weights", WEIGHTS, INDEX, "['config.json']", "save_pretrained"]


def only_pytorch_bin(d):  # a broken (empty) pickle: refused through torch.load(weights_only=True)
    (d / WEIGHTS).unlink()
    (d / "pytorch_model.bin").write_bytes(b"")
    return d, ["pytorch_model.bin", "torch.load(weights_only=True)"]


def only_stray_pickle(d):
    (d / WEIGHTS).unlink()
    (d / "training_state.pt").write_bytes(b"")
    return d, ["has no weights", WEIGHTS, "training_state.pt", "weights.pt"]


def nan_weight(d):
    def edit(t):
        t["encoder.layer.1.attention.self.key.weight"][3, 4] = np.nan

    edit_tensors(d, edit)
    return d, ["'encoder.layer.1.attention.self.key.weight'", "NaN/Inf", WEIGHTS]


def inf_weight(d):
    def edit(t):
        t["encoder.layer.0.intermediate.dense.weight"][0, 0] = -np.inf
        t["encoder.layer.0.intermediate.dense.weight"][5, 1] = np.inf

    edit_tensors(d, edit)
    return d, ["'encoder.layer.0.intermediate.dense.weight'", "2 NaN/Inf"]


def quantized_weight(d):
    def edit(t):
        t["encoder.layer.0.attention.self.value.weight"] = np.ones((32, 32), dtype=np.int8)

    edit_tensors(d, edit)
    return d, ["'encoder.layer.0.attention.self.value.weight'", "I8", "dequantize"]


def truncated(d):
    path = d / WEIGHTS
    data = path.read_bytes()
    start = data_start(path)
    path.write_bytes(data[: start + (len(data) - start) // 2])  # cut in the middle of the data
    return d, [str(path), "truncated or corrupt"]


def empty_file(d):
    (d / WEIGHTS).write_bytes(b"")
    return d, [str(d / WEIGHTS), "truncated or corrupt"]


def garbage_header(d):
    path = d / WEIGHTS
    data = path.read_bytes()
    path.write_bytes(b"\xde\xad\xbe\xef garbage" + data[16:])
    return d, [str(path), "truncated or corrupt"]


def header_length_past_end(d):
    path = d / WEIGHTS
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", len(data) + 1000) + data[8:])
    return d, [str(path), "truncated or corrupt"]


def header_not_json(d):
    path = d / WEIGHTS
    data = bytearray(path.read_bytes())
    data[8:16] = b"not json"
    path.write_bytes(bytes(data))
    return d, [str(path), "truncated or corrupt"]


IO_CASES = [
    missing_path,
    a_file_not_a_folder,
    no_config,
    config_not_json,
    config_no_weights,
    only_pytorch_bin,
    only_stray_pickle,
    nan_weight,
    inf_weight,
    quantized_weight,
    truncated,
    empty_file,
    garbage_header,
    header_length_past_end,
    header_not_json,
]


@pytest.mark.parametrize("breaker", IO_CASES, ids=[f.__name__ for f in IO_CASES])
def test_broken_checkpoint(breaker, healthy, capsys):
    assert_broken_checkpoint_error(breaker, healthy, capsys)


def test_the_healthy_copy_is_analysed(healthy, capsys):
    rc, out, err = run_cli(capsys, healthy, "--format", "json")
    assert rc == 0 and err == ""
    assert json.loads(out)["model"]["L"] == 2


@pytest.mark.parametrize("breaker", [nan_weight, inf_weight, quantized_weight, truncated], ids=lambda f: f.__name__)
def test_broken_layer_with_layers_in_parallel(breaker, healthy, capsys):
    """A layer failing in a worker thread is the same one-line error, not a traceback."""
    source, needles = breaker(healthy)
    line = assert_one_line_error(*run_cli(capsys, source, "--jobs", "2"), needles)
    with pytest.raises(SpecboundError) as err:
        specbound.analyze(source, jobs=2)
    assert str(err.value) == line.removeprefix("specbound: error: ")


# --- sharded checkpoints ---


@pytest.fixture
def sharded(tiny_dir, tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_dir("bert", "sharded"), folder)
    return folder


def _weight_map(folder):
    return json.loads((folder / INDEX).read_text())["weight_map"]


def _shard_of(folder, name):
    return folder / _weight_map(folder)[name]


def test_the_healthy_sharded_copy_is_analysed(sharded):
    assert len(set(_weight_map(sharded).values())) > 2
    assert specbound.analyze(sharded, threads=1).model["L"] == 2


def test_index_names_a_missing_shard(sharded, capsys):
    shard = _shard_of(sharded, "encoder.layer.1.output.dense.weight")
    shard.unlink()
    needles = [shard.name, "missing", str(sharded / INDEX)]
    assert_one_line_error(*run_cli(capsys, sharded), needles)
    assert_api_error(needles, sharded)


def test_truncated_shard_names_file_and_tensor(sharded, capsys):
    name = "encoder.layer.1.output.dense.weight"
    shard = _shard_of(sharded, name)
    data = shard.read_bytes()
    start = data_start(shard)
    shard.write_bytes(data[: start + (len(data) - start) // 2])
    # the shard is opened lazily, when its first tensor is needed: the message names both
    first_in_shard = sorted(
        n
        for n, s in _weight_map(sharded).items()
        if s == shard.name and n.endswith(".weight") and "LayerNorm" not in n and n.startswith("encoder.")
    )
    needles = [str(shard), "truncated or corrupt", "tensor '"]
    line = assert_one_line_error(*run_cli(capsys, sharded), needles)
    assert any(f"'{n}'" in line for n in first_in_shard), line
    assert_api_error(needles, sharded)


def test_index_maps_a_tensor_to_the_wrong_shard(sharded, capsys):
    name = "encoder.layer.1.attention.self.query.weight"
    index = json.loads((sharded / INDEX).read_text())
    right = index["weight_map"][name]
    index["weight_map"][name] = next(s for s in sorted(set(index["weight_map"].values())) if s != right)
    (sharded / INDEX).write_text(json.dumps(index))
    needles = [f"does not contain the tensor '{name}'", index["weight_map"][name], INDEX]
    assert_one_line_error(*run_cli(capsys, sharded), needles)
    assert_api_error(needles, sharded)


@pytest.mark.parametrize(
    "text",
    [
        '{"weight_map": ["a", "b"]}',
        '{"metadata": {}}',
        "not json",
        '{"weight_map": {"encoder.layer.0.attention.self.query.weight": 3}}',
    ],
)
def test_malformed_shard_index(sharded, capsys, text):
    (sharded / INDEX).write_text(text)
    needles = [str(sharded / INDEX), "weight_map"]
    assert_one_line_error(*run_cli(capsys, sharded), needles)
    assert_api_error(needles, sharded)


def test_finite_check_is_exact_for_huge_values(tmp_path):
    """The NaN/Inf check sums first: a sum that overflows on huge finite weights is no error, and
    one NaN among them still is, counted exactly."""

    path = tmp_path / "w.safetensors"
    save_file({"huge": np.array([1e308, 1e308, -1.0]), "nan": np.array([1e308, np.nan, np.inf, 2.0])}, str(path))
    ckpt = SafetensorsCheckpoint(str(tmp_path), {}, {"huge": path, "nan": path})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning leaks to the user either
        np.testing.assert_array_equal(ckpt.read("huge"), [1e308, 1e308, -1.0])
    with pytest.raises(SpecboundError, match=r"'nan' .* holds 2 NaN/Inf"):
        ckpt.read("nan")
