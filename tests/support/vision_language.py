"""Tiny vision-language wrappers as transformers 5 builds them (Gemma 3, LLaVA, PaliGemma, Idefics3, Llama 4,
Mistral 3, Qwen2-VL, Qwen2.5-VL, Qwen3-VL), and each tower's weights saved alone as its own family's model.

``WRAPPERS[name] = (build, text_of, vision_of, families)``: ``build(layers=2)`` the untrained wrapper (``layers``
text layers), ``text_of(m)`` its
text model (the decoder the causal LM wraps, Llama 4: the causal LM itself), ``vision_of(m)`` its vision model,
``families``: the text and vision towers' families.  torch and transformers are imported when a model is built.
"""

from __future__ import annotations

TEXT = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
)
VISION = dict(
    hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=14
)
MROPE = dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2]))


def _t():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _text(layers: int, **extra) -> dict:
    """The tiny text config with ``layers`` layers."""
    return dict(TEXT, num_hidden_layers=layers, **extra)


def _qwen_vision(**extra):
    return dict(depth=2, hidden_size=24, num_heads=2, out_hidden_size=32, **extra)


WRAPPERS = {
    "gemma3": (
        lambda layers=2: _t().Gemma3ForConditionalGeneration(
            _t().Gemma3Config(
                text_config=_text(
                    layers, sliding_window=8, layer_types=(["sliding_attention", "full_attention"] * layers)[:layers]
                ),
                vision_config=VISION,
                mm_tokens_per_image=4,
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("gemma3_text", "siglip"),
    ),
    "paligemma": (
        lambda layers=2: _t().PaliGemmaForConditionalGeneration(
            _t().PaliGemmaConfig(
                text_config=_text(layers, model_type="gemma"), vision_config=dict(VISION, projection_dim=32)
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("gemma", "siglip"),
    ),
    "paligemma2": (
        lambda layers=2: _t().PaliGemmaForConditionalGeneration(
            _t().PaliGemmaConfig(
                text_config=_text(layers, model_type="gemma2", sliding_window=8),
                vision_config=dict(VISION, projection_dim=32),
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("gemma2", "siglip"),
    ),
    "llava": (
        lambda layers=2: _t().LlavaForConditionalGeneration(
            _t().LlavaConfig(
                text_config=_text(layers, model_type="llama"),
                vision_config=dict(VISION, model_type="clip_vision_model"),
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("llama", "clip"),
    ),
    "llava_mistral": (
        lambda layers=2: _t().LlavaForConditionalGeneration(
            _t().LlavaConfig(
                text_config=_text(layers, model_type="mistral", sliding_window=None),
                vision_config=dict(VISION, model_type="siglip_vision_model"),
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("llama", "siglip"),
    ),
    "llava_next": (
        lambda layers=2: _t().LlavaNextForConditionalGeneration(
            _t().LlavaNextConfig(
                text_config=_text(layers, model_type="llama"),
                vision_config=dict(VISION, model_type="clip_vision_model"),
                image_grid_pinpoints=[[28, 28]],
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("llama", "clip"),
    ),
    "llava_onevision": (
        lambda layers=2: _t().LlavaOnevisionForConditionalGeneration(
            _t().LlavaOnevisionConfig(
                text_config=_text(layers, model_type="qwen2"),
                vision_config=dict(VISION, model_type="siglip_vision_model"),
                image_grid_pinpoints=[[28, 28]],
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("llama", "siglip"),
    ),
    "smolvlm": (
        lambda layers=2: _t().SmolVLMForConditionalGeneration(
            _t().SmolVLMConfig(text_config=_text(layers, model_type="llama"), vision_config=VISION, scale_factor=2)
        ),
        lambda m: m.model.text_model,
        lambda m: m.model.vision_model,
        ("llama", "siglip"),
    ),
    "idefics3": (
        lambda layers=2: _t().Idefics3ForConditionalGeneration(
            _t().Idefics3Config(text_config=_text(layers, model_type="llama"), vision_config=VISION, scale_factor=2)
        ),
        lambda m: m.model.text_model,
        lambda m: m.model.vision_model,
        ("llama", "siglip"),
    ),
    "llama4": (
        lambda layers=2: _t().Llama4ForConditionalGeneration(
            _t().Llama4Config(
                text_config=_text(
                    layers,
                    intermediate_size_mlp=40,
                    num_local_experts=2,
                    num_experts_per_tok=1,
                    interleave_moe_layer_step=2,
                ),
                vision_config=dict(
                    VISION, num_attention_heads=2, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32
                ),
            )
        ),  # 2D rotary: a head dimension (12) divisible by 4
        lambda m: m.language_model,
        lambda m: m.vision_model,
        ("llama4_text", "llama4_vision"),
    ),
    "mistral3": (
        lambda layers=2: _t().Mistral3ForConditionalGeneration(
            _t().Mistral3Config(
                text_config=_text(layers, model_type="mistral", sliding_window=None),
                vision_config=dict(VISION, num_attention_heads=2, head_dim=12),
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.vision_tower,
        ("llama", "pixtral_vision"),
    ),
    "qwen2_vl": (
        lambda layers=2: _t().Qwen2VLForConditionalGeneration(
            _t().Qwen2VLConfig(
                text_config=_text(layers, **MROPE),
                vision_config=dict(depth=2, embed_dim=24, hidden_size=32, num_heads=2, mlp_ratio=2),
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.visual,
        ("qwen2_vl_text", "qwen2_vl_vision"),
    ),
    "qwen2_5_vl": (
        lambda layers=2: _t().Qwen2_5_VLForConditionalGeneration(
            _t().Qwen2_5_VLConfig(text_config=_text(layers, **MROPE), vision_config=_qwen_vision(intermediate_size=40))
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.visual,
        ("qwen2_vl_text", "qwen2_5_vl_vision"),
    ),
    "qwen3_vl": (
        lambda layers=2: _t().Qwen3VLForConditionalGeneration(
            _t().Qwen3VLConfig(
                text_config=_text(layers, rope_parameters=dict(MROPE["rope_parameters"], mrope_interleaved=True)),
                vision_config=_qwen_vision(intermediate_size=40, deepstack_visual_indexes=[0]),
            )
        ),
        lambda m: m.model.language_model,
        lambda m: m.model.visual,
        ("qwen3_vl_text", "qwen3_vl_vision"),
    ),
}
# the wrapper each test variant is (LLaVA with a Mistral text model and a SigLIP vision tower, PaliGemma 2's Gemma 2)
WRAPPER_OF = {"llava_mistral": "llava", "smolvlm": "idefics3", "paligemma2": "paligemma"}


def build_wrapper(name: str, seed: int = 0):
    """The wrapper's tiny model, every parameter drawn N(0, 0.2^2) (norm gains and QK-norm gains away from
    their initial values, so that each is seen)."""
    import torch

    torch.manual_seed(seed)
    model = WRAPPERS[name][0]().eval()
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
    return model


def save_text_alone(model, name: str, folder) -> None:
    """The wrapper's text weights saved alone as their family's causal LM (Llama 4: its causal LM; a text
    model without one, Qwen-VL's: the text model itself)."""
    save_causal_lm(WRAPPERS[name][1](model), folder)


def save_causal_lm(text, folder) -> None:
    """A wrapper's text model ``text`` saved alone as its family's causal LM."""
    if hasattr(text, "lm_head"):
        text.save_pretrained(folder)
        return
    try:
        alone = _t().AutoModelForCausalLM.from_config(text.config)
    except ValueError:  # no causal LM class for this text config
        text.save_pretrained(folder)
        return
    alone.model.load_state_dict(text.state_dict())
    alone.save_pretrained(folder)


def save_vision_alone(model, name: str, folder) -> None:
    """The wrapper's vision weights saved alone: the vision model itself, or Idefics3's SigLIP encoder as a
    SiglipVisionModel (the same modules, without the attention-pooling head)."""
    vision = WRAPPERS[name][2](model)
    if vision.config.model_type in ("idefics3_vision", "smolvlm_vision"):
        keys = (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "image_size",
            "patch_size",
            "hidden_act",
            "layer_norm_eps",
        )
        config = _t().SiglipVisionConfig(vision_use_head=False, **{k: getattr(vision.config, k) for k in keys})
        alone = _t().SiglipVisionModel(config)
        alone.load_state_dict(vision.state_dict())
        alone.save_pretrained(folder)
        return
    vision.save_pretrained(folder)
