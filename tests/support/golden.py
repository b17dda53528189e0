"""The golden dump: every number specbound's public API produces on a fixed set of models, written
to one text file, so that a restructuring can be checked to leave every number bit-identical
(``diff`` of two dumps is empty).

    PYTHONPATH=src OPENBLAS_NUM_THREADS=1 python tests/support/golden.py OUT.txt

What is analysed (``specbound.analyze`` and the :class:`~specbound.Analysis` it returns, nothing
private): the embedded all-MiniLM-L6-v2 under four option sets (default; ``init`` = itself with a
gap bound; dense with other options; torch on the CPU); a tiny random model of every shipped family
built with ``transformers`` (fixed seeds) under four option sets, plus rotary variants (a short
context that takes the exact path over offsets, a rope scaling, no stated context); the committed
TF / Flax / safetensors files, a ``pytorch_model.bin``, a sharded checkpoint and a GGUF file; and a
sweep store of tiny BERT Miniatures (its record keys, records and tables).  Every table is written
with 17 significant digits, every JSON document as ``to_json`` writes it (shortest round-trip
floats), figures as SHA-256 of their PNG bytes.  Temporary paths are written as ``<TMP>``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402, F401  (imported after the thread settings above, before any BLAS use)

import specbound  # noqa: E402
from specbound.io.default_checkpoint import default_checkpoint
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store, canonical_options
from specbound.tools.miniatures import write_miniatures
from support.gguf_convert import write_converted

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # the other helpers of tests/support, when run as a script
N, L, H, D_FF = 32, 2, 4, 48


def _families():
    """name -> builder of a tiny transformers model (as tests/archs/test_families.py builds them)."""
    import transformers as t

    fam = {
        "bert": lambda: t.BertForSequenceClassification(
            t.BertConfig(
                hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
            )
        ),
        "electra": lambda: t.ElectraForPreTraining(
            t.ElectraConfig(
                embedding_size=16,
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=50,
            )
        ),
        "vit": lambda: t.ViTForImageClassification(
            t.ViTConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                intermediate_size=D_FF,
                image_size=8,
                patch_size=4,
                num_labels=3,
            )
        ),
        "distilbert": lambda: t.DistilBertForSequenceClassification(
            t.DistilBertConfig(dim=N, n_layers=L, n_heads=H, hidden_dim=D_FF, vocab_size=50)
        ),
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(n_embd=N, n_layer=L, n_head=H, vocab_size=50, n_positions=16)),
        "gpt_neox": lambda: t.GPTNeoXForCausalLM(
            t.GPTNeoXConfig(
                hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
            )
        ),
        "gpt_neox_partial_short": lambda: t.GPTNeoXForCausalLM(
            t.GPTNeoXConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=50,
                rotary_pct=0.5,
                max_position_embeddings=24,
            )
        ),
        "opt": lambda: t.OPTForCausalLM(
            t.OPTConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                ffn_dim=D_FF,
                word_embed_proj_dim=N,
                vocab_size=50,
                max_position_embeddings=16,
            )
        ),
        "albert": lambda: t.AlbertForSequenceClassification(
            t.AlbertConfig(
                embedding_size=16,
                hidden_size=N,
                num_hidden_layers=4,
                num_hidden_groups=2,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=50,
                num_labels=2,
            )
        ),
        "llama_short": lambda: t.LlamaForCausalLM(
            t.LlamaConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
                max_position_embeddings=32,
                rope_theta=500.0,
            )
        ),
        "llama_scaled": lambda: t.LlamaForCausalLM(
            t.LlamaConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
                max_position_embeddings=32,
                rope_scaling={"rope_type": "linear", "factor": 2.0},
            )
        ),
    }
    for name, cls, cfg in (
        ("llama", "LlamaForCausalLM", "LlamaConfig"),
        ("mistral", "MistralForCausalLM", "MistralConfig"),
        ("qwen2", "Qwen2ForCausalLM", "Qwen2Config"),
    ):
        fam[name] = lambda c=cls, g=cfg: getattr(t, c)(
            getattr(t, g)(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
            )
        )
    return fam


def build(builder, folder: Path, seed: int) -> Path:
    import torch

    torch.manual_seed(seed)
    model = builder().eval()
    with torch.no_grad():
        for p in model.parameters():  # every weight non-trivial (some families init biases/norms to 0/1)
            torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(str(folder))
    return folder


class Dump:
    def __init__(self, tmp: Path):
        self.out = io.StringIO()
        self.tmp = str(tmp)
        self.count = 0

    def write(self, text: str) -> None:
        text = text.replace(self.tmp, "<TMP>").replace(Path(self.tmp).name, "<TMP>").replace(str(REPO), "<REPO>")
        self.out.write(text if text.endswith("\n") else text + "\n")

    def frame(self, name: str, frame) -> None:
        self.write(f"--- {name} ({len(frame)} rows)")
        self.write(frame.to_csv(index=False, float_format="%.17g", lineterminator="\n"))

    def analysis(self, title: str, result, *, figures: bool = False) -> None:
        self.count += 1
        self.write(f"\n===== {title}")
        self.write("--- repr\n" + repr(result))
        self.write("--- json\n" + result.to_json())
        for name in ("matrices", "layers", "singular_values"):
            self.frame(name, getattr(result, name))
        self.frame("bounds_frame", result.bounds_frame())
        self.frame("tidy matrices", result.tidy_table("matrices", key="k0"))
        self.write("--- all_bounds\n" + "\n".join(f"{k} {v!r}" for k, v in result.all_bounds().items()))
        self.write("--- str\n" + str(result))
        with tempfile.TemporaryDirectory() as folder:
            result.save(folder)
            again = specbound.Analysis.load(folder)
            self.write(f"--- save/load round trip: json {'same' if again.to_json() == result.to_json() else 'DIFFERS'}")
            self.write("--- saved files\n" + "\n".join(sorted(os.listdir(folder))))
        if figures:
            html = result._repr_html_()
            images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
            html = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,<PNG>", html)
            self.write("--- html\n" + html)
            self.write("--- html images " + " ".join(hashlib.sha256(i.encode()).hexdigest() for i in images))
            for name in ("spectra", "contributions", "p_star"):
                buf = io.BytesIO()
                getattr(result.plot, name)().savefig(buf, format="png", dpi=60, metadata={"Software": None})
                self.write(f"--- figure {name} sha256 {hashlib.sha256(buf.getvalue()).hexdigest()}")


def analyze(dump: Dump, title: str, source, **options) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = specbound.analyze(source, threads=1, **options)
    dump.analysis(title, result)
    for w in caught:
        dump.write(f"--- warning {w.category.__name__}: {w.message}")


def minilm(dump: Dump) -> None:
    here = default_checkpoint()
    dump.analysis("MiniLM default", specbound.analyze(threads=1), figures=True)
    analyze(dump, "MiniLM init=itself n=100000 margin=0.5", None, init=here, n=100_000, margin=0.5)
    analyze(
        dump,
        "MiniLM dense grid_m=20 rank_tol=1e-8 l_phi=1.5 delta=0.1 n=5000 margin=2 lead=3 conf=0.5",
        None,
        method="dense",
        grid_m=20,
        rank_tol=1e-8,
        l_phi=1.5,
        delta=0.1,
        n=5000,
        margin=2.0,
        lead_constant=3.0,
        confidence_constant=0.5,
    )
    analyze(dump, "MiniLM device=cpu gram_rtol=0 jobs=2", None, device="cpu", gram_rtol=0.0, jobs=2)


OPTION_SETS = {
    "default": {},
    "dense grid_m=7 jobs=2": {"method": "dense", "grid_m": 7, "jobs": 2},
    "gram_rtol=0 rank_tol=1e-6 l_phi=2 device=cpu": {"gram_rtol": 0.0, "rank_tol": 1e-6, "l_phi": 2.0, "device": "cpu"},
}


def families(dump: Dump, tmp: Path) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name, builder in sorted(_families().items()):
        folder = build(builder, tmp / name, seed=0)
        init = build(builder, tmp / f"{name}-init", seed=1)
        for label, options in OPTION_SETS.items():
            analyze(dump, f"{name} {label}", folder, **options)
        analyze(dump, f"{name} init n=1000 margin=1 delta=0.2", folder, init=init, n=1000, margin=1.0, delta=0.2)
    # a rotary model whose config states no context length: only the every-rotation bounds
    folder = tmp / "llama_short"
    nopos = tmp / "llama_nopos"
    shutil.copytree(folder, nopos)
    config = json.loads((nopos / "config.json").read_text())
    del config["max_position_embeddings"]
    (nopos / "config.json").write_text(json.dumps(config))
    analyze(dump, "llama no max_position_embeddings", nopos)


def formats(dump: Dump, tmp: Path) -> None:
    import torch
    from safetensors.torch import load_file

    data = REPO / "tests" / "io" / "data"
    for name in ("tiny_bert_safetensors", "tiny_bert_tf", "tiny_bert_flax", "tiny_bert_flax_bf16"):
        if (data / name).is_dir():
            shutil.copytree(data / name, tmp / name)
            analyze(dump, f"format {name}", tmp / name)
    bert = tmp / "bert"
    binary = tmp / "bert_bin"
    binary.mkdir()
    shutil.copy(bert / "config.json", binary / "config.json")
    torch.save(load_file(str(bert / "model.safetensors")), binary / "pytorch_model.bin")
    analyze(dump, "format pytorch_model.bin", binary)
    torch.manual_seed(0)
    model = _families()["bert"]()
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(str(tmp / "bert_sharded"), max_shard_size="20KB")
    analyze(dump, "format sharded safetensors", tmp / "bert_sharded")
    analyze(dump, "in-memory module", model)
    gguf_file = _write_gguf(tmp / "llama_short", tmp / "tiny.gguf")
    if gguf_file is not None:
        analyze(dump, "format gguf", gguf_file)


def _write_gguf(folder: Path, path: Path):
    """A float32 GGUF of the LLaMA checkpoint in ``folder``, as convert_hf_to_gguf.py writes it."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return None
    import transformers

    return write_converted(path, transformers.AutoModelForCausalLM.from_pretrained(str(folder)), "llama")


def sweep(dump: Dump, tmp: Path) -> None:
    """A store of tiny Miniatures under three option sets: keys, records (run times aside), tables."""

    root = tmp / "minis"
    write_miniatures(root, layout="folders", depths=(1, 2), widths=(32,), head_size=16, vocab=32)
    option_sets = [{}, {"grid_m": 9, "method": "dense"}, {"n": 1000, "margin": 0.5, "l_phi": 1.0}]
    report = run_sweep(
        expand_sources([str(root / "bert_uncased_L-{1..2}_H-{32}_A-{H/16}")]),
        tmp / "store",
        option_sets=option_sets,
        progress=False,
    )
    dump.write(f"\n===== {report.summary()}".split(" in ")[0])
    store = Store(tmp / "store")
    for key in sorted(store.keys()):
        record = store.load(key)
        meta = dict(record.meta)
        for volatile in ("run", "checksum", "tables"):  # run times, and the digests of files written at other times
            meta.pop(volatile, None)
        dump.write(f"--- record {key}\n" + json.dumps(meta, indent=1, sort_keys=True))
        for name, table in sorted(record.tables.items()):
            dump.frame(f"{key} {name}", table)
    for options in ({}, {"grid_m": 9}, {"n": 10, "margin": 1.0}, {"device": "cpu", "jobs": 3}):
        dump.write(f"--- key options {options} {canonical_options(options)}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="specbound-golden-") as name:
        tmp = Path(name)
        dump = Dump(tmp)
        dump.write(f"specbound golden dump ({specbound.__version__})")
        minilm(dump)
        families(dump, tmp)
        formats(dump, tmp)
        sweep(dump, tmp)
        dump.write(f"\n{dump.count} analyses")
        Path(argv[0]).write_text(dump.out.getvalue())
    print(f"{dump.count} analyses -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
