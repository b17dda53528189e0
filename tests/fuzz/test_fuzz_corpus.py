"""The corpus of bad files (tests/fuzz/corpus/<kind>/): every input that ever broke the tool, kept
so that it never breaks it again.  When a fuzz run (or a user) finds a new one, add the file under
the kind it belongs to; this test picks it up.

Kinds: ``config`` (config.json: a JSON object is merged into a tiny model's config, anything else
replaces it), ``spec`` (an object merged into the shipped BERT spec), ``index`` (a
model.safetensors.index.json), ``sweep`` (a sweep TOML), ``pattern`` (one source pattern a line),
``record`` (a stored record.json).
"""

import json
import shutil
import warnings
from importlib import resources
from pathlib import Path

import pytest
from support.fuzz import clean_outcome
from support.numpy_bert import write_tiny_bert

import specbound
from specbound.errors import SpecboundError, SpecboundWarning
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import Pattern, Source, load_sweep_config
from specbound.sweep.store import Store

CORPUS = Path(__file__).parent / "corpus"
CASES = sorted(p.relative_to(CORPUS) for p in CORPUS.glob("*/*") if p.is_file())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("corpus") / "m", seed=0, L=1, N=8, H=2, d_ff=12)


@pytest.fixture(scope="module")
def one_record_store(tiny_family, tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus_store") / "store"
    assert run_sweep([Source("m", str(sorted(tiny_family.iterdir())[0]))], root, progress=False).written
    return root


def _object(raw: bytes):
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def test_the_corpus_is_there():
    kinds = {case.parts[0] for case in CASES}
    assert kinds == {"config", "spec", "index", "sweep", "pattern", "record"}, kinds


@pytest.mark.parametrize("case", CASES, ids=str)
def test_corpus_file(case, model, one_record_store, tmp_path):
    kind, raw = case.parts[0], (CORPUS / case).read_bytes()
    if kind == "config":
        folder = shutil.copytree(model, tmp_path / "m")
        merged = _object(raw)
        if merged is not None:
            config = json.loads((folder / "config.json").read_text())
            raw = json.dumps({**config, **merged}).encode()
        (folder / "config.json").write_bytes(raw)
        assert isinstance(clean_outcome(specbound.analyze, folder, threads=1), SpecboundError)
    elif kind == "index":
        folder = shutil.copytree(model, tmp_path / "m")
        (folder / "model.safetensors").rename(folder / "shard.safetensors")
        (folder / "model.safetensors.index.json").write_bytes(raw)
        assert isinstance(clean_outcome(specbound.analyze, folder, threads=1), SpecboundError)
    elif kind == "spec":
        spec = json.loads(resources.files("specbound.archs").joinpath("data", "bert.json").read_text())
        path = tmp_path / "spec.json"
        path.write_text(json.dumps({**spec, **_object(raw)}))
        clean_outcome(specbound.analyze, model, arch_spec=path, threads=1)
    elif kind == "sweep":
        path = tmp_path / "sweep.toml"
        path.write_bytes(raw)
        assert isinstance(clean_outcome(load_sweep_config, path), SpecboundError)
    elif kind == "pattern":
        for line in raw.decode().splitlines():
            parsed = clean_outcome(Pattern.parse, line)
            if not isinstance(parsed, Exception):
                clean_outcome(parsed.match, "m_L-2_H-4")
    elif kind == "record":
        root = shutil.copytree(one_record_store, tmp_path / "store")
        (folder,) = (root / "records").iterdir()
        (folder / "record.json").write_bytes(raw.replace(b"KEY", folder.name.encode()))
        with pytest.warns(SpecboundWarning, match="cannot be read"):
            assert len(Store(root).table()) == 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert Store(root).keys() == []  # set aside once, not reported again
    else:
        pytest.fail(f"unknown corpus kind {kind!r}: add a runner for it here")
