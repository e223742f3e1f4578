"""Checkpoint layouts of the MoE and OLMo-Hybrid families, and each error a user can cause there.

Routed experts load per expert (as published and as save_pretrained writes) or stacked, to the same
model; OLMo's separate q/k/v convs and OLMo-core norm names load like transformers' module names.
Every error is one line naming the checkpoint key.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gdn_export.errors import CheckpointError, ConfigError
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint

E, I, H = 4, 32, 64  # tiny MoE: 4 experts of intermediate 32, hidden 64

MOE = [("qwen3_next", None, "model.layers"), ("qwen3_5_moe", None, "model.layers"),
       ("qwen3_5_moe", "qwen3_5_moe", "model.language_model.layers")]
MOE_IDS = ["qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe-composite"]


def _tensors(directory):
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _rewrite(directory, edit):
    tensors = _tensors(directory)
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _stack(tensors, layers):
    """Per-expert tensors -> transformers' stacked gate_up_proj / down_proj, for the given layer prefixes."""
    for p in layers:
        gate = [tensors.pop(f"{p}.mlp.experts.{e}.gate_proj.weight") for e in range(E)]
        up = [tensors.pop(f"{p}.mlp.experts.{e}.up_proj.weight") for e in range(E)]
        down = [tensors.pop(f"{p}.mlp.experts.{e}.down_proj.weight") for e in range(E)]
        tensors[f"{p}.mlp.experts.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
        tensors[f"{p}.mlp.experts.down_proj"] = torch.stack(down)


def _logits(model, ids):
    B, T = ids.shape
    return model(ids, torch.zeros(B, dtype=torch.long), torch.full((B,), T), *model.empty_states(B))[0]


@pytest.fixture(params=MOE, ids=MOE_IDS)
def moe(request, tmp_path):
    family, model_type, prefix = request.param
    return make_tiny_checkpoint(tmp_path / "ckpt", family, model_type=model_type), prefix


@pytest.mark.parametrize("stacked_layers", [[0, 1, 2, 3], [1, 3]], ids=["all-stacked", "mixed"])
def test_stacked_and_per_expert_layouts_load_the_same(moe, stacked_layers):
    directory, prefix = moe
    per_expert = load_checkpoint(directory)
    _rewrite(directory, lambda t: _stack(t, [f"{prefix}.{i}" for i in stacked_layers]))
    stacked = load_checkpoint(directory)
    want = per_expert.state_dict()
    for name, t in stacked.state_dict().items():
        assert torch.equal(t, want[name]), name
    ids = torch.randint(0, 256, (2, 9))
    # Equal weights; the last ulp may differ with the buffers' alignment (mmap vs heap).
    torch.testing.assert_close(_logits(stacked, ids), _logits(per_expert, ids), atol=1e-6, rtol=0)


def test_stacked_experts_are_in_module_layout(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5_moe")
    t = _tensors(d)
    model = load_checkpoint(d)
    gate_up = model.model.layers[2].mlp.experts.gate_up_proj
    assert tuple(gate_up.shape) == (E, 2 * I, H)
    assert torch.equal(gate_up[3, :I], t["model.layers.2.mlp.experts.3.gate_proj.weight"])
    assert torch.equal(gate_up[3, I:], t["model.layers.2.mlp.experts.3.up_proj.weight"])
    assert torch.equal(model.model.layers[2].mlp.experts.down_proj[1], t["model.layers.2.mlp.experts.1.down_proj.weight"])


def _pop(key):
    return lambda t: t.pop(key)


def _put(key, shape):
    return lambda t: t.update({key: torch.zeros(shape)})


MOE_ERRORS = [
    ("missing-expert", lambda p: _pop(f"{p}.1.mlp.experts.2.up_proj.weight"),
     r"tensor {p}\.1\.mlp\.experts\.2\.up_proj\.weight is missing from the checkpoint \(expert 2 of 4\)"),
    ("misshaped-expert", lambda p: _put(f"{p}.0.mlp.experts.3.down_proj.weight", (H, I - 1)),
     r"tensor {p}\.0\.mlp\.experts\.3\.down_proj\.weight has shape \(64, 31\) in the checkpoint, expected \(64, 32\)"),
    ("expert-beyond-num-experts", lambda p: _put(f"{p}.2.mlp.experts.4.gate_proj.weight", (I, H)),
     r"tensor {p}\.2\.mlp\.experts\.4\.gate_proj\.weight is expert 4, but num_experts is 4"),
    ("router-rows", lambda p: _put(f"{p}.3.mlp.gate.weight", (E - 1, H)),
     r"router {p}\.3\.mlp\.gate\.weight has 3 rows \(experts\) but num_experts is 4"),
    ("both-layouts", lambda p: _put(f"{p}.1.mlp.experts.down_proj", (E, H, I)),
     r"tensor {p}\.1\.mlp\.experts\.down_proj duplicates the per-expert tensors {p}\.1\.mlp\.experts\."),
]


@pytest.mark.parametrize("edit, message", [e[1:] for e in MOE_ERRORS], ids=[e[0] for e in MOE_ERRORS])
def test_moe_errors_name_the_key(moe, edit, message):
    directory, prefix = moe
    _rewrite(directory, edit(prefix))
    with pytest.raises(CheckpointError, match=message.format(p=prefix.replace(".", r"\."))) as info:
        load_checkpoint(directory)
    assert "\n" not in str(info.value)


def test_misshaped_stacked_experts(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5_moe")
    _rewrite(d, lambda t: (_stack(t, ["model.layers.0"]),
                           t.update({"model.layers.0.mlp.experts.gate_up_proj": torch.zeros(E, 2 * I - 2, H)})))
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.0\.mlp\.experts\.gate_up_proj has shape "
                                              r"\(4, 62, 64\) in the checkpoint, expected \(4, 64, 64\)"):
        load_checkpoint(d)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_moe"])
def test_top_k_over_experts_is_a_config_error(tmp_path, family):
    d = make_tiny_checkpoint(tmp_path / "c", family)
    config = json.loads((d / "config.json").read_text())
    config["num_experts_per_tok"] = 5
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"num_experts_per_tok must be in \[1, num_experts=4\], got 5"):
        load_checkpoint(d)


def test_mtp_tensors_are_skipped_with_a_note(tmp_path, caplog):
    extra = {"mtp.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(2, 2), "mtp.fc.weight": torch.zeros(2, 2)}
    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5_moe", model_type="qwen3_5_moe", extra_tensors=extra)
    with caplog.at_level(logging.INFO, logger="gdn_export.weights"):
        load_checkpoint(d)
    assert "skipped 2 multi-token-prediction tensors" in caplog.text
    assert not [r for r in caplog.records if r.name == "gdn_export.weights" and r.levelno >= logging.WARNING]


# ---------------------------------------------------------------------- OLMo-Hybrid
@pytest.fixture
def olmo(tmp_path):
    return make_tiny_checkpoint(tmp_path / "olmo", "olmo_hybrid")


def _module_layout(t):
    """The names of transformers' modules: one conv, input/post_attention layernorms."""
    for i in range(3):
        p = f"model.layers.{i}"
        convs = [t.pop(f"{p}.linear_attn.{w}_conv1d.weight") for w in "qkv"]
        t[f"{p}.linear_attn.conv1d.weight"] = torch.cat(convs)
        t[f"{p}.input_layernorm.weight"] = t.pop(f"{p}.attention_layer_norm.weight")
        t[f"{p}.post_attention_layernorm.weight"] = t.pop(f"{p}.feedforward_layer_norm.weight")


def _even_split(t):
    """What transformers' save_pretrained writes: the conv split into three near-equal chunks."""
    for i in range(3):
        p = f"model.layers.{i}.linear_attn"
        conv = torch.cat([t.pop(f"{p}.{w}_conv1d.weight") for w in "qkv"])
        for w, part in zip("qkv", conv.tensor_split(3)):
            t[f"{p}.{w}_conv1d.weight"] = part.clone()


@pytest.mark.parametrize("edit", [_module_layout, _even_split], ids=["module-names", "save_pretrained-split"])
def test_olmo_layouts_load_the_same(olmo, edit):
    published = load_checkpoint(olmo)
    _rewrite(olmo, edit)
    other = load_checkpoint(olmo)
    want = published.state_dict()
    for name, t in other.state_dict().items():
        assert torch.equal(t, want[name]), name


OLMO_ERRORS = [
    ("missing-v-conv", _pop("model.layers.1.linear_attn.v_conv1d.weight"),
     r"tensor model\.layers\.1\.linear_attn\.v_conv1d\.weight is missing from the checkpoint"),
    ("conv-rows", _put("model.layers.0.linear_attn.k_conv1d.weight", (31, 1, 4)),
     r"model\.layers\.0\.linear_attn\.q_conv1d\.weight, model\.layers\.0\.linear_attn\.k_conv1d\.weight, "
     r"model\.layers\.0\.linear_attn\.v_conv1d\.weight have 159 rows together, expected 160"),
    ("conv-kernel", _put("model.layers.2.linear_attn.q_conv1d.weight", (32, 1, 3)),
     r"tensor model\.layers\.2\.linear_attn\.q_conv1d\.weight has shape \(32, 1, 3\) in the checkpoint"),
    ("missing-norm", _pop("model.layers.0.feedforward_layer_norm.weight"),
     r"tensor model\.layers\.0\.feedforward_layer_norm\.weight is missing from the checkpoint"),
    ("misshaped-g-proj", _put("model.layers.2.linear_attn.g_proj.weight", (95, 64)),
     r"tensor model\.layers\.2\.linear_attn\.g_proj\.weight has shape \(95, 64\)"),
    ("misshaped-q-norm", _put("model.layers.3.self_attn.q_norm.weight", (16,)),
     r"tensor model\.layers\.3\.self_attn\.q_norm\.weight has shape \(16,\) in the checkpoint, expected \(64,\)"),
]


@pytest.mark.parametrize("edit, message", [e[1:] for e in OLMO_ERRORS], ids=[e[0] for e in OLMO_ERRORS])
def test_olmo_errors_name_the_key(olmo, edit, message):
    _rewrite(olmo, edit)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(olmo)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("stored, loaded", [("bfloat16", torch.bfloat16), ("bfloat16", torch.float32),
                                            ("float32", torch.float16)],
                         ids=["bf16-direct", "bf16-to-fp32", "fp32-to-fp16"])
def test_read_into_matches_get(tmp_path, stored, loaded):
    """Per-expert pieces are read straight into the stacked tensor when the dtypes agree, converted
    otherwise; both give what safetensors' get_tensor gives."""
    from gdn_export.weights.reader import CheckpointReader

    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5_moe", dtype=stored, shards=3)
    with CheckpointReader(d) as reader:
        for key in ("model.layers.1.mlp.experts.2.up_proj.weight", "model.norm.weight"):
            out = torch.full(reader.shapes[key], float("nan"), dtype=loaded)
            reader.read_into(key, out)
            assert torch.equal(out, reader.get(key).to(loaded)), key
    model = load_checkpoint(d, dtype=loaded)
    t = {}
    for file in d.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            t.update({k: f.get_tensor(k) for k in f.keys()})
    gate_up = model.model.layers[0].mlp.experts.gate_up_proj
    assert gate_up.dtype == loaded
    assert torch.equal(gate_up[1, I:], t["model.layers.0.mlp.experts.1.up_proj.weight"].to(loaded))


def test_truncated_expert_data_is_a_checkpoint_error(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5_moe")
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-4096])
    with pytest.raises(CheckpointError, match=r"model\.safetensors") as info:
        load_checkpoint(d)
    assert "\n" not in str(info.value)
