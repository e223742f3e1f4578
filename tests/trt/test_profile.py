"""Shape specs and optimisation-profile defaults (pure Python: no TensorRT needed)."""

from __future__ import annotations

import pytest

from gdn_export.errors import GdnExportError
from gdn_export.trt.profile import InputInfo, make_profile, parse_shape_specs

INPUTS = [
    InputInfo("input_ids", ("batch", "seq")),
    InputInfo("past.0.conv", ("batch", 96, 3)),
    InputInfo("past.3.key", ("batch", 2, "past", 16)),
]


@pytest.mark.parametrize("specs,want", [
    ("input_ids:[1,1]", {"input_ids": (1, 1)}),
    (["input_ids:[1, 7]", "past.3.key:[1,2,0,16]"], {"input_ids": (1, 7), "past.3.key": (1, 2, 0, 16)}),
    ("input_ids:[2,3],past.3.key:[2,2,5,16]", {"input_ids": (2, 3), "past.3.key": (2, 2, 5, 16)}),
    ({"input_ids": [4, 4]}, {"input_ids": (4, 4)}),
    (None, {}),
], ids=["one", "list-with-spaces", "comma-joined", "mapping", "none"])
def test_parse_shape_specs(specs, want):
    assert parse_shape_specs(specs) == want


@pytest.mark.parametrize("bad", ["input_ids", "input_ids:[1,x]", ":[1,2]", "input_ids:(1,2)"],
                         ids=["no-dims", "non-int", "no-name", "parentheses"])
def test_parse_shape_specs_rejects(bad):
    with pytest.raises(GdnExportError, match="NAME:\\[d0,d1,...\\]|not an integer"):
        parse_shape_specs(bad, "--trt-min-shapes")


def test_defaults_from_dim_names():
    profile = make_profile(INPUTS)
    assert profile["input_ids"] == ((1, 1), (1, 64), (8, 512))
    assert profile["past.0.conv"] == ((1, 96, 3), (1, 96, 3), (8, 96, 3))
    assert profile["past.3.key"] == ((1, 2, 0, 16), (1, 2, 256, 16), (8, 2, 2048, 16))


def test_explicit_specs_fill_missing_from_defaults():
    profile = make_profile(INPUTS, min_shapes="input_ids:[1,1]", max_shapes={"input_ids": (2, 33)})
    assert profile["input_ids"] == ((1, 1), (1, 33), (2, 33))  # opt: the default (1, 64) inside [min, max]
    assert profile["past.3.key"][2] == (2, 2, 2048, 16)  # batch follows input_ids, past keeps its default


@pytest.mark.parametrize("kwargs,match", [
    (dict(min_shapes="nope:[1]"), "names nope, which the ONNX does not have"),
    (dict(max_shapes="input_ids:[1,2,3]"), "has rank 3"),
    (dict(opt_shapes="past.0.conv:[1,95,3]"), "dim 1 is static \\(96\\)"),
    (dict(min_shapes="input_ids:[2,2]", max_shapes="input_ids:[1,2]"), "min <= opt <= max"),
], ids=["unknown-input", "wrong-rank", "static-dim", "min-above-max"])
def test_bad_specs_name_the_problem(kwargs, match):
    with pytest.raises(GdnExportError, match=match):
        make_profile(INPUTS, **kwargs)


def test_unknown_dynamic_dim_needs_a_spec():
    with pytest.raises(GdnExportError, match="input pixels dim 1 is dynamic \\('height'\\)"):
        make_profile([InputInfo("pixels", (1, "height"))])
    assert make_profile([InputInfo("pixels", (1, "height"))], max_shapes="pixels:[1,9]")["pixels"][0] == (1, 9)


@pytest.mark.parametrize("kwargs,want", [
    (dict(max_shapes="input_ids:[4,256]"), ((1, 1), (1, 64), (4, 256))),
    (dict(opt_shapes="input_ids:[2,1000]"), ((1, 1), (2, 1000), (8, 1000))),
    (dict(min_shapes="input_ids:[16,600]"), ((16, 600), (16, 600), (16, 600))),
    (dict(opt_shapes="input_ids:[1,1]", max_shapes="input_ids:[1,1]"), ((1, 1), (1, 1), (1, 1))),
], ids=["max-only", "opt-beyond-default-max", "min-beyond-default-max", "decode-only"])
def test_one_spec_keeps_the_others_consistent(kwargs, want):
    assert make_profile(INPUTS, **kwargs)["input_ids"] == want


def test_named_dims_follow_the_given_specs():
    profile = make_profile(INPUTS, min_shapes="input_ids:[1,1]", opt_shapes="input_ids:[2,8]",
                           max_shapes="input_ids:[4,256]")
    assert profile["past.0.conv"] == ((1, 96, 3), (2, 96, 3), (4, 96, 3))
    assert profile["past.3.key"] == ((1, 2, 0, 16), (2, 2, 256, 16), (4, 2, 2048, 16))  # past keeps its default


def test_conflicting_named_dims_are_refused():
    with pytest.raises(GdnExportError, match="dim 'batch' gets min/opt/max"):
        make_profile(INPUTS, max_shapes="input_ids:[4,256],past.0.conv:[2,96,3]")


NEW_INPUTS = [
    InputInfo("input_ids", ("batch", "seq")),
    InputInfo("past_lengths", ("batch",)),
    InputInfo("past.0.conv", ("batch", 96, 3)),
    InputInfo("past.3.key", ("batch", 2, 256, 16)),
]


def test_prefill_and_decode_profiles_from_metadata():
    from gdn_export.trt.profile import make_profiles

    profiles = make_profiles(NEW_INPUTS, {"gdn_export.cache_len": "256"}, max_batch=4, decode_batch=2)
    assert list(profiles) == ["prefill", "decode"]
    assert profiles["prefill"]["input_ids"] == ((1, 1), (1, 128), (4, 256))  # max_prefill = min(512, cache_len)
    assert profiles["decode"]["input_ids"] == ((1, 1), (2, 1), (4, 1))
    assert profiles["decode"]["past_lengths"] == ((1,), (2,), (4,))
    assert profiles["decode"]["past.3.key"] == ((1, 2, 256, 16), (2, 2, 256, 16), (4, 2, 256, 16))
    # --trt-*-shapes shape the prefill profile; decode follows its batch range.
    profiles = make_profiles(NEW_INPUTS, max_shapes="input_ids:[2,64]")
    assert profiles["prefill"]["input_ids"][2] == (2, 64) and profiles["decode"]["input_ids"][2] == (2, 1)
    assert list(make_profiles(NEW_INPUTS, max_shapes="input_ids:[2,1]")) == ["prefill"]  # decode-only specs


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_batch=0), "--max-batch must be an integer >= 1"),
    (dict(max_prefill=300), "exceeds the export's cache length 256"),
    (dict(max_batch=2, decode_batch=3), "--decode-batch 3 exceeds --max-batch 2"),
], ids=["zero-batch", "prefill-above-cache", "decode-above-max"])
def test_bad_profile_limits(kwargs, match):
    from gdn_export.trt.profile import make_profiles

    with pytest.raises(GdnExportError, match=match):
        make_profiles(NEW_INPUTS, {"gdn_export.cache_len": "256"}, **kwargs)
