"""The study's two real tasks, read from Debian packages on disk (never downloaded).

* ``fmnist``: Fashion-MNIST (Debian ``dataset-fashion-mnist``), 28 x 28 grey images, 10 classes;
  the training pool is the 60,000 training images, the test set all 10,000 test images.
* ``langid``: word-level language identification over the Debian word lists ``wamerican``,
  ``wngerman``, ``wfrench``, ``witalian``, ``wspanish`` (5 classes).  Words are lower-cased (German
  capitalises nouns, which would give the class away), kept if alphabetic and 2-20 characters long,
  and dropped if they occur in more than one list (their label would be ambiguous).  A fixed
  shuffle puts 2,000 words per language in the test set (10,000 in all) and the next 10,000 per
  language in the training pool.

Training subsets are *nested*: the first ``n`` examples of one fixed permutation of the pool
(class-balanced for ``langid``), so a run on fewer examples sees a subset of its twin's data and
the seed only changes the initialisation and the batch order.  Everything here is numpy.
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
    "train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte",
}
# Mean and standard deviation of the Fashion-MNIST training pixels (in [0, 1]).
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530

DICT_DIR = Path("/usr/share/dict")
WORD_LISTS = {  # label -> (file, Debian package)
    "en": ("american-english", "wamerican"), "de": ("ngerman", "wngerman"), "fr": ("french", "wfrench"),
    "it": ("italian", "witalian"), "es": ("spanish", "wspanish"),
}
WORD_MIN_LEN, WORD_MAX_LEN = 2, 20
WORDS_TEST_PER_CLASS = 2_000
WORDS_POOL_PER_CLASS = 10_000  # training pool cap (50,000 words): more than any grid uses
# Token ids of the character vocabulary; characters follow from FIRST_CHAR_ID.
PAD_ID, CLS_ID, UNK_ID, FIRST_CHAR_ID = 0, 1, 2, 3

DATA_SEED = 0  # the fixed permutation behind the test split and the nested training subsets
TASKS = ("fmnist", "langid")


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
        The test set (10,000 examples for both tasks).
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

    def train_subset(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``n`` examples of the pool (nested: a smaller set is a subset of a larger one)."""
        if not 0 < n <= len(self.y_pool):
            raise SpecboundError(f"train_size for {self.name} must be in 1..{len(self.y_pool)}, got {n}")
        return self.x_pool[:n], self.y_pool[:n]


def load_task(name: str) -> TaskData:
    """``fmnist`` or ``langid`` (cached per process)."""
    if name == "fmnist":
        return load_fashion_mnist()
    if name == "langid":
        return load_language_id()
    raise SpecboundError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")


# --- Fashion-MNIST ------------------------------------------------------------------------------

def read_idx(path: Path) -> np.ndarray:
    """An idx file (LeCun's format: magic with dtype code and rank, big-endian dims, data), plain
    or gzipped."""
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SpecboundError(f"{path} is not an unsigned-byte idx file (magic {raw[:4].hex()})")
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
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
        f"with `apt-get install dataset-fashion-mnist` (`make data` does)")


@lru_cache(maxsize=2)
def load_fashion_mnist(directory: str | Path = FASHION_MNIST_DIR) -> TaskData:
    directory = Path(directory)
    arrays = {key: read_idx(_fashion_file(directory, stem)) for key, stem in FASHION_MNIST_FILES.items()}
    order = np.random.default_rng(DATA_SEED).permutation(len(arrays["train_labels"]))
    return TaskData(
        name="fmnist",
        x_pool=arrays["train_images"][order], y_pool=arrays["train_labels"][order].astype(np.int64),
        x_test=arrays["test_images"], y_test=arrays["test_labels"].astype(np.int64), num_labels=10,
        meta={"image_size": 28, "mean": FASHION_MNIST_MEAN, "std": FASHION_MNIST_STD,
              "source": str(directory)},
    )


# --- language identification --------------------------------------------------------------------

def read_word_list(path: Path) -> set[str]:
    """Lower-cased alphabetic words of 2-20 characters from a one-word-a-line UTF-8 list."""
    text = path.read_text(encoding="utf-8").lower()
    return {w for w in text.split("\n") if WORD_MIN_LEN <= len(w) <= WORD_MAX_LEN and w.isalpha()}


def encode_words(words: list[str], vocab: dict[str, int]) -> np.ndarray:
    """Token ids ``(len(words), WORD_MAX_LEN + 1)``: ``[CLS]``, one id per character, ``[PAD]``."""
    ids = np.full((len(words), WORD_MAX_LEN + 1), PAD_ID, dtype=np.int64)
    ids[:, 0] = CLS_ID
    for i, word in enumerate(words):
        ids[i, 1:len(word) + 1] = [vocab.get(c, UNK_ID) for c in word]
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
            raise SpecboundError(f"word list {path} not found: install the Debian package with "
                                 f"`apt-get install {package}` (`make data` does)")
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
        x_pool=encode_words(pool_words, vocab), y_pool=np.asarray(pool_labels, dtype=np.int64),
        x_test=encode_words(test_words, vocab), y_test=np.asarray(test_labels, dtype=np.int64),
        num_labels=len(WORD_LISTS),
        meta={"vocab_size": FIRST_CHAR_ID + len(chars), "max_len": WORD_MAX_LEN + 1, "chars": "".join(chars),
              "labels": list(WORD_LISTS), "source": str(directory)},
    )
