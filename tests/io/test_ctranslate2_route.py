"""The CTranslate2 conversion route docs/formats.md shows for transformers 5 ('Converting with
transformers 5'): its shell block, run as written (the config key added, `ct2-transformers-converter`,
`specbound analyze`), converts a tiny BERT, RoBERTa and BART saved by transformers 5, and the
conversion analyses to the Hugging Face folder's numbers."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")

import specbound  # noqa: E402
from support.ct2_models import hf_model  # noqa: E402
from support.same_numbers import assert_same_numbers  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "formats.md"


def documented_route() -> str:
    """The sh block after the ``<!-- ctranslate2-route -->`` marker of docs/formats.md."""
    m = re.search(r"<!-- ctranslate2-route -->\n```sh\n(.*?)\n```", DOC.read_text(), re.S)
    assert m, "docs/formats.md has no <!-- ctranslate2-route --> block"
    return m.group(1)


@pytest.mark.parametrize("kind", ["bert", "roberta", "bart"])
def test_the_documented_route_converts_and_analyses(kind, tmp_path):
    folder = tmp_path / kind
    hf_model(kind, folder, converter_keys=False)  # as transformers 5 saves it
    script = documented_route().replace("MODEL_DIR", str(folder))
    # `python`, `ct2-transformers-converter` and `specbound` as this interpreter and checkout run them
    script = re.sub(r"^python ", f"{sys.executable} ", script, flags=re.M)
    script = re.sub(r"^specbound ", f"{sys.executable} -m specbound.cli ", script, flags=re.M)
    src = Path(specbound.__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "spectral_adaptive" in proc.stdout, proc.stdout[-2000:]
    ours = specbound.analyze(f"{folder}-ct2", threads=1)
    theirs = specbound.analyze(folder, threads=1)
    assert ours.model["family"] == theirs.model["family"]
    assert_same_numbers(theirs, ours, rel=1e-12)
