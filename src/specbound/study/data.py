"""The study's three real tasks, read from Debian packages on disk (never downloaded).

* ``fmnist``: Fashion-MNIST (Debian ``dataset-fashion-mnist``), 28 x 28 grey images, 10 classes;
  the training pool is the 60,000 training images, the test set all 10,000 test images.
* ``langid``: word-level language identification over the Debian word lists ``wamerican``,
  ``wngerman``, ``wfrench``, ``witalian``, ``wspanish`` (5 classes).  Words are lower-cased (German
  capitalises nouns, which would give the class away), kept if alphabetic and 2-20 characters long,
  and dropped if they occur in more than one list (their label would be ambiguous).  A fixed
  shuffle puts 2,000 words per language in the test set (10,000 in all) and the next 10,000 per
  language in the training pool.
* ``fortunes``: topic classification of the Debian ``fortunes`` collection (``/usr/share/games/
  fortunes``), five topics with the most items (computers, definitions, people, politics,
  songs-poems).  An item is its text with whitespace collapsed, cut to its first 32 characters
  (characters as tokens, as for ``langid``); items that occur twice are dropped.  A fixed shuffle
  puts 250 items per topic in the test set (1,250) and the rest, up to the smallest topic's count,
  in the training pool (446 per topic).

**Training samples are redrawn by the seed** (:meth:`TaskData.train_subset`): a stratified sample
of ``n`` examples, the first ``n`` of a class-balanced ordering of the pool drawn with the run's
seed.  So two seeds see different training sets (the seed's variance includes the sample's), and
for one seed a smaller set is a subset of a larger one (the training-set-size axis changes only
how much data there is).  The test split is fixed (seed ``DATA_SEED``).  Everything here is numpy.
"""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path

import numpy as np

from ..errors import SpecboundError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# Mean and standard deviation of the Fashion-MNIST training pixels (in [0, 1]).
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530

DICT_DIR = Path("/usr/share/dict")
WORD_LISTS = {  # label -> (file, Debian package)
    "en": ("american-english", "wamerican"),
    "de": ("ngerman", "wngerman"),
    "fr": ("french", "wfrench"),
    "it": ("italian", "witalian"),
    "es": ("spanish", "wspanish"),
}
WORD_MIN_LEN, WORD_MAX_LEN = 2, 20
WORDS_TEST_PER_CLASS = 2_000
WORDS_POOL_PER_CLASS = 10_000  # training pool cap (50,000 words): more than any grid uses
# Token ids of the character vocabulary; characters follow from FIRST_CHAR_ID.
PAD_ID, CLS_ID, UNK_ID, FIRST_CHAR_ID = 0, 1, 2, 3

FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNE_TOPICS = ("computers", "definitions", "people", "politics", "songs-poems")
FORTUNE_CHARS = 32
FORTUNES_TEST_PER_CLASS = 250

DATA_SEED = 0  # the fixed permutation behind the test splits
TASKS = ("fmnist", "langid", "fortunes")


@dataclass(frozen=True)
class TaskData:
    """A task's training pool and held-out test set.

    Attributes
    ----------
    name : str
        ``"fmnist"`` or ``"langid"``.
    x_pool, y_pool : ndarray
        The training pool in the order subsets are taken: images ``(n, 28, 28)`` uint8, or token
        ids ``(n, WORD_MAX_LEN + 1)`` int64 (``[CLS]`` first, ``[PAD]`` after the word).
    x_test, y_test : ndarray
        The test set (10,000 examples for ``fmnist`` and ``langid``, 1,250 for ``fortunes``).
    num_labels : int
    meta : dict
        What a model needs to know about the inputs (``vocab_size``, ``max_len``, label names, ...).
    """

    name: str
    x_pool: np.ndarray
    y_pool: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_labels: int
    meta: dict = field(default_factory=dict)

    def train_subset(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``n`` examples drawn with ``seed``: the first ``n`` of :func:`stratified_order` of the pool
        (class-balanced up to one example; for one seed a smaller set is a subset of a larger one)."""
        if not 0 < n <= len(self.y_pool):
            raise SpecboundError(f"train_size for {self.name} must be in 1..{len(self.y_pool)}, got {n}")
        rows = stratified_order(self.y_pool, seed)[:n]
        return self.x_pool[rows], self.y_pool[rows]


def stratified_order(labels: np.ndarray, seed: int) -> np.ndarray:
    """A permutation of ``range(len(labels))`` whose every prefix is class-balanced: each class's
    indices shuffled with ``seed``, then taken round-robin over the classes (a class that runs out
    drops out of the rotation).  Shape ``(len(labels),)``."""
    rng = np.random.default_rng([seed, 1])  # [seed, 1]: never the stream of the test split's DATA_SEED
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    rank = np.empty(len(labels), dtype=np.int64)  # position of each example within its class
    cls = np.empty(len(labels), dtype=np.int64)
    for c, rows in enumerate(per_class):
        rank[rows], cls[rows] = np.arange(len(rows)), c
    return np.lexsort((cls, rank))  # by rank within class, then class: round-robin


def load_task(name: str) -> TaskData:
    """``fmnist``, ``langid`` or ``fortunes`` (cached per process)."""
    if name == "fmnist":
        return load_fashion_mnist()
    if name == "langid":
        return load_language_id()
    if name == "fortunes":
        return load_fortunes()
    raise SpecboundError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")


# --- Fashion-MNIST ------------------------------------------------------------------------------


def read_idx(path: Path) -> np.ndarray:
    """An idx file (LeCun's format: magic with dtype code and rank, big-endian dims, data), plain
    or gzipped."""
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SpecboundError(f"{path} is not an unsigned-byte idx file (magic {raw[:4].hex()})")
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank)
    if data.size != int(np.prod(dims)):
        raise SpecboundError(f"{path}: header says {dims}, file holds {data.size} values")
    return data.reshape(dims)


def _fashion_file(directory: Path, stem: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise SpecboundError(
        f"Fashion-MNIST file {stem}[.gz] not found in {directory}: install the Debian package "
        f"with `apt-get install dataset-fashion-mnist` (`make data` does)"
    )


@lru_cache(maxsize=2)
def load_fashion_mnist(directory: str | Path = FASHION_MNIST_DIR) -> TaskData:
    directory = Path(directory)
    arrays = {key: read_idx(_fashion_file(directory, stem)) for key, stem in FASHION_MNIST_FILES.items()}
    order = np.random.default_rng(DATA_SEED).permutation(len(arrays["train_labels"]))
    return TaskData(
        name="fmnist",
        x_pool=arrays["train_images"][order],
        y_pool=arrays["train_labels"][order].astype(np.int64),
        x_test=arrays["test_images"],
        y_test=arrays["test_labels"].astype(np.int64),
        num_labels=10,
        meta={"image_size": 28, "mean": FASHION_MNIST_MEAN, "std": FASHION_MNIST_STD, "source": str(directory)},
    )


# --- language identification --------------------------------------------------------------------


def read_word_list(path: Path) -> set[str]:
    """Lower-cased alphabetic words of 2-20 characters from a one-word-a-line UTF-8 list."""
    text = path.read_text(encoding="utf-8").lower()
    return {w for w in text.split("\n") if WORD_MIN_LEN <= len(w) <= WORD_MAX_LEN and w.isalpha()}


def encode_words(words: list[str], vocab: dict[str, int], max_len: int = WORD_MAX_LEN) -> np.ndarray:
    """Token ids ``(len(words), max_len + 1)``: ``[CLS]``, one id per character, ``[PAD]``."""
    ids = np.full((len(words), max_len + 1), PAD_ID, dtype=np.int64)
    ids[:, 0] = CLS_ID
    for i, word in enumerate(words):
        ids[i, 1 : len(word) + 1] = [vocab.get(c, UNK_ID) for c in word]
    return ids


def decode_words(ids: np.ndarray, chars: str) -> list[str]:
    """The words of :func:`encode_words`'s output (``chars``: the task's ``meta["chars"]``)."""
    return ["".join(chars[i - FIRST_CHAR_ID] for i in row if i >= FIRST_CHAR_ID) for row in ids]


@lru_cache(maxsize=2)
def load_language_id(directory: str | Path = DICT_DIR) -> TaskData:
    directory = Path(directory)
    lists = {}
    for label, (filename, package) in WORD_LISTS.items():
        path = directory / filename
        if not path.exists():
            raise SpecboundError(
                f"word list {path} not found: install the Debian package with "
                f"`apt-get install {package}` (`make data` does)"
            )
        lists[label] = read_word_list(path)
    seen = Counter(chain.from_iterable(lists.values()))
    rng = np.random.default_rng(DATA_SEED)
    test_words, test_labels, pools = [], [], []
    for label, words in enumerate(lists.values()):
        unique = sorted(w for w in words if seen[w] == 1)  # sorted: set order is not reproducible
        unique = [unique[i] for i in rng.permutation(len(unique))]
        test_words += unique[:WORDS_TEST_PER_CLASS]
        test_labels += [label] * WORDS_TEST_PER_CLASS
        pools.append(unique[WORDS_TEST_PER_CLASS:])
    # Interleave the classes so that every prefix of the pool is balanced (up to the smallest list).
    per_class = min(WORDS_POOL_PER_CLASS, *(len(p) for p in pools))
    pool_words = [pools[c][i] for i in range(per_class) for c in range(len(pools))]
    pool_labels = [c for _ in range(per_class) for c in range(len(pools))]
    chars = sorted(set("".join(chain.from_iterable(lists.values()))))
    vocab = {c: FIRST_CHAR_ID + i for i, c in enumerate(chars)}
    return TaskData(
        name="langid",
        x_pool=encode_words(pool_words, vocab),
        y_pool=np.asarray(pool_labels, dtype=np.int64),
        x_test=encode_words(test_words, vocab),
        y_test=np.asarray(test_labels, dtype=np.int64),
        num_labels=len(WORD_LISTS),
        meta={
            "vocab_size": FIRST_CHAR_ID + len(chars),
            "max_len": WORD_MAX_LEN + 1,
            "chars": "".join(chars),
            "labels": list(WORD_LISTS),
            "source": str(directory),
        },
    )


# --- fortunes topics -------------------------------------------------------------------------------


def read_fortunes(path: Path) -> list[str]:
    """The items of a ``fortune`` file (separated by lines holding ``%``), whitespace collapsed,
    empty ones dropped.  The files are UTF-8 with a few stray Latin-1 bytes (replaced)."""
    items, lines = [], []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines() + ["%"]:
        if line.strip() == "%":
            items.append(" ".join(" ".join(lines).split()))
            lines = []
        else:
            lines.append(line)
    return [item for item in items if item]


@lru_cache(maxsize=2)
def load_fortunes(directory: str | Path = FORTUNES_DIR) -> TaskData:
    directory = Path(directory)
    texts = {}
    for topic in FORTUNE_TOPICS:
        path = directory / topic
        if not path.exists():
            raise SpecboundError(
                f"fortune file {path} not found: install the Debian package with "
                f"`apt-get install fortunes` (`make data` does)"
            )
        texts[topic] = [item[:FORTUNE_CHARS] for item in read_fortunes(path)]
    seen = Counter(chain.from_iterable(texts.values()))
    rng = np.random.default_rng(DATA_SEED)
    test_items, test_labels, pools = [], [], []
    for label, items in enumerate(texts.values()):
        unique = sorted({t for t in items if seen[t] == 1})
        unique = [unique[i] for i in rng.permutation(len(unique))]
        test_items += unique[:FORTUNES_TEST_PER_CLASS]
        test_labels += [label] * FORTUNES_TEST_PER_CLASS
        pools.append(unique[FORTUNES_TEST_PER_CLASS:])
    per_class = min(len(p) for p in pools)
    if per_class < 1:
        raise SpecboundError(
            f"fortune files in {directory} hold too few items (need more than {FORTUNES_TEST_PER_CLASS} per topic)"
        )
    pool_items = [pools[c][i] for i in range(per_class) for c in range(len(pools))]
    pool_labels = [c for _ in range(per_class) for c in range(len(pools))]
    chars = sorted(set("".join(pool_items + test_items)))
    vocab = {c: FIRST_CHAR_ID + i for i, c in enumerate(chars)}
    return TaskData(
        name="fortunes",
        x_pool=encode_words(pool_items, vocab, FORTUNE_CHARS),
        y_pool=np.asarray(pool_labels, dtype=np.int64),
        x_test=encode_words(test_items, vocab, FORTUNE_CHARS),
        y_test=np.asarray(test_labels, dtype=np.int64),
        num_labels=len(FORTUNE_TOPICS),
        meta={
            "vocab_size": FIRST_CHAR_ID + len(chars),
            "max_len": FORTUNE_CHARS + 1,
            "chars": "".join(chars),
            "labels": list(FORTUNE_TOPICS),
            "source": str(directory),
        },
    )
