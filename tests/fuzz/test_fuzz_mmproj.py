"""llama.cpp's multimodal projector files (mmproj-*.gguf) with hostile metadata: any value of any GGUF type under
any key the reader reads (counts, the projector type, the activation flags, the epsilon), a key left out, the
tensors' shapes at odds with the counts: a result whose bounds are finite, or one line, within seconds."""

import math
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import specbound
from specbound.errors import SpecboundError
from support.fuzz import FUZZ, clean_outcome
from support.gguf_bytes import ARR, BOOL, F32, F64, I32, MMPROJ, STR, U32, U64, gguf_file, mmproj_tensors

pytest.importorskip("gguf")

KEYS = [k for k, _, _ in MMPROJ if k != "general.architecture"] + [
    "clip.vision.projector_type",
    "clip.use_silu",
    "clip.has_audio_encoder",
    "split.count",
]
VALUES = st.one_of(
    st.tuples(st.just(U32), st.integers(0, 2**32 - 1)),
    st.tuples(st.just(U64), st.integers(0, 2**64 - 1)),
    st.tuples(st.just(I32), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just(F32), st.floats(width=32)),
    st.tuples(st.just(F64), st.floats()),
    st.tuples(st.just(STR), st.sampled_from(["mlp", "gemma3", "idefics3", "pixtral", "", "8"]) | st.text(max_size=8)),
    st.tuples(st.just(BOOL), st.booleans()),
    st.tuples(st.just(ARR), st.tuples(st.just(U32), st.lists(st.integers(0, 9), max_size=3))),
)


def _outcome(tmp_path, metadata, tensors=None):
    path = tmp_path / "mmproj-model.gguf"
    path.write_bytes(gguf_file(metadata, mmproj_tensors() if tensors is None else tensors))
    started = time.perf_counter()
    outcome = clean_outcome(specbound.analyze, path, threads=1)
    assert time.perf_counter() - started < 10.0
    if not isinstance(outcome, SpecboundError):
        assert all(math.isfinite(v) for v in outcome.bounds.values())
    return outcome


@FUZZ
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_any_value_of_any_mmproj_key_is_a_result_or_one_line(tmp_path_factory, key, value):
    kind, item = value
    metadata = [(k, t, v) for k, t, v in MMPROJ if k != key] + [(key, kind, item)]
    _outcome(tmp_path_factory.mktemp("m"), metadata)


@FUZZ
@given(dropped=st.sets(st.sampled_from(KEYS[:10]), max_size=3))
def test_any_keys_left_out_are_a_result_or_one_line(tmp_path_factory, dropped):
    outcome = _outcome(tmp_path_factory.mktemp("m"), [(k, t, v) for k, t, v in MMPROJ if k not in dropped])
    required = {
        "clip.has_vision_encoder",
        "clip.projector_type",
        "clip.vision.block_count",
        "clip.vision.embedding_length",
        "clip.vision.feed_forward_length",
        "clip.vision.attention.head_count",
    }
    assert isinstance(outcome, SpecboundError) == bool(dropped & required), (dropped, outcome)


@FUZZ
@given(
    width=st.integers(1, 2**40),
    ff=st.integers(1, 2**40),
    heads=st.integers(1, 2**40),
    blocks=st.integers(1, 2**40),
    shapes=st.dictionaries(
        st.sampled_from(sorted(mmproj_tensors())), st.tuples(st.integers(1, 9), st.integers(1, 9)), max_size=2
    ),
)
def test_counts_and_shapes_at_odds_are_a_result_or_one_line(tmp_path_factory, width, ff, heads, blocks, shapes):
    metadata = [
        (
            k,
            t,
            {
                "clip.vision.embedding_length": width,
                "clip.vision.feed_forward_length": ff,
                "clip.vision.attention.head_count": heads,
                "clip.vision.block_count": blocks,
            }.get(k, v),
        )
        for k, t, v in MMPROJ
    ]
    metadata = [(k, U64 if t == U32 else t, v) for k, t, v in metadata]
    tensors = {**mmproj_tensors(), **{n: np.ones(s, np.float32) for n, s in shapes.items()}}
    _outcome(tmp_path_factory.mktemp("m"), metadata, tensors)
