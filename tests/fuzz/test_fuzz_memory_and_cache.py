"""Hostile in-memory state dicts and hub caches: a meta tensor (a shape without values) is one line
naming it; a sparse tensor is read as the dense matrix it stands for (the dense state dict's numbers);
a cache entry or ``snapshots`` folder that links out of the cache is refused before it is listed."""

import json

import pytest

import specbound
from support.fuzz import clean_outcome
from support.numpy_bert import write_tiny_bert
from specbound.errors import SpecboundError

torch = pytest.importorskip("torch")
QUERY = "encoder.layer.0.attention.self.query.weight"


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    from safetensors.torch import load_file

    folder = write_tiny_bert(tmp_path_factory.mktemp("sd") / "m", seed=0, L=1, N=8, H=2, d_ff=12)
    return load_file(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())


def test_a_meta_tensor_is_one_line(state):
    tensors, config = state
    outcome = clean_outcome(
        specbound.analyze, {**tensors, QUERY: torch.empty(8, 8, device="meta")}, config=config, threads=1
    )
    assert isinstance(outcome, SpecboundError)
    assert QUERY in str(outcome) and "meta tensor" in str(outcome)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_tensor_gives_the_dense_numbers(state, layout):
    tensors, config = state
    sparse = tensors[QUERY].to_sparse() if layout == "coo" else tensors[QUERY].to_sparse_csr()
    dense = specbound.analyze(tensors, config=config, threads=1)
    assert specbound.analyze({**tensors, QUERY: sparse}, config=config, threads=1).bounds == dense.bounds


def test_a_meta_tensor_in_a_pickle_is_one_line(state, tmp_path):
    tensors, config = state
    torch.save({**tensors, QUERY: torch.empty(8, 8, device="meta")}, str(tmp_path / "pytorch_model.bin"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    outcome = clean_outcome(specbound.analyze, tmp_path, threads=1)
    assert isinstance(outcome, SpecboundError) and "meta tensor" in str(outcome)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    for secret in ("secret_a", "secret_b"):
        (tmp_path / "outside" / secret).mkdir(parents=True)
    return tmp_path / "cache"


def test_a_snapshots_link_out_of_the_cache_is_refused_unlisted(cache):
    (cache / "models--org--m").mkdir()
    (cache / "models--org--m" / "snapshots").symlink_to(cache.parent / "outside")
    outcome = clean_outcome(specbound.analyze, "org/m", threads=1)
    assert isinstance(outcome, SpecboundError) and "a link leading out of" in str(outcome)
    assert "secret" not in str(outcome)  # the outside folder's listing is not printed


def test_a_repository_link_out_of_the_cache_is_refused(cache):
    (cache.parent / "outside" / "snapshots" / "abc").mkdir(parents=True)
    (cache / "models--org--m").symlink_to(cache.parent / "outside")
    outcome = clean_outcome(specbound.analyze, "org/m", threads=1)
    assert isinstance(outcome, SpecboundError) and "models--org--m" in str(outcome) and "leading out of" in str(outcome)


def test_a_snapshots_link_inside_the_repository_is_followed(cache, tmp_path):
    """Links that stay inside (a moved snapshots folder) are fine: the model is found."""
    model = write_tiny_bert(cache / "models--org--m" / "store" / "abc", seed=0, L=1, N=8, H=2, d_ff=12)
    (cache / "models--org--m" / "snapshots").symlink_to(model.parent)
    assert specbound.analyze("org/m", threads=1).model["L"] == 1
