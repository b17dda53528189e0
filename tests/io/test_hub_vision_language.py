"""Vision-language wrappers through the local stand-in for the Hub (HF_ENDPOINT at 127.0.0.1): the text tower's
tensors in one shard, the vision tower's and the projector's in another, as the released repos split them;
fetched and streamed (``--stream``), each tower's numbers equal the local folder's exactly, and a stream reads
only ranges of both shards (of the vision shard only its header when the text tower alone is analysed)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

from safetensors.numpy import load_file, save_file  # noqa: E402
from support.hub_server import HubServer  # noqa: E402
from support.same_numbers import numbers  # noqa: E402
from support.vision_language import WRAPPERS, build_wrapper  # noqa: E402

import specbound  # noqa: E402

# every wrapper: SigLIP under vision_tower. (Gemma 3, PaliGemma), CLIP (LLaVA), the text_model. /
# vision_model. names (Idefics3), the experts' banks under language_model.model. (Llama 4), Pixtral's
# (Mistral 3), the Qwen-VL visual. layout (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)
KINDS = ("gemma3", "paligemma", "llava", "idefics3", "llama4", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TEXT_MARKS = ("language_model.", "text_model.", "lm_head.")


def _by_tower(local, served):
    """``local``'s tensors in two shards: the text model's, then everything else (vision tower, projector)."""
    tensors = load_file(str(local / "model.safetensors"))
    served.mkdir()
    (served / "config.json").write_text((local / "config.json").read_text())
    text = {k for k in tensors if any(m in k for m in TEXT_MARKS)}
    shards = {
        "model-00001-of-00002.safetensors": sorted(text),
        "model-00002-of-00002.safetensors": sorted(set(tensors) - text),
    }
    weight_map = {}
    for shard, keys in shards.items():
        assert keys
        save_file({k: tensors[k] for k in keys}, str(served / shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in keys})
    (served / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return served


@pytest.mark.parametrize("name", KINDS)
def test_a_wrapper_fetched_and_streamed_equals_the_local_folder(name, tmp_path, hub_env):
    text_family, vision_family = WRAPPERS[name][3]
    towers = ["text", "vision"]
    local = tmp_path / "local"
    build_wrapper(name).save_pretrained(local)
    served = _by_tower(local, tmp_path / "served")
    repo = f"org/tiny-{name}"
    tower = None if len(towers) == 2 else "text"  # the whole model where both towers' families are shipped
    reference = specbound.analyze(local, tower=tower, threads=1)
    with HubServer({repo: served}) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        streamed = specbound.analyze(repo, tower=tower, stream=True, threads=1)  # before the fetch fills the cache
        gets = [(p.rsplit("/", 1)[-1], r) for m, p, r in hub.log if m == "GET" and p.endswith(".safetensors")]
        fetched = specbound.analyze(repo, tower=tower, threads=1)
    assert all(r.startswith("bytes=") for _, r in gets)  # streamed: ranges only
    assert {shard for shard, _ in gets} == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    if tower == "text":  # the vision shard's header only (one or two ranges), never one of its tensors
        assert len([r for shard, r in gets if shard == "model-00002-of-00002.safetensors"]) <= 2, gets
    for t in towers:
        local_numbers = numbers(reference if tower else reference[t])
        assert numbers(streamed if tower else streamed[t]) == local_numbers, t
        assert numbers(fetched if tower else fetched[t]) == local_numbers, t
