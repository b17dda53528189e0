"""Tiny transformers models that PEFT adapters are trained on in the LoRA tests (tests/test_lora.py,
tests/fuzz/test_fuzz_lora.py): a BERT encoder (nn.Linear, square attention projections) and a GPT-2
decoder (Conv1D, stored (in, out)).  torch and transformers are imported when a model is built."""

from __future__ import annotations

import warnings


def tiny_bert():
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=40,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=32,
    )
    return transformers.BertModel(cfg, add_pooling_layer=False)


def tiny_gpt2():
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=40, n_embd=24, n_layer=2, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg)


def build_adapter(root, make, seed=0, safe=True, **lora):
    """``(base, adapter, merged)`` folders: ``make()`` saved as the base, a LoRA adapter on it with every
    factor (and every ``modules_to_save`` tensor) random, and PEFT's ``merge_and_unload()`` saved."""
    import peft
    import torch

    torch.manual_seed(seed)
    base, adapter, merged = root / "base", root / "adapter", root / "merged"
    with warnings.catch_warnings():  # transformers' and PEFT's own deprecation and saving notes
        warnings.simplefilter("ignore")
        model = make().double()
        model.save_pretrained(base)
        wrapped = peft.get_peft_model(model, peft.LoraConfig(**lora))
        with torch.no_grad():
            for name, p in wrapped.named_parameters():
                if "lora_" in name or "modules_to_save" in name:  # PEFT starts B at 0: W - W0 would be 0
                    p.copy_(0.3 * torch.randn_like(p))
        wrapped.save_pretrained(adapter, safe_serialization=safe)
        wrapped.merge_and_unload().save_pretrained(merged)
    return base, adapter, merged
