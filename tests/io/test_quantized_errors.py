"""Hostile quantized checkpoints: each ends in one line on stderr naming what is wrong (the tensor
or setting at fault), with no numpy warning printed before it, and a setting that is right (MLX's
1-bit) is read."""

import json
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import shutil

from support import quant_writers as qw  # noqa: E402
from support.one_line import assert_one_line_error, run_cli  # noqa: E402

from specbound import SpecboundError  # noqa: E402
from specbound.io import open_checkpoint  # noqa: E402
from specbound.io.base import WEIGHTS_NOTE  # noqa: E402

Q = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant_errors")
    return root, qw.tiny_llama(root / "hf")


def _edit(folder, change=None, config=None):
    """The folder's tensors passed through ``change`` (name -> torch tensor; a numpy array put in is
    saved as it is), its config through ``config``."""
    import torch
    from safetensors.torch import load_file, save_file

    if change:
        tensors = load_file(str(folder / "model.safetensors"))
        change(tensors)
        tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in tensors.items()}
        save_file(tensors, str(folder / "model.safetensors"))
    if config:
        data = json.loads((folder / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data))
    return folder


def _one_line(capsys, folder, needles):
    """The CLI's analysis of ``folder`` ends in one error line holding ``needles``, with no warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, out, err = run_cli(capsys, folder, "--threads", "1")
    line = assert_one_line_error(rc, out, err, needles)
    assert not [str(w.message) for w in caught]
    return line


def _gptq(model, name, **kwargs):
    root, llama = model
    folder = root / name
    qw.write_gptq(llama, folder, 4, 32, kwargs.pop("sym", True), False, **kwargs)
    return folder


def test_a_float_weight_beside_a_gptq_module_is_refused_naming_both(model, capsys):
    def add(t):
        t[f"{Q}.weight"] = np.ones((qw.N, qw.N), dtype=np.float16)

    folder = _edit(_gptq(model, "float-beside"), add)
    _one_line(capsys, folder, [f"'{Q}.weight'", f"'{Q}.qweight'", "stored twice"])


@pytest.mark.parametrize("value", [np.inf, np.nan, -np.inf])
def test_gptq_scales_not_finite_one_line_without_warnings(model, capsys, value):
    def poison(t):
        t[f"{Q}.scales"][0, :3] = value

    folder = _edit(_gptq(model, f"scales-{value}"), poison)
    _one_line(capsys, folder, [f"'{Q}.scales'", "NaN/Inf", "expected finite"])


def test_gptq_scales_overflowing_float16_one_line_without_warnings(model, capsys):
    def huge(t):
        t[f"{Q}.scales"][:] = 60000.0

    folder = _edit(_gptq(model, "scales-huge"), huge)
    _one_line(capsys, folder, [f"'{Q}'", "NaN/Inf", "overflowing F16"])


def test_gptq_scales_one_group_short_blames_scales(model):
    def short(t):
        t[f"{Q}.scales"] = t[f"{Q}.scales"][:1]

    folder = _edit(_gptq(model, "scales-short"), short)
    with pytest.raises(SpecboundError, match=rf"tensor '{Q}.scales' is F16 \(1, 64\), expected F16/BF16/F32 \(2, 64\)"):
        open_checkpoint(folder)


def test_gptq_qweight_rows_short_blames_qweight(model):
    def short(t):
        t[f"{Q}.qweight"] = t[f"{Q}.qweight"][:7]

    folder = _edit(_gptq(model, "qweight-short"), short)
    with pytest.raises(
        SpecboundError,
        match=rf"'{Q}.qweight' has 7 rows, 56 4-bit inputs, where its g_idx and scales "
        rf"say 64",
    ):
        open_checkpoint(folder)


@pytest.fixture(scope="module")
def nvfp4(model):
    pytest.importorskip("compressed_tensors")
    root, llama = model
    args = dict(num_bits=4, type="float", strategy="tensor_group", group_size=16, symmetric=True)
    qw.write_compressed(llama, root / "nvfp4", args, "nvfp4-pack-quantized")
    return root / "nvfp4"


@pytest.mark.parametrize(
    "value, needles",
    [
        (np.array([np.inf], dtype=np.float32), ["1 NaN/Inf"]),
        (np.array([0.0], dtype=np.float32), ["1 non-positive"]),
        (np.zeros(0, dtype=np.float32), ["no value"]),
        (np.array([1.0, 2.0], dtype=np.float32), ["2 values, expected one"]),
    ],
)
def test_nvfp4_global_scale_finite_positive_one(nvfp4, tmp_path, capsys, value, needles):
    folder = shutil.copytree(nvfp4, tmp_path / "nvfp4")
    _edit(folder, lambda t: t.update({f"{Q}.weight_global_scale": value}))
    _one_line(capsys, folder, [f"{Q}", "weight_global_scale", *needles])


@pytest.fixture(scope="module")
def ct_pack(model):
    pytest.importorskip("compressed_tensors")
    root, llama = model
    args = dict(num_bits=4, type="int", strategy="group", group_size=16, symmetric=True)
    qw.write_compressed(llama, root / "ct-pack", args, "pack-quantized")
    return root / "ct-pack"


def test_a_float_weight_beside_a_packed_weight_is_refused_naming_both(ct_pack, tmp_path, capsys):
    folder = shutil.copytree(ct_pack, tmp_path / "ct")
    _edit(folder, lambda t: t.update({f"{Q}.weight": np.ones((qw.N, qw.N), dtype=np.float32)}))
    _one_line(capsys, folder, [f"'{Q}.weight'", f"'{Q}.weight_packed'", "stored twice"])


@pytest.mark.parametrize(
    "groups, needles",
    [
        ([1, 2], ["config_groups is a list"]),
        ("Linear", ["config_groups is a str"]),
        (7, ["config_groups is a int"]),
        ({"g": {"targets": [3], "weights": {}}}, ["the target 3"]),
        ({"g": {"targets": ["re:("], "weights": {}}}, ["'('", "not a valid regular expression"]),
    ],
)
def test_compressed_tensors_config_groups_of_the_wrong_kind(ct_pack, tmp_path, capsys, groups, needles):
    folder = shutil.copytree(ct_pack, tmp_path / "ct")
    _edit(folder, config=lambda c: c["quantization_config"].update(config_groups=groups))
    _one_line(capsys, folder, needles)


def test_compressed_tensors_backtracking_target_is_bounded(ct_pack, tmp_path, capsys):
    """A target that backtracks exponentially on a module name (minutes with ``re``) ends in one line."""

    folder = shutil.copytree(ct_pack, tmp_path / "ct")
    target = "re:^(.|.)*[A-Z]$"
    groups = {
        "g": {
            "targets": [target],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16, "symmetric": True},
        }
    }
    _edit(folder, config=lambda c: c["quantization_config"].update(config_groups=groups))
    start = time.monotonic()
    _one_line(capsys, folder, ["'^(.|.)*[A-Z]$'", "catastrophic backtracking"])
    assert time.monotonic() - start < 30


def test_mlx_group_size_zero_names_group_size(model, capsys):
    root, llama = model
    folder = root / "mlx-group-0"
    qw.write_mlx(llama, folder, 4, 32)
    _edit(folder, config=lambda c: c["quantization"].update(group_size=0))
    line = _one_line(capsys, folder, ["group_size = 0", "expected a positive number"])
    assert "lm_head" not in line and "shape" not in line


@pytest.mark.parametrize("role", ["scales", "biases"])
def test_mlx_scales_not_finite_one_line_without_warnings(model, capsys, role):
    root, llama = model
    folder = root / f"mlx-inf-{role}"
    qw.write_mlx(llama, folder, 4, 32)
    _edit(folder, lambda t: t[f"{Q}.{role}"].__setitem__((0, 0), float("inf")))
    _one_line(capsys, folder, [f"'{Q}.{role}'", "1 NaN/Inf"])


def test_mlx_one_bit_reads_as_its_layout(model):
    root, llama = model
    folder = root / "mlx-1"
    expected = qw.write_mlx(llama, folder, 1, 32)
    ckpt = open_checkpoint(folder)
    for name, want in expected.items():
        np.testing.assert_array_equal(ckpt.read(name), want, err_msg=name)
    assert "1-bit" in ckpt.facts.notes[WEIGHTS_NOTE]


@pytest.fixture(scope="module")
def bnb_saves(model):
    """4-bit NF4 (plain and nested) and LLM.int8 saves of the tiny LLaMA, written by transformers with
    bitsandbytes on CPU."""
    pytest.importorskip("bitsandbytes")
    import torch
    import transformers

    root, _ = model
    out = {}
    kinds = {
        "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
        "int8": dict(load_in_8bit=True),
        "nf4-nested": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    }
    for name, kwargs in kinds.items():
        saved = transformers.AutoModelForCausalLM.from_pretrained(
            str(root / "hf"),
            quantization_config=transformers.BitsAndBytesConfig(**kwargs),
            device_map="cpu",
            dtype=torch.float16,
        )
        saved.save_pretrained(str(root / f"bnb-{name}"))
        out[name] = root / f"bnb-{name}"
    return out


@pytest.mark.parametrize("kind, tensor", [("nf4", "weight.absmax"), ("int8", "SCB")])
def test_bitsandbytes_scales_not_finite_one_line_without_warnings(bnb_saves, tmp_path, capsys, kind, tensor):
    folder = shutil.copytree(bnb_saves[kind], tmp_path / kind)
    _edit(folder, lambda t: t[f"{Q}.{tensor}"].__setitem__(0, float("inf")))
    _one_line(capsys, folder, [f"'{Q}.{tensor}'", "1 NaN/Inf"])


@pytest.mark.parametrize("offset", [float("inf"), 10**400, "x"])
def test_bitsandbytes_nested_offset_not_a_float32_is_one_line(bnb_saves, tmp_path, capsys, offset):
    folder = shutil.copytree(bnb_saves["nf4-nested"], tmp_path / "nested")
    state = f"{Q}.weight.quant_state.bitsandbytes__nf4"

    def hostile(t):
        info = json.loads(bytes(t[state].numpy()).decode())
        info["nested_offset"] = offset
        t[state] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8).copy()

    _edit(folder, hostile)
    _one_line(capsys, folder, [repr(state), "nested_offset"])
