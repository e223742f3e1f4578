"""`gdn-export make-tiny`: every family, shards, and a target that is in the way."""

from __future__ import annotations

import json

import pytest
import torch

from gdn_export.weights import load_checkpoint
from gdn_export.weights.mtp import load_mtp


@pytest.mark.parametrize("family,model_type", [("qwen3_5", "qwen3_5_text"), ("qwen3_next", "qwen3_next"),
                                               ("qwen3_5_moe", "qwen3_5_moe_text"), ("olmo_hybrid", "olmo_hybrid")])
def test_each_family_loads(cli, tmp_path, family, model_type):
    result = cli("make-tiny", tmp_path / "ckpt", "--family", family, "--seed", 1)
    assert result.code == 0 and f"wrote {family} checkpoint" in result.out
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["model_type"] == model_type
    model = load_checkpoint(tmp_path / "ckpt")
    assert model.config.family == family
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp folder left beside it


def test_two_shards_hold_the_same_tensors(cli, tmp_path):
    assert cli("make-tiny", tmp_path / "one", "--seed", 5).code == 0
    assert cli("make-tiny", tmp_path / "two", "--seed", 5, "--shards", 2).code == 0
    files = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert files == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                     "model.safetensors.index.json"]
    one, two = (load_checkpoint(tmp_path / name).state_dict() for name in ("one", "two"))
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=0, msg=name)


def test_non_empty_folder_is_left_alone(cli, tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    message = cli("make-tiny", tmp_path).error_line("make-tiny")
    assert str(tmp_path) in message and "not empty" in message and "--overwrite" in message
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_overwrite_replaces_a_checkpoint_only(cli, tmp_path):
    assert cli("make-tiny", tmp_path / "ckpt", "--seed", 1).code == 0
    assert cli("make-tiny", tmp_path / "ckpt", "--family", "qwen3_next", "--overwrite").code == 0
    assert load_checkpoint(tmp_path / "ckpt").config.family == "qwen3_next"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    message = cli("make-tiny", tmp_path / "other", "--overwrite").error_line("make-tiny")
    assert "no config.json" in message
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep me"


def test_empty_folder_is_fine(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    assert cli("make-tiny", tmp_path / "empty").code == 0
    assert (tmp_path / "empty" / "model.safetensors").is_file()


@pytest.mark.parametrize("target,args,fragment", [
    ("a-file", [], "is a file, not a folder"),
    ("a-file/sub", [], "a-file is a file, not a folder"),
    ("ckpt", ["--shards", "0"], "--shards must be >= 1, got 0"),
], ids=["target-is-a-file", "parent-is-a-file", "zero-shards"])
def test_bad_targets(cli, tmp_path, target, args, fragment):
    (tmp_path / "a-file").write_text("x")
    message = cli("make-tiny", tmp_path / target, *args).error_line("make-tiny")
    assert fragment in message
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_exactly_the_shards_asked_for_or_one_line(cli, tmp_path):
    assert cli("make-tiny", tmp_path / "five", "--shards", 5).code == 0
    assert len(list((tmp_path / "five").glob("model-*-of-00005.safetensors"))) == 5
    message = cli("make-tiny", tmp_path / "many", "--shards", 100).error_line("make-tiny")
    assert message.startswith("100 shards asked for, but this checkpoint has only 56 tensors")
    assert not (tmp_path / "many").exists()


def test_mtp_head_flag(cli, tmp_path):
    assert cli("make-tiny", tmp_path / "c", "--family", "qwen3_next", "--mtp-layers", 1).code == 0
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    assert cfg["mtp_num_hidden_layers"] == 1 and cfg["mtp_use_dedicated_embeddings"] is False
    model = load_checkpoint(tmp_path / "c")
    assert model.config.mtp_num_hidden_layers == 1
    assert load_mtp(tmp_path / "c", model).mtp.layers[0].mlp.experts.gate_up_proj.shape == (4, 64, 64)
    result = cli("make-tiny", tmp_path / "o", "--family", "olmo_hybrid", "--mtp-layers", 1)
    assert result.code == 2 and "olmo_hybrid has no multi-token-prediction head" in result.error_line("make-tiny")
    result = cli("make-tiny", tmp_path / "n", "--mtp-layers", -1)
    assert result.code == 2 and "--mtp-layers must be >= 0, got -1" in result.error_line("make-tiny")
