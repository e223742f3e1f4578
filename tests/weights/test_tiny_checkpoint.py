"""make_tiny_checkpoint: HF layout on disk, single-file and sharded, written atomically."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from gdn_export.errors import CheckpointError, InputError
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint
from gdn_export.weights.loader import FAMILIES


def _tensors(directory):
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


LAYOUTS = [
    ("qwen3_5", None, 1, "Qwen3_5ForCausalLM", "model.layers.0.linear_attn.in_proj_qkv.weight"),
    ("qwen3_5", None, 3, "Qwen3_5ForCausalLM", "model.layers.0.linear_attn.in_proj_qkv.weight"),
    ("qwen3_5", "qwen3_5", 2, "Qwen3_5ForConditionalGeneration",
     "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"),
    ("qwen3_next", None, 1, "Qwen3NextForCausalLM", "model.layers.0.mlp.experts.3.down_proj.weight"),
    ("qwen3_next", None, 4, "Qwen3NextForCausalLM", "model.layers.0.linear_attn.in_proj_qkvz.weight"),
    ("qwen3_5_moe", None, 1, "Qwen3_5MoeForCausalLM", "model.layers.2.mlp.experts.1.up_proj.weight"),
    ("qwen3_5_moe", "qwen3_5_moe", 3, "Qwen3_5MoeForConditionalGeneration",
     "model.language_model.layers.0.mlp.experts.3.gate_proj.weight"),
    ("olmo_hybrid", None, 1, "OlmoHybridForCausalLM", "model.layers.0.linear_attn.k_conv1d.weight"),
    ("olmo_hybrid", None, 2, "OlmoHybridForCausalLM", "model.layers.1.attention_layer_norm.weight"),
]


@pytest.mark.parametrize("family, model_type, shards, arch, key", LAYOUTS,
                         ids=["qwen3_5-single", "qwen3_5-3shards", "qwen3_5-composite-2shards",
                              "qwen3_next-single", "qwen3_next-4shards", "qwen3_5_moe-single",
                              "qwen3_5_moe-composite-3shards", "olmo_hybrid-single", "olmo_hybrid-2shards"])
def test_round_trip(tmp_path, family, model_type, shards, arch, key):
    d = make_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, shards=shards, model_type=model_type)
    config = json.loads((d / "config.json").read_text())
    assert config["architectures"] == [arch]
    files = sorted(p.name for p in d.glob("*.safetensors"))
    if shards == 1:
        assert files == ["model.safetensors"]
    else:
        assert files == [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
        index = json.loads((d / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == set(files)
    stored = _tensors(d)
    assert key in stored
    model = load_checkpoint(d)
    # Written back in the published layout (per-expert, split convs, renamed), the loaded model
    # gives exactly the stored tensors.
    naming = FAMILIES[model.config.family]
    back = {key: t for name, tensor in model.state_dict().items()
            for key, t in naming.checkpoint_tensors(name, tensor, model.config)}
    assert back.keys() == stored.keys()
    for key, t in stored.items():
        assert torch.equal(back[key], t), key
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp dir left behind


def test_same_seed_same_weights_and_logits_not_degenerate(tmp_path):
    a = _tensors(make_tiny_checkpoint(tmp_path / "a", "qwen3_next", seed=3))
    b = _tensors(make_tiny_checkpoint(tmp_path / "b", "qwen3_next", seed=3, shards=2))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    model = load_checkpoint(tmp_path / "a")
    ids = torch.randint(0, 256, (2, 16))
    logits = model(ids, torch.zeros(2, dtype=torch.long), torch.full((2,), 16), *model.empty_states(2))[0]
    assert torch.isfinite(logits).all()
    assert 0.3 < logits.std() < 5, f"logit std {logits.std():.3g}"
    assert (logits.argmax(-1) != logits.argmax(-1)[0, 0]).any()  # not one token everywhere


def test_tied_and_bf16(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "t", "qwen3_5", tie_word_embeddings=True, dtype="bfloat16")
    stored = _tensors(d)
    assert "lm_head.weight" not in stored
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    model = load_checkpoint(d)
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_refuses_non_empty_directory(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "keep.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not empty"):
        make_tiny_checkpoint(tmp_path / "ckpt")
    # overwrite replaces checkpoints only: a folder without config.json is never deleted.
    with pytest.raises(CheckpointError, match="holds no config.json"):
        make_tiny_checkpoint(tmp_path / "ckpt", overwrite=True)
    assert (tmp_path / "ckpt" / "keep.txt").read_text() == "x"
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    make_tiny_checkpoint(tmp_path / "ckpt", overwrite=True)
    assert not (tmp_path / "ckpt" / "keep.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("target,fragment", [
    ("a-file", "a-file: exists and is not a folder"),
    ("a-file/sub/ckpt", "a-file is a file, not a folder"),
], ids=["target-is-a-file", "ancestor-is-a-file"])
def test_file_in_the_way_is_a_checkpoint_error(tmp_path, target, fragment):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointError, match=fragment):
        make_tiny_checkpoint(tmp_path / target)
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
    assert (tmp_path / "a-file").read_text() == "x"


@pytest.mark.parametrize("shards,fragment", [
    (0, "shards must be an integer >= 1, got 0"),
    (-2, "shards must be an integer >= 1, got -2"),
    (2.0, "shards must be an integer >= 1, got 2.0"),
    (100, r"100 shards asked for, but this checkpoint has only 56 tensors \(each shard holds"),
], ids=["zero", "negative", "float", "more-than-tensors"])
def test_impossible_shard_counts(tmp_path, shards, fragment):
    with pytest.raises(InputError, match=fragment):
        make_tiny_checkpoint(tmp_path / "ckpt", shards=shards)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shards", [7, 56], ids=["7", "one-tensor-each"])
def test_writes_exactly_the_shards_asked_for(tmp_path, shards):
    d = make_tiny_checkpoint(tmp_path / "ckpt", shards=shards)
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    files = sorted(p.name for p in d.glob("*.safetensors"))
    assert files == [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    assert sorted(set(index.values())) == files  # none empty
    assert _tensors(d).keys() == set(index)
    load_checkpoint(d)
