"""The golden assumptions: what every analysis says about where its model departs from the theorem's, for
tiny models of the shipped families (support.families) chosen so that together they say every text the
one-chain and vision-language families say (each assumption's text once at least; 35 families; the two-tower
and encoder-decoder texts are held by tests/archs/test_towers.py and test_encoder_decoder.py) and a BERT with a
gap bound and a given L_phi, stored in tests/bounds/data/assumptions_golden.json and held by
tests/bounds/test_assumptions_golden.py.  After an intended change of an assumption, regenerate the file and
read its diff:

    PYTHONPATH=src OPENBLAS_NUM_THREADS=1 python tests/support/golden_assumptions.py

The one number computed from the weights (qk_norm's largest Lipschitz factor, its layer and head) is masked:
the tiny models' weights are drawn by torch, whose vectorised sampler may differ in the last bit between
CPUs, and six significant digits of it would then ride that edge.  The file holds each distinct text once
(``effects``) and, per case and tower, one line per entry: name, applies, kind, the index of its text.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import warnings
from pathlib import Path

import specbound
from specbound.records import TowerAnalyses
from support.families import save_family

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "bounds" / "data" / "assumptions_golden.json"
# case -> (family of support.families, analysis options)
CASES = {
    name: (name, {})
    for name in (
        "albert",
        "cohere2",
        "deberta_v2",
        "deepseek_v32",
        "dinov2",
        "ernie4_5_moe",
        "exaone4",
        "falcon",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "glm4_moe",
        "gpt_oss",
        "granite",
        "hubert",
        "idefics3",
        "kimi_k25",
        "llama4",
        "llama4_text",
        "llama4_vision",
        "llava",
        "mistral3",
        "modernbert",
        "mpnet",
        "olmo2",
        "opt",
        "paligemma",
        "pixtral_vision",
        "qwen2_5_vl_text",
        "qwen2_5_vl_vision",
        "qwen2_moe",
        "qwen2_vl_text",
        "qwen2_vl_vision",
        "qwen3_vl_text",
        "qwen3_vl_vision",
    )
}
CASES["bert_gap_given_l_phi"] = ("bert", {"n": 1000, "margin": 0.5, "l_phi": 1.5})
_WEIGHT_DERIVED = re.compile(r"\(largest [^,]+, layer \d+ head \d+;")


def masked(effect: str) -> str:
    """``effect`` with the number computed from the weights masked (module docstring)."""
    return _WEIGHT_DERIVED.sub("(largest <from the weights>;", effect)


def current(folder: Path) -> dict[str, dict[str, list[dict]]]:
    """case -> tower ("" for a one-chain model) -> its assumptions, each effect :func:`masked`; the models are
    saved under ``folder``."""

    out = {}
    for case, (family, options) in CASES.items():
        path = folder / family
        if not path.exists():
            with warnings.catch_warnings():  # transformers' notes on the tiny configs
                warnings.simplefilter("ignore")
                save_family(family, path)
        result = specbound.analyze(path, threads=1, **options)
        analyses = dict(result) if isinstance(result, TowerAnalyses) else {"": result}
        out[case] = {
            tower: [{**e, "effect": masked(e["effect"])} for e in a.assumptions] for tower, a in analyses.items()
        }
    return out


def load() -> dict[str, dict[str, list[dict]]]:
    """The stored golden assumptions, in :func:`current`'s form."""
    stored = json.loads(GOLDEN.read_text())
    return {
        case: {
            tower: [{"name": n, "applies": a, "kind": k, "effect": stored["effects"][i]} for n, a, k, i in entries]
            for tower, entries in towers.items()
        }
        for case, towers in stored["cases"].items()
    }


def write(found: dict[str, dict[str, list[dict]]]) -> None:
    effects = sorted({e["effect"] for towers in found.values() for entries in towers.values() for e in entries})
    index = {text: i for i, text in enumerate(effects)}
    lines = ['{"effects": [', ",\n".join(json.dumps(t) for t in effects), '], "cases": {']
    cases = []
    for case, towers in found.items():
        parts = []
        for tower, entries in towers.items():
            rows = ",\n".join(json.dumps([e["name"], e["applies"], e["kind"], index[e["effect"]]]) for e in entries)
            parts.append(f"{json.dumps(tower)}: [\n{rows}]")
        cases.append(f"{json.dumps(case)}: {{" + ",\n".join(parts) + "}")
    lines += [",\n".join(cases), "}}"]
    GOLDEN.write_text("\n".join(lines) + "\n")


def main() -> int:
    sys.path.insert(0, str(REPO / "tests"))  # the other helpers of tests/support, when run as a script
    with tempfile.TemporaryDirectory() as tmp:
        write(current(Path(tmp)))
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
