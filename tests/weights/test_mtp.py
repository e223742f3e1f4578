"""Loading the MTP head (gdn_export.weights.mtp): every layout it takes, and each error a user can
cause, one line naming the key or the field, before any tensor data is read."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from gdn_export.errors import CheckpointError
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint
from gdn_export.weights.mtp import load_mtp
from tests.onnx._tiny import TWO_LAYERS
from tests.weights.test_families import _rewrite


def _make(path, family="qwen3_5", **kw):
    kw = {"mtp_layers": 1, **TWO_LAYERS, **kw}
    return make_tiny_checkpoint(path, family=family, seed=2, **kw)


def _head_state(path):
    model = load_checkpoint(path)
    return {k: v.clone() for k, v in load_mtp(path, model).mtp.state_dict().items()}


def test_main_model_skips_the_head_with_a_note(tmp_path, caplog):
    path = _make(tmp_path / "c")
    with caplog.at_level(logging.INFO, logger="gdn_export.weights"):
        load_checkpoint(path)
    assert "skipped 15 multi-token-prediction tensors" in caplog.text
    assert "speculative decoding loads them" in caplog.text


@pytest.mark.parametrize("layout", ["model-prefix", "composite", "stacked-experts", "bf16"])
def test_layouts_load_the_same_head(tmp_path, layout):
    family = "qwen3_5_moe" if layout == "stacked-experts" else "qwen3_5"
    want = _head_state(_make(tmp_path / "ref", family))
    if layout == "composite":
        path = _make(tmp_path / "c", family, model_type="qwen3_5")
    elif layout == "bf16":
        path = _make(tmp_path / "c", family, dtype="bfloat16")
    else:
        path = _make(tmp_path / "c", family)

        def edit(t):
            if layout == "model-prefix":
                for k in [k for k in t if k.startswith("mtp.")]:
                    t["model." + k] = t.pop(k)
            else:
                p = "mtp.layers.0.mlp.experts"
                gate_up = [torch.cat((t.pop(f"{p}.{e}.gate_proj.weight"), t.pop(f"{p}.{e}.up_proj.weight")))
                           for e in range(4)]
                t[f"{p}.gate_up_proj"] = torch.stack(gate_up)
                t[f"{p}.down_proj"] = torch.stack([t.pop(f"{p}.{e}.down_proj.weight") for e in range(4)])

        _rewrite(path, edit)
    got = _head_state(path)
    assert got.keys() == want.keys()
    for k in want:
        if layout == "bf16":
            assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[k].bfloat16()), k
        else:
            assert torch.equal(got[k], want[k]), k


def _config(path, **fields):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("case,message", [
    ("missing", "tensor mtp.fc.weight is missing from the checkpoint"),
    ("shape", "tensor mtp.norm.weight has shape (63,) in the checkpoint, expected (64,)"),
    ("unexpected", "tensor mtp.extra.weight is not part of a qwen3_5 MTP head"),
    ("int8", "tensor mtp.fc.weight is stored as I8 (int8)"),
    ("no-tensors", "declares an MTP head (mtp_num_hidden_layers = 1) but no mtp.* tensor is stored"),
    ("not-declared", "config.json declares no multi-token-prediction head"),
    ("two-layers", "mtp_num_hidden_layers = 2; only single-layer MTP heads are supported"),
    ("dedicated-embeddings", "mtp_use_dedicated_embeddings is true"),
    ("olmo", "olmo_hybrid checkpoints have no multi-token-prediction head"),
])
def test_errors_name_the_problem(tmp_path, case, message):
    if case == "olmo":
        path = make_tiny_checkpoint(tmp_path / "c", family="olmo_hybrid", seed=0, **TWO_LAYERS)
    elif case == "not-declared":
        path = _make(tmp_path / "c", mtp_layers=0)
    elif case == "no-tensors":
        path = _make(tmp_path / "c")
        _rewrite(path, lambda t: [t.pop(k) for k in list(t) if k.startswith("mtp.")])
    elif case == "two-layers":
        path = _make(tmp_path / "c", mtp_layers=2)
    else:
        path = _make(tmp_path / "c")
        edits = {"missing": lambda t: t.pop("mtp.fc.weight"),
                 "shape": lambda t: t.update({"mtp.norm.weight": torch.zeros(63)}),
                 "unexpected": lambda t: t.update({"mtp.extra.weight": torch.zeros(2)}),
                 "int8": lambda t: t.update({"mtp.fc.weight": torch.zeros(64, 128, dtype=torch.int8)})}
        if case in edits:
            _rewrite(path, edits[case])
    if case == "dedicated-embeddings":
        _config(path, mtp_use_dedicated_embeddings=True)
    model = load_checkpoint(path)
    with pytest.raises(CheckpointError) as err:
        load_mtp(path, model)
    assert message in str(err.value) and "\n" not in str(err.value)
