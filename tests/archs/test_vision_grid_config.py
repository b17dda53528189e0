"""A vision tower's 2D rotary layout read from its config (docs/rotary.md section 9): the grid the config allows,
window attention's smaller grids, and every bad value one line naming it."""

import json
from importlib import resources

import pytest
from support.families import save_family

import specbound
from specbound.archs.infer import infer_spec
from specbound.archs.model import UNBOUNDED_POSITIONS
from specbound.archs.registry import builtin_specs
from specbound.archs.rotary import rotary_layouts
from specbound.archs.spec import parse_spec
from specbound.errors import SpecboundError
from specbound.io import open_checkpoint

AXIAL = {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}}
UNBOUNDED = (UNBOUNDED_POSITIONS, UNBOUNDED_POSITIONS)


def layouts(family, config, d_head=64, layers=1):
    return rotary_layouts(builtin_specs()[family], config, d_head, layers, where="m")


def test_the_grid_is_image_size_over_patch_size_on_each_side():
    (pixtral,) = layouts("pixtral_vision", {"image_size": 1540, "patch_size": 14, **AXIAL})
    assert pixtral.grid == (110, 110) and pixtral.max_offset_count == 219**2 and not pixtral.grid_origin
    (wide,) = layouts("pixtral_vision", {"image_size": [336, 448], "patch_size": 14, **AXIAL})
    assert wide.grid == (24, 32) and wide.max_positions == 32
    (llama4,) = layouts(
        "llama4_vision", {"image_size": 448, "patch_size": 14, "rope_parameters": {"rope_theta": 1e4}}, d_head=88
    )
    assert llama4.grid == (32, 32) and llama4.grid_origin and llama4.pairing == "interleaved"
    assert llama4.axes == (1,) * 22 + (0,) * 22  # its first half turns with the column
    assert llama4.max_offset_count == 63**2 + 2 * 63


def test_a_tower_whose_config_bounds_no_grid_gets_an_unbounded_one():
    for family in ("qwen2_vl_vision", "qwen3_vl_vision"):
        assert {l.grid for l in layouts(family, AXIAL, d_head=80, layers=3)} == {UNBOUNDED}
    (older,) = layouts("qwen2_vl_vision", {"rope_theta": 500.0})  # no rope_parameters: axial at rope_theta
    assert older.base == 500.0


def test_window_attention_layers_get_the_windows_grid():
    """Qwen2.5-VL's 112-pixel windows of 2 x 2 merged 14-pixel patches: 8 x 8 patches a window; the full-attention
    layers the image's grid (unbounded)."""
    config = {"window_size": 112, "spatial_merge_size": 2, "patch_size": 14, "fullatt_block_indexes": [1, 3], **AXIAL}
    grids = [l.grid for l in layouts("qwen2_5_vl_vision", config, layers=5)]
    assert grids == [(8, 8), UNBOUNDED, (8, 8), UNBOUNDED, (8, 8)]


@pytest.mark.parametrize(
    "family, config, named",
    [
        (
            "pixtral_vision",
            {"image_size": 1024, "patch_size": 16, "rope_parameters": {"rope_type": "yarn"}},
            "rope_type",
        ),
        ("pixtral_vision", {"image_size": 8, "patch_size": 16, **AXIAL}, "no patch fits"),
        ("pixtral_vision", {"image_size": 2**60, "patch_size": 16, **AXIAL}, "image_size"),
        ("pixtral_vision", {"image_size": [1024], "patch_size": 16, **AXIAL}, "image_size"),
        ("pixtral_vision", {"image_size": 1024, "patch_size": True, **AXIAL}, "patch_size"),
        ("pixtral_vision", {"image_size": 1024, "patch_size": 16, "head_dim": 32, **AXIAL}, "head_dim"),
        ("llama4_vision", {"image_size": None, "patch_size": 14}, "image_size"),
        ("qwen2_vl_vision", {"rope_parameters": {"rope_theta": -1.0, "rope_type": "axial"}}, "rope_theta"),
        ("qwen2_vl_vision", {"rope_parameters": [1]}, "rope_parameters"),
        ("qwen2_5_vl_vision", {"window_size": 20, "spatial_merge_size": 2, "patch_size": 14, **AXIAL}, "window_size"),
        (
            "qwen2_5_vl_vision",
            {"window_size": 112, "spatial_merge_size": 0, "patch_size": 14, **AXIAL},
            "spatial_merge",
        ),
        (
            "qwen2_5_vl_vision",
            {"window_size": 112, "spatial_merge_size": 2, "patch_size": 14, "fullatt_block_indexes": "all", **AXIAL},
            "fullatt_block_indexes",
        ),
    ],
)
def test_a_bad_vision_setting_is_one_line_naming_it(family, config, named):
    with pytest.raises(SpecboundError) as err:
        layouts(family, config)
    message = str(err.value)
    assert "\n" not in message and "config.json of m" in message and named in message


def test_a_head_qwen_cannot_split_in_four_is_refused():
    with pytest.raises(SpecboundError, match="multiple of 4"):
        layouts("qwen3_vl_vision", AXIAL, d_head=70)


@pytest.mark.parametrize(
    "grid",
    [
        {"frequencies": "diagonal"},
        {"image_size": "image_size"},
        {"frequencies": "split", "image_size": "image_size"},
        {"frequencies": "split", "first_axis": "depth"},
        {"frequencies": "split", "window": {"size": "window_size"}},
        {"frequencies": "split", "class_token": "yes"},
        "split",
    ],
)
def test_a_malformed_grid_rule_is_one_line(grid):
    raw = json.loads((resources.files("specbound.archs") / "data" / "qwen2_vl_vision.json").read_text())
    raw["rotary"]["grid"] = grid
    with pytest.raises(SpecboundError) as err:
        parse_spec(raw, "spec.json")
    assert "\n" not in str(err.value) and "grid" in str(err.value)


def test_a_draft_of_an_axial_tower_says_the_grid_is_missing_and_the_1d_reading_refuses_it(tmp_path):
    """``specbound arch infer`` on a 2D rotary tower (rope_type axial) drafts 1D rotary pairs, says to verify a
    missing grid rule, and analysing with that draft is one line naming the axial rope type, never 1D numbers."""
    pytest.importorskip("transformers")

    save_family("pixtral_vision", tmp_path / "m", layers=1)
    draft = infer_spec(open_checkpoint(tmp_path / "m"))
    assert any(g.topic == "rotary grid" and g.verify for g in draft.guesses)
    (tmp_path / "spec.json").write_text(json.dumps(draft.spec))
    with pytest.raises(SpecboundError) as err:
        specbound.analyze(tmp_path / "m", threads=1, arch_spec=tmp_path / "spec.json")
    assert "\n" not in str(err.value) and "'axial'" in str(err.value)


def test_a_key_config_json_leaves_out_takes_the_config_classs_default():
    """As transformers reads it: Pixtral 1024 / 16, Llama 4 448 / 14, Qwen2.5-VL's 112-pixel windows and full
    attention in layers 7, 15, 23, 31 (checked against the config classes); a null is refused, not defaulted."""
    transformers = pytest.importorskip("transformers")
    pixtral, llama4, qwen = (
        transformers.PixtralVisionConfig(),
        transformers.Llama4VisionConfig(),
        transformers.Qwen2_5_VLVisionConfig(),
    )
    assert layouts("pixtral_vision", AXIAL)[0].grid == (pixtral.image_size // pixtral.patch_size,) * 2
    assert layouts("llama4_vision", {})[0].grid == (llama4.image_size // llama4.patch_size,) * 2
    grids = [l.grid for l in layouts("qwen2_5_vl_vision", AXIAL, layers=32)]
    side = qwen.window_size // qwen.spatial_merge_size // qwen.patch_size * qwen.spatial_merge_size
    assert [l for l, g in enumerate(grids) if g == UNBOUNDED] == list(qwen.fullatt_block_indexes)
    assert {g for g in grids if g != UNBOUNDED} == {(side, side)}
    with pytest.raises(SpecboundError, match="window_size"):
        layouts("qwen2_5_vl_vision", {"window_size": None, **AXIAL})
