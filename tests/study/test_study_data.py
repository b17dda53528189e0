"""The study's three datasets, read from the Debian packages that `make data` installs."""

import gzip

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbound.errors import SpecboundError
from specbound.study import data


def _idx_bytes(array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_read_idx_plain_and_gzipped(tmp_path):
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "x-idx3-ubyte").write_bytes(_idx_bytes(a))
    (tmp_path / "y-idx3-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(a)))
    np.testing.assert_array_equal(data.read_idx(tmp_path / "x-idx3-ubyte"), a)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "y-idx3-ubyte.gz"), a)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + (3).to_bytes(4, "big") + b"abc")
    with pytest.raises(SpecboundError, match="not an unsigned-byte idx"):
        data.read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(_idx_bytes(a)[:-1])
    with pytest.raises(SpecboundError, match="header says"):
        data.read_idx(tmp_path / "short")


def test_missing_data_says_how_to_install(tmp_path):
    with pytest.raises(SpecboundError, match="apt-get install dataset-fashion-mnist"):
        data.load_fashion_mnist(tmp_path)
    with pytest.raises(SpecboundError, match="apt-get install wamerican"):
        data.load_language_id(tmp_path)


def test_fashion_mnist():
    task = data.load_task("fmnist")
    assert task.x_pool.shape == (60_000, 28, 28) and task.x_test.shape == (10_000, 28, 28)
    assert set(np.unique(task.y_test)) == set(range(10)) and task.num_labels == 10
    x, y = task.train_subset(500, seed=1)
    np.testing.assert_array_equal(x, task.train_subset(2000, seed=1)[0][:500])  # nested for one seed
    assert np.bincount(y).tolist() == [50] * 10
    x2, _ = task.train_subset(500, seed=2)  # another seed draws another sample
    assert not np.array_equal(x, x2)


def test_language_identification():
    task = data.load_task("langid")
    assert task.x_test.shape[0] == 10_000 and task.num_labels == 5
    assert np.bincount(task.y_test).tolist() == [2000] * 5
    _, y = task.train_subset(500, seed=3)
    assert np.bincount(y).tolist() == [100] * 5  # every prefix of a seed's order is balanced
    test_words = data.decode_words(task.x_test, task.meta["chars"])
    pool_words = data.decode_words(task.x_pool, task.meta["chars"])
    assert not set(test_words) & set(pool_words)  # held out
    assert len(set(pool_words)) == len(pool_words)
    assert all(w.isalpha() and w == w.lower() and 2 <= len(w) <= 20 for w in test_words[:500] + pool_words[:500])
    assert (task.x_pool[:, 0] == data.CLS_ID).all() and task.x_pool.max() < task.meta["vocab_size"]


def test_word_lists_drop_ambiguous_and_non_alphabetic_words(tmp_path):
    for name, words in (
        ("american-english", "the\ncat\ncat's\nBerlin\nx\n"),
        ("ngerman", "der\nberlin\nkatze\n"),
        ("french", "le\nchat\n"),
        ("italian", "il\ngatto\n"),
        ("spanish", "el\ngato\n"),
    ):
        (tmp_path / name).write_text(words, encoding="utf-8")
    assert data.read_word_list(tmp_path / "american-english") == {"the", "cat", "berlin"}
    data.WORDS_TEST_PER_CLASS, saved = 1, data.WORDS_TEST_PER_CLASS
    try:
        task = data.load_language_id.__wrapped__(tmp_path)
    finally:
        data.WORDS_TEST_PER_CLASS = saved
    words = data.decode_words(task.x_test, task.meta["chars"]) + data.decode_words(task.x_pool, task.meta["chars"])
    # 'berlin' is in two lists (ambiguous), 'x' is too short, "cat's" is not alphabetic
    assert sorted(words) == sorted(["the", "cat", "der", "katze", "le", "chat", "il", "gatto", "el", "gato"])


def test_fortunes_topics():
    task = data.load_task("fortunes")
    assert task.num_labels == 5 and task.x_test.shape == (1250, data.FORTUNE_CHARS + 1)
    assert np.bincount(task.y_test).tolist() == [250] * 5
    assert np.bincount(task.y_pool).min() == np.bincount(task.y_pool).max() >= 400
    test_items = data.decode_words(task.x_test, task.meta["chars"])
    pool_items = data.decode_words(task.x_pool, task.meta["chars"])
    assert not set(test_items) & set(pool_items) and len(set(pool_items)) == len(pool_items)
    assert all(0 < len(t) <= data.FORTUNE_CHARS for t in test_items)


def test_read_fortunes_and_missing_files(tmp_path):
    (tmp_path / "computers").write_text("first\n  line\n%\nsecond\n%\n%\nthird\n", encoding="utf-8")
    assert data.read_fortunes(tmp_path / "computers") == ["first line", "second", "third"]
    with pytest.raises(SpecboundError, match="apt-get install fortunes"):
        data.load_fortunes.__wrapped__(tmp_path)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(0, 10))
def test_stratified_order_is_a_balanced_permutation(labels, seed):
    labels = np.asarray(labels)
    order = data.stratified_order(labels, seed)
    assert sorted(order.tolist()) == list(range(len(labels)))
    classes = np.unique(labels)
    counts = {c: int((labels == c).sum()) for c in classes}
    for k in range(1, len(labels) + 1):  # every prefix: no class ahead of another that still has examples
        got = {c: int((labels[order[:k]] == c).sum()) for c in classes}
        open_classes = [c for c in classes if got[c] < counts[c]]
        assert all(got[c] <= min((got[o] for o in open_classes), default=got[c]) + 1 for c in classes)
