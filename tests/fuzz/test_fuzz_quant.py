"""Hostile quantized and CTranslate2 checkpoints: a mutated model.bin, a quantization_config of any
JSON, and stored quantized tensors of any shape and dtype each end in the weights or in one
SpecboundError line, never a traceback, a hang or an unbounded allocation."""

import json
import shutil
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import quant_writers as qw
from support.ct2_models import convert, hf_model, rewrite_model_bin
from support.fuzz import EDITS, FUZZ, JSON, clean_outcome, mutate

from specbound import SpecboundError
from specbound.io import open_checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _open_and_read(folder):
    ckpt = open_checkpoint(folder)
    for name in ckpt.names:
        if ckpt.dtype(name) in ("F32", "F16", "BF16", "F64"):
            ckpt.read(name)
    return ckpt


@pytest.fixture(scope="module")
def ct2_bytes(tmp_path_factory):
    pytest.importorskip("ctranslate2")

    root = tmp_path_factory.mktemp("fuzz_ct2")
    hf_model("llama", root / "hf")
    folder = convert(root / "hf", root / "ct2", "int8")
    return (folder / "model.bin").read_bytes(), (folder / "config.json").read_bytes()


@FUZZ
@given(edits=EDITS)
def test_mutated_ctranslate2_model_bin(ct2_bytes, tmp_path_factory, edits):
    folder = tmp_path_factory.mktemp("ct2")
    (folder / "model.bin").write_bytes(mutate(ct2_bytes[0], edits))
    (folder / "config.json").write_bytes(ct2_bytes[1])
    clean_outcome(_open_and_read, folder)


@pytest.fixture(scope="module")
def gptq(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_gptq")
    model = qw.tiny_llama(root / "hf")
    qw.write_gptq(model, root / "gptq", 4, 32, False, True)
    return root / "gptq"


QUANT_KEYS = st.fixed_dictionaries(
    {},
    optional={
        "quant_method": st.sampled_from(["gptq", "awq", "compressed-tensors", "bitsandbytes", "mlx", "hqq", 3]),
        "bits": st.one_of(st.integers(-2, 40), JSON),
        "group_size": st.one_of(st.integers(-2, 200), JSON),
        "checkpoint_format": st.sampled_from(["gptq", "gptq_v2", "marlin"]),
        "version": st.sampled_from(["gemm", "gemv"]),
        "format": st.sampled_from(["pack-quantized", "float-quantized", "dense", "sparse"]),
        "config_groups": JSON,
    },
)


@FUZZ
@given(qc=st.one_of(QUANT_KEYS, JSON))
def test_any_quantization_config(gptq, tmp_path_factory, qc):
    folder = tmp_path_factory.mktemp("qc")
    shutil.copy(gptq / "model.safetensors", folder / "model.safetensors")
    config = json.loads((gptq / "config.json").read_text())
    config["quantization_config"] = qc
    (folder / "config.json").write_text(json.dumps(config))
    clean_outcome(_open_and_read, folder)


@pytest.fixture(scope="module")
def quantized(gptq):
    """One folder per format, each of the same tiny LLaMA: format -> (folder, roles of q_proj)."""

    root = gptq.parent
    model = qw.tiny_llama(root / "hf2")
    qw.write_awq(model, root / "awq", 32)
    qw.write_mlx(model, root / "mlx", 3, 32)
    # "weight" beside a module's quantized tensors: a leftover float (or any) weight for the same matrix
    out = {
        "gptq": (gptq, ["qweight", "qzeros", "scales", "g_idx", "weight"]),
        "awq": (root / "awq", ["qweight", "qzeros", "scales", "weight"]),
        "mlx": (root / "mlx", ["weight", "scales", "biases"]),
    }
    if __import__("importlib").util.find_spec("compressed_tensors"):
        qw.write_compressed(
            model,
            root / "ct-pack",
            dict(num_bits=4, type="int", strategy="group", group_size=16, symmetric=False),
            "pack-quantized",
        )
        qw.write_compressed(
            model,
            root / "ct-fp4",
            dict(num_bits=4, type="float", strategy="tensor_group", group_size=16, symmetric=True),
            "nvfp4-pack-quantized",
        )
        out["ct-pack"] = (
            root / "ct-pack",
            ["weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight"],
        )
        out["ct-fp4"] = (root / "ct-fp4", ["weight_packed", "weight_scale", "weight_global_scale", "weight"])
    return out


DTYPES = st.sampled_from([np.int32, np.uint32, np.int8, np.uint8, np.float16, np.float32, np.int64])


@FUZZ
@given(
    data=st.data(), shape=st.lists(st.integers(0, 70), min_size=0, max_size=3), dtype=DTYPES, seed=st.integers(0, 2**16)
)
def test_stored_quantized_tensors_of_any_shape(quantized, tmp_path_factory, data, shape, dtype, seed):
    """One stored tensor of q_proj replaced (or, for a "weight" beside quantized tensors, added) by
    values of any shape and dtype, in every format."""

    import torch
    from safetensors.torch import load_file, save_file

    kind = data.draw(st.sampled_from(sorted(quantized)))
    source, roles = quantized[kind]
    role = data.draw(st.sampled_from(roles))
    folder = tmp_path_factory.mktemp("shape")
    shutil.copy(source / "config.json", folder / "config.json")
    tensors = load_file(str(source / "model.safetensors"))
    rng = np.random.default_rng(seed)
    tensors[f"model.layers.0.self_attn.q_proj.{role}"] = torch.from_numpy(
        rng.integers(-100, 100, size=shape).astype(dtype)
    )
    save_file(tensors, str(folder / "model.safetensors"))
    outcome = clean_outcome(_open_and_read, folder)
    if role == "weight" and kind != "mlx":  # two tensors for one matrix: refused, never one silently read
        assert isinstance(outcome, SpecboundError), outcome


def _quiet(call, *args):
    """``clean_outcome`` with numpy's warnings turned into errors: a refusal is one line, with no
    RuntimeWarning printed before it."""

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return clean_outcome(call, *args)


# Stored floats a hostile scale may hold: non-finite, zero, subnormal, huge.
HOSTILE_FLOATS = st.sampled_from([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, 1e-38, 6e4, 3e38, -1.0, 0.5])


@FUZZ
@given(data=st.data(), values=st.lists(HOSTILE_FLOATS, min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_quantization_scales_of_any_value(quantized, tmp_path_factory, data, values, seed):
    """Scales, biases and global scales of q_proj holding non-finite, zero, tiny or huge values, in
    every format: the dequantized weights, or one line naming the tensor, never a numpy warning."""

    import torch
    from safetensors.torch import load_file, save_file

    kind = data.draw(st.sampled_from(sorted(quantized)))
    source, roles = quantized[kind]
    role = data.draw(st.sampled_from([r for r in roles if "scale" in r or r == "biases"]))
    folder = tmp_path_factory.mktemp("scales")
    shutil.copy(source / "config.json", folder / "config.json")
    tensors = load_file(str(source / "model.safetensors"))
    stored = tensors[f"model.layers.0.self_attn.q_proj.{role}"]
    flat = stored.float().reshape(-1).clone()
    rng = np.random.default_rng(seed)
    if flat.numel():
        flat[torch.from_numpy(rng.integers(0, flat.numel(), size=len(values)))] = torch.tensor(values)
    tensors[f"model.layers.0.self_attn.q_proj.{role}"] = flat.reshape(stored.shape).to(stored.dtype)
    save_file(tensors, str(folder / "model.safetensors"))
    _quiet(_open_and_read, folder)


TARGETS = st.one_of(
    st.sampled_from(
        [
            "Linear",
            "re:.*",
            "re:(",
            "re:^(.|.)*[A-Z]$",
            "re:model\\..*proj",
            "re:[",
            "model.layers.0.self_attn.q_proj",
            "re:(?<=a+)b",
            "re:" + "(" * 300,
        ]
    ),
    JSON,
)


@FUZZ
@given(
    groups=st.one_of(
        JSON,
        st.dictionaries(
            st.text(max_size=5),
            st.fixed_dictionaries(
                {"targets": st.one_of(TARGETS, st.lists(TARGETS, max_size=3))},
                optional={
                    "weights": st.one_of(
                        JSON,
                        st.just(
                            {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16, "symmetric": False}
                        ),
                    ),
                    "format": st.sampled_from(["pack-quantized", "dense", "marlin-24"]),
                },
            ),
            max_size=3,
        ),
    )
)
def test_compressed_tensors_config_groups_of_any_shape(quantized, tmp_path_factory, groups):
    """config_groups of any JSON and targets of any kind (bad and backtracking ``re:`` patterns
    included) on a pack-quantized folder: the weights or one line, within the example's time limit."""

    if "ct-pack" not in quantized:
        pytest.skip("compressed_tensors is not installed")
    source = quantized["ct-pack"][0]
    folder = tmp_path_factory.mktemp("groups")
    shutil.copy(source / "model.safetensors", folder / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"]["config_groups"] = groups
    (folder / "config.json").write_text(json.dumps(config))
    _quiet(_open_and_read, folder)


@FUZZ
@given(
    settings_=st.fixed_dictionaries(
        {},
        optional={
            "bits": st.one_of(st.integers(-1, 9), JSON),
            "group_size": st.one_of(st.integers(-2, 70), JSON),
            "mode": st.sampled_from(["affine", "mxfp4"]),
            "model.layers.0.self_attn.q_proj": st.one_of(
                st.booleans(),
                JSON,
                st.fixed_dictionaries({"bits": st.integers(0, 9), "group_size": st.integers(-1, 70)}),
            ),
        },
    )
)
def test_mlx_quantization_settings_of_any_value(quantized, tmp_path_factory, settings_):
    """MLX's bits (1-8 and beyond), group_size (0, negative, not dividing) and per-module overrides."""

    source = quantized["mlx"][0]
    folder = tmp_path_factory.mktemp("mlx")
    shutil.copy(source / "model.safetensors", folder / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization"] = {"bits": 3, "group_size": 32, **settings_}
    (folder / "config.json").write_text(json.dumps(config))
    _quiet(_open_and_read, folder)


@pytest.fixture(scope="module")
def ct2_int8(tmp_path_factory):
    pytest.importorskip("ctranslate2")

    root = tmp_path_factory.mktemp("fuzz_ct2_edit")
    hf_model("whisper", root / "hf")
    return convert(root / "hf", root / "ct2", "int8")


@FUZZ
@given(
    data=st.data(),
    edits=st.lists(st.sampled_from(["rank0", "rank1", "rank3", "twice", "alias", "scale"]), min_size=1, max_size=3),
)
def test_ctranslate2_variables_of_any_rank_or_repeated(ct2_int8, tmp_path_factory, data, edits):
    """Variables re-serialized with another rank, held twice, aliased twice or with hostile scales."""

    def edit(variables, aliases):
        for kind in edits:
            row = variables[data.draw(st.integers(0, len(variables) - 1))]
            if kind == "rank0":
                row[1], row[3] = (), row[3][: np.dtype(np.float32).itemsize if row[2] == 0 else 1]
                row[2] = 0 if row[2] == 0 else 1
            elif kind == "rank1":
                row[1] = (int(np.prod(row[1])),)
            elif kind == "rank3":
                row[1] = (1, *row[1]) if len(row[1]) < 8 else row[1]
            elif kind == "twice":
                variables.append(list(row))
            elif kind == "alias":
                aliases.append([data.draw(st.sampled_from([row[0], "x/weight"])), row[0]])
            else:
                scales = [v for v in variables if v[0].endswith("weight_scale")]
                target = scales[data.draw(st.integers(0, len(scales) - 1))]
                value = data.draw(HOSTILE_FLOATS)
                target[3] = np.full(len(target[3]) // 4, value, dtype="<f4").tobytes()

    folder = rewrite_model_bin(ct2_int8, tmp_path_factory.mktemp("ct2") / "m", edit)
    _quiet(_open_and_read, folder)
