"""Bad input: one clear line on stderr and exit status 2 from the CLI, never a traceback; the
Python API raises SpecboundError with the same message.

Every broken checkpoint is made from a healthy tiny BERT (tests/conftest.py) by one edit, and the
healthy copy is analysed first, so each case fails for the reason it names and no other.
"""

import json
import shutil
import struct
from importlib import resources

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import specbound
from specbound import SpecboundError
from specbound.cli import main

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def run_cli(capsys, *args):
    capsys.readouterr()  # drop anything a fixture printed
    rc = main(["analyze", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, out, err, needles):
    assert rc == 2, (rc, out, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("specbound: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def assert_api_error(needles, *args, **kwargs):
    with pytest.raises(SpecboundError) as info:
        specbound.analyze(*args, threads=1, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# -------------------------------------------------------------------------------------------------
# Edits that break a copy of the healthy tiny BERT.  Each returns (source to analyse, needles that
# the message must contain).
# -------------------------------------------------------------------------------------------------

def _config(folder):
    return json.loads((folder / "config.json").read_text())


def _write_config(folder, **changes):
    config = _config(folder)
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _edit_tensors(folder, edit):
    tensors = load_file(str(folder / WEIGHTS))
    edit(tensors)
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})


def _data_start(path):
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + n


def missing_path(d):
    return d.parent / "no-such-model", ["no-such-model", "does not exist"]


def a_file_not_a_folder(d):
    return d / "config.json", ["expected a model folder or a weights file", str(d / "config.json")]


def no_config(d):
    (d / "config.json").unlink()
    return d, ["no config.json", "save_pretrained"]


def config_not_json(d):
    (d / "config.json").write_text('{"model_type": "bert",')
    return d, ["cannot parse", "config.json"]


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


def unsupported_family(d):
    _write_config(d, model_type="t5")
    from specbound.archs import supported_model_types

    listed = ", ".join(supported_model_types())
    assert "gpt2" in listed and "llama" in listed and "bert" in listed
    return d, ["'t5'", listed, "--arch-spec", "specbound arch infer SOURCE"]


def no_model_type(d):
    config = _config(d)
    del config["model_type"]
    (d / "config.json").write_text(json.dumps(config))
    return d, ["model_type=None", "--arch-spec"]


def missing_tensor(d):
    _edit_tensors(d, lambda t: t.pop("encoder.layer.1.output.dense.weight"))
    return d, ["missing tensor 'encoder.layer.1.output.dense.weight'", "layer 1", "2 layers"]


def config_says_more_layers(d):
    _write_config(d, num_hidden_layers=3)
    return d, ["missing tensor 'encoder.layer.2.", "3 layers"]


def no_layer_tensors(d):  # layer tensors under other names: not this family's layout
    _edit_tensors(d, lambda t: t.update({k.replace("encoder.layer.", "encoder.block."): t.pop(k) for k in list(t)}))
    return d, ["encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.0", "--arch-spec",
               "specbound arch infer SOURCE"]


def two_wrapped_models(d):  # a wrapper prefix is accepted only when it is unambiguous
    def edit(t):
        for k in list(t):
            t["student." + k] = t[k].copy()
            t["teacher." + k] = t.pop(k)
    _edit_tensors(d, edit)
    return d, ["ambiguous", "'student.'", "'teacher.'"]


def ff_size_mismatch(d):
    _write_config(d, intermediate_size=64)  # the tensors are 48 wide
    return d, ["'encoder.layer.0.intermediate.dense.weight'", "(48, 32)", "ff_size=64", "(64, 32)"]


def hidden_size_mismatch(d):
    _write_config(d, hidden_size=64)  # the tensors are 32 wide
    return d, ["'encoder.layer.0.attention.self.query.weight'", "(32, 32)", "hidden_size=64", "(64, 64)"]


def heads_do_not_divide(d):
    _write_config(d, num_attention_heads=5)
    return d, ["hidden_size=32", "num_heads=5"]


def config_not_an_integer(d):
    _write_config(d, num_hidden_layers="two")
    return d, ["num_hidden_layers", "'two'"]


def nan_weight(d):
    def edit(t):
        t["encoder.layer.1.attention.self.key.weight"][3, 4] = np.nan
    _edit_tensors(d, edit)
    return d, ["'encoder.layer.1.attention.self.key.weight'", "NaN/Inf", WEIGHTS]


def inf_weight(d):
    def edit(t):
        t["encoder.layer.0.intermediate.dense.weight"][0, 0] = -np.inf
        t["encoder.layer.0.intermediate.dense.weight"][5, 1] = np.inf
    _edit_tensors(d, edit)
    return d, ["'encoder.layer.0.intermediate.dense.weight'", "2 NaN/Inf"]


def quantized_weight(d):
    def edit(t):
        t["encoder.layer.0.attention.self.value.weight"] = np.ones((32, 32), dtype=np.int8)
    _edit_tensors(d, edit)
    return d, ["'encoder.layer.0.attention.self.value.weight'", "I8", "dequantize"]


def truncated(d):
    path = d / WEIGHTS
    data = path.read_bytes()
    start = _data_start(path)
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


def stray_tensor(d):
    _edit_tensors(d, lambda t: t.update({"encoder.layer.0.attention.adapter.weight": np.ones((4, 4), np.float32)}))
    return d, ["unaccounted", "encoder.layer.0.attention.adapter.weight", "ignore", "--arch-spec"]


CHECKPOINT_CASES = [
    missing_path, a_file_not_a_folder, no_config, config_not_json, config_no_weights, only_pytorch_bin,
    only_stray_pickle, unsupported_family, no_model_type, missing_tensor, config_says_more_layers, no_layer_tensors,
    two_wrapped_models, ff_size_mismatch, hidden_size_mismatch, heads_do_not_divide, config_not_an_integer, nan_weight,
    inf_weight, quantized_weight, truncated, empty_file, garbage_header, header_length_past_end,
    header_not_json, stray_tensor,
]


@pytest.fixture
def healthy(tiny_bert_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, folder)
    return folder


def test_the_healthy_copy_is_analysed(healthy, capsys):
    rc, out, err = run_cli(capsys, healthy, "--format", "json")
    assert rc == 0 and err == ""
    assert json.loads(out)["model"]["L"] == 2


@pytest.mark.parametrize("breaker", CHECKPOINT_CASES, ids=[f.__name__ for f in CHECKPOINT_CASES])
def test_broken_checkpoint(breaker, healthy, capsys):
    source, needles = breaker(healthy)
    line = assert_one_line_error(*run_cli(capsys, source), needles)
    assert assert_api_error(needles, source) == line.removeprefix("specbound: error: ")


@pytest.mark.parametrize("breaker", [nan_weight, inf_weight, quantized_weight, truncated],
                         ids=lambda f: f.__name__)
def test_broken_layer_with_layers_in_parallel(breaker, healthy, capsys):
    """A layer failing in a worker thread is the same one-line error, not a traceback."""
    source, needles = breaker(healthy)
    line = assert_one_line_error(*run_cli(capsys, source, "--jobs", "2"), needles)
    with pytest.raises(SpecboundError) as err:
        specbound.analyze(source, jobs=2)
    assert str(err.value) == line.removeprefix("specbound: error: ")


# --- sharded checkpoints ----------------------------------------------------------------------------

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
    start = _data_start(shard)
    shard.write_bytes(data[: start + (len(data) - start) // 2])
    # the shard is opened lazily, when its first tensor is needed: the message names both
    first_in_shard = sorted(n for n, s in _weight_map(sharded).items() if s == shard.name
                            and n.endswith(".weight") and "LayerNorm" not in n and n.startswith("encoder."))
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


@pytest.mark.parametrize("text", ['{"weight_map": ["a", "b"]}', '{"metadata": {}}', "not json",
                                  '{"weight_map": {"encoder.layer.0.attention.self.query.weight": 3}}'])
def test_malformed_shard_index(sharded, capsys, text):
    (sharded / INDEX).write_text(text)
    needles = [str(sharded / INDEX), "weight_map"]
    assert_one_line_error(*run_cli(capsys, sharded), needles)
    assert_api_error(needles, sharded)


# --- --out ----------------------------------------------------------------------------------------

def test_out_is_a_file(tiny_bert_dir, tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("keep me")
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--out", target), [str(target), "is a file", "folder"])
    assert target.read_text() == "keep me"


def test_out_cannot_be_created(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    target = tmp_path / "taken" / "sub"  # a folder below a file
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--out", target), ["cannot write", str(target)])


# --- options ------------------------------------------------------------------------------------------

OPTION_CASES = [
    (["--grid-m", "0"], ["--grid-m", "positive integer", "'0'"]),
    (["--grid-m", "-3"], ["--grid-m", "'-3'"]),
    (["--grid-m", "1.5"], ["--grid-m", "'1.5'"]),
    (["--grid-m", "many"], ["--grid-m", "'many'"]),
    (["--rank-tol", "abc"], ["--rank-tol", "'abc'"]),
    (["--rank-tol=-1e-10"], ["rank_tol", "[0, 1)", "-1e-10"]),
    (["--rank-tol", "1"], ["rank_tol", "[0, 1)"]),
    (["--rank-tol", "nan"], ["rank_tol", "nan"]),
    (["--l-phi", "0"], ["l_phi", "positive"]),
    (["--l-phi", "inf"], ["l_phi", "finite", "inf"]),
    (["--threads", "0"], ["--threads", "'0'"]),
    (["--jobs", "0"], ["--jobs", "'0'", "'auto'"]),
    (["--format", "xml"], ["--format", "'xml'"]),
    (["--no-such-option"], ["--no-such-option"]),
]


@pytest.mark.parametrize("args, needles", OPTION_CASES, ids=[" ".join(a) for a, _ in OPTION_CASES])
def test_invalid_option(tiny_bert_dir, capsys, args, needles):
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, *args), needles)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(grid_m=0), "grid_m"), (dict(grid_m=1.5), "grid_m"), (dict(rank_tol=-1.0), "rank_tol"),
    (dict(rank_tol=float("nan")), "rank_tol"), (dict(l_phi=float("inf")), "l_phi"),
    (dict(threads=0), "threads"), (dict(method="exact"), "method"), (dict(jobs=0), "jobs"),
    (dict(jobs=1.5), "jobs"), (dict(jobs="many"), "jobs"), (dict(jobs=True), "jobs"),
])
def test_invalid_option_api(tiny_bert_dir, kwargs, needle):
    with pytest.raises(SpecboundError, match=needle):
        specbound.analyze(tiny_bert_dir, **kwargs)


def test_valid_options_still_work(tiny_bert_dir, capsys):
    rc, out, err = run_cli(capsys, tiny_bert_dir, "--grid-m", "3", "--rank-tol", "0", "--format", "json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["options"]["grid_m"] == 3 and doc["options"]["rank_tol"] == 0


# --- --arch-spec ------------------------------------------------------------------------------------

def _bert_spec():
    return json.loads(resources.files("specbound.archs").joinpath("data", "bert.json").read_text())


def _without(d, key):
    d = dict(d)
    del d[key]
    return d


SPEC_CASES = {
    "bad_json": ('{"family": "bert",', ["cannot read architecture spec", "JSON"]),
    "not_an_object": ([1, 2], ["JSON object"]),
    "unknown_role": (lambda s: {**s, "tensors": {**s["tensors"], "qkvo": s["tensors"]["q"]}},
                     ["unknown role 'qkvo'", "'ff_in'"]),
    "fused_without_layout": (lambda s: {**s, "tensors": {**s["tensors"], "qkv": s["tensors"]["q"]}},
                             ["'fused' for qkv must be one of ['concat', 'per_head']"]),
    "fused_and_separate": (lambda s: {**s, "tensors": {**s["tensors"], "qkv": {**s["tensors"]["q"], "fused": "concat"}}},
                           ["unexpected ['q', 'k', 'v']"]),
    "gated_roles_in_plain": (lambda s: {**s, "tensors": {**s["tensors"], "ff_gate": s["tensors"]["ff_in"]}},
                             ["plain feed-forward", "unexpected ['ff_gate']"]),
    "missing_role": (lambda s: {**s, "tensors": _without(s["tensors"], "ff_out")}, ["missing ['ff_out']"]),
    "name_not_a_string": (lambda s: {**s, "tensors": {**s["tensors"], "q": {"name": 3, "layout": "linear"}}},
                          ["'q'", "${layer}"]),
    "name_without_layer": (lambda s: {**s, "tensors": {**s["tensors"], "q": {"name": "q.weight", "layout": "linear"}}},
                           ["'q'", "${layer}"]),
    "unknown_layout": (lambda s: {**s, "tensors": {**s["tensors"], "o": {"name": "${layer}.o", "layout": "fused"}}},
                       ["layout", "'fused'"]),
    "unknown_key": (lambda s: {**s, "temperature": True}, ["unknown keys ['temperature']"]),
    "bad_rotary": (lambda s: {**s, "rotary": True}, ["'rotary' must be an object"]),
    "missing_config_field": (lambda s: {**s, "config": _without(s["config"], "ff_size")}, ["'ff_size'"]),
    "bad_regex": (lambda s: {**s, "ignore": ["(unclosed"]}, ["'(unclosed'", "regular expression"]),
}


def _spec_file(tmp_path, case):
    body, needles = SPEC_CASES[case]
    path = tmp_path / f"{case}.json"
    if callable(body):
        body = body(_bert_spec())
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path, needles


def test_shipped_spec_passed_as_file_works(tiny_bert_dir, tmp_path, capsys):
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(_bert_spec()))
    rc, out, err = run_cli(capsys, tiny_bert_dir, "--arch-spec", path, "--format", "json")
    assert rc == 0 and err == ""
    assert json.loads(out)["bounds"] == specbound.analyze(tiny_bert_dir, threads=1).to_dict()["bounds"]


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_malformed_arch_spec(tiny_bert_dir, tmp_path, capsys, case):
    path, needles = _spec_file(tmp_path, case)
    needles = [str(path), *needles]
    line = assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--arch-spec", path), needles)
    assert "docs/architectures.md" in line
    assert_api_error(needles, tiny_bert_dir, arch_spec=path)


def test_arch_spec_file_missing(tiny_bert_dir, tmp_path, capsys):
    path = tmp_path / "nope.json"
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--arch-spec", path), ["not found", str(path)])
    assert_api_error(["not found"], tiny_bert_dir, arch_spec=tmp_path)


def test_optional_config_field_not_an_integer(tiny_bert_dir, tmp_path, capsys):
    spec = _bert_spec()
    spec["config"]["head_dim"] = ["head_dim"]
    spec_path = tmp_path / "with_head_dim.json"
    spec_path.write_text(json.dumps(spec))
    folder = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, folder)
    _write_config(folder, head_dim=8)
    assert specbound.analyze(folder, arch_spec=spec_path, threads=1).model["d_head"] == 8
    _write_config(folder, head_dim="eight")
    needles = ["positive integer head_dim", "'eight'"]
    assert_one_line_error(*run_cli(capsys, folder, "--arch-spec", spec_path), needles)
    assert_api_error(needles, folder, arch_spec=spec_path)


def test_auto_jobs_follow_cores_layers_and_memory(tiny_bert_dir, monkeypatch):
    """jobs="auto" (the command line's default): one layer per core, never more than the layers,
    and no more than half the available memory holds at a layer's float64 weights a job."""
    import specbound.pipeline as analysis

    model = analysis.open_model(tiny_bert_dir)
    assert analysis.layer_float64_bytes(model.dims) == 8 * (2 * 32 * 8 * (4 + 4) + 2 * 32 * 48)  # N=32, 4x8, d_ff=48
    per_job = analysis._LAYER_PEAK_FACTOR * analysis.layer_float64_bytes(model.dims)
    monkeypatch.setattr(analysis, "available_cores", lambda: 8)
    monkeypatch.setattr(analysis, "available_memory", lambda: 100 * per_job)
    assert analysis.auto_jobs(model) == 2  # two layers
    monkeypatch.setattr(analysis, "available_memory", lambda: 3 * per_job)
    assert analysis.auto_jobs(model) == 1  # half the memory holds one layer and a half
    assert analysis.auto_jobs(model, readers=2) == 1
    monkeypatch.setattr(analysis, "available_memory", lambda: None)
    monkeypatch.setattr(analysis, "available_cores", lambda: 1)
    assert analysis.auto_jobs(model) == 1
    one = specbound.analyze(tiny_bert_dir, threads=1)
    monkeypatch.setattr(analysis, "available_cores", lambda: 2)
    assert specbound.analyze(tiny_bert_dir, jobs="auto").all_bounds() == one.all_bounds()


def test_finite_check_is_exact_for_huge_values(tmp_path):
    """The NaN/Inf check sums first: a sum that overflows on huge finite weights is no error, and
    one NaN among them still is, counted exactly."""
    import warnings

    from safetensors.numpy import save_file

    from specbound.io.safetensors_file import SafetensorsCheckpoint

    path = tmp_path / "w.safetensors"
    save_file({"huge": np.array([1e308, 1e308, -1.0]), "nan": np.array([1e308, np.nan, np.inf, 2.0])}, str(path))
    ckpt = SafetensorsCheckpoint(str(tmp_path), {}, {"huge": path, "nan": path})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning leaks to the user either
        np.testing.assert_array_equal(ckpt.read("huge"), [1e308, 1e308, -1.0])
    with pytest.raises(SpecboundError, match=r"'nan' .* holds 2 NaN/Inf"):
        ckpt.read("nan")
