"""load_checkpoint: dtype, fused experts, and each error a user can cause."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gdn_export.errors import CheckpointError, ConfigError
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint


def _rewrite(directory, edit):
    """Apply edit(tensors) to a single-file checkpoint in place."""
    path = directory / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _logits(model, ids):
    B, T = ids.shape
    return model(ids, torch.zeros(B, dtype=torch.long), torch.full((B,), T), *model.empty_states(B))[0]


@pytest.fixture
def ckpt(tmp_path):
    return make_tiny_checkpoint(tmp_path / "ckpt", "qwen3_5")


@pytest.mark.parametrize("dtype", [torch.bfloat16, "float16", None], ids=["bf16", "fp16-str", "from-config"])
def test_dtype_conversion(ckpt, dtype):
    model = load_checkpoint(ckpt, dtype=dtype)
    want = {torch.bfloat16: torch.bfloat16, "float16": torch.float16, None: torch.float32}[dtype]
    assert {p.dtype for p in model.parameters()} == {want}
    assert not model.training
    spec = {s.kind: s.dtype for s in model.state_specs()}
    assert spec["recurrent"] == torch.float32 and spec["conv"] == want


def test_fused_expert_layout_loads_like_per_expert(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "next", "qwen3_next")
    ids = torch.randint(0, 256, (2, 9))
    per_expert = load_checkpoint(d)

    def fuse(t):
        for layer in range(4):
            p = f"model.layers.{layer}.mlp.experts"
            gate = [t.pop(f"{p}.{e}.gate_proj.weight") for e in range(4)]
            up = [t.pop(f"{p}.{e}.up_proj.weight") for e in range(4)]
            down = [t.pop(f"{p}.{e}.down_proj.weight") for e in range(4)]
            t[f"{p}.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
            t[f"{p}.down_proj"] = torch.stack(down)

    _rewrite(d, fuse)
    fused = load_checkpoint(d)
    want = per_expert.state_dict()
    for name, t in fused.state_dict().items():
        assert torch.equal(t, want[name]), name
    torch.testing.assert_close(_logits(fused, ids), _logits(per_expert, ids), atol=1e-5, rtol=0)


def test_vision_and_mtp_tensors_are_ignored_quietly(tmp_path, caplog):
    extra = {"model.visual.patch_embed.proj.weight": torch.zeros(4, 3), "mtp.fc.weight": torch.zeros(2, 2)}
    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5", model_type="qwen3_5", extra_tensors=extra)
    with caplog.at_level(logging.INFO, logger="gdn_export.weights"):
        load_checkpoint(d)
    assert "ignored 1 tensors" in caplog.text and "model.visual.patch_embed" in caplog.text
    assert "skipped 1 multi-token-prediction tensors (mtp.fc.weight)" in caplog.text
    assert not [r for r in caplog.records if r.name == "gdn_export.weights" and r.levelno >= logging.WARNING]


def test_unexpected_tensor_is_reported(ckpt, caplog):
    _rewrite(ckpt, lambda t: t.update({"model.layers.0.mlp.surprise.weight": torch.zeros(3)}))
    with caplog.at_level(logging.WARNING, logger="gdn_export.weights"):
        load_checkpoint(ckpt)
    assert "1 unexpected tensors" in caplog.text
    assert "model.layers.0.mlp.surprise.weight" in caplog.text


def _missing(t):
    del t["model.layers.2.linear_attn.A_log"]


def _misshaped(t):
    t["model.layers.3.self_attn.k_proj.weight"] = torch.zeros(32, 63)


def _missing_lm_head(t):
    del t["lm_head.weight"]


TENSOR_ERRORS = [
    ("missing-key", _missing, r"tensor model\.layers\.2\.linear_attn\.A_log is missing from the checkpoint"),
    ("misshaped", _misshaped,
     r"tensor model\.layers\.3\.self_attn\.k_proj\.weight has shape \(32, 63\) in the checkpoint, "
     r"expected \(32, 64\)"),
    ("missing-untied-lm-head", _missing_lm_head, r"tensor lm_head\.weight is missing"),
]


@pytest.mark.parametrize("edit, message", [e[1:] for e in TENSOR_ERRORS], ids=[e[0] for e in TENSOR_ERRORS])
def test_tensor_errors_name_the_key(ckpt, edit, message):
    _rewrite(ckpt, edit)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(ckpt)
    assert "\n" not in str(info.value)


def test_composite_error_names_checkpoint_key(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5", model_type="qwen3_5")
    _rewrite(d, lambda t: t.update({"model.language_model.norm.weight": torch.zeros(65)}))
    with pytest.raises(CheckpointError, match=r"model\.language_model\.norm\.weight has shape \(65,\)"):
        load_checkpoint(d)


def _edit_config(directory, edit):
    path = directory / "config.json"
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))


def test_unsupported_model_type(ckpt):
    _edit_config(ckpt, lambda d: d.update(model_type="mamba2"))
    with pytest.raises(ConfigError, match="model_type 'mamba2' is not supported"):
        load_checkpoint(ckpt)


def test_bad_config_field(ckpt):
    _edit_config(ckpt, lambda d: d.update(hidden_act="gelu_pytorch_tanh"))
    with pytest.raises(ConfigError, match="hidden_act"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("content", [b"", b"garbage that is not a header", b"\xff" * 64],
                         ids=["empty", "text", "huge-header-length"])
def test_corrupt_safetensors(ckpt, content):
    (ckpt / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file") as info:
        load_checkpoint(ckpt)
    assert "\n" not in str(info.value)


def test_truncated_safetensors(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(ckpt)


def test_config_missing_or_invalid(ckpt):
    (ckpt / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON"):
        load_checkpoint(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: config file not found"):
        load_checkpoint(ckpt)


def test_no_weights_and_missing_directory(ckpt, tmp_path):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        load_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        load_checkpoint(tmp_path / "nowhere")


def test_sharded_index_errors(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "s", "qwen3_5", shards=2)
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model-00009-of-00009\.safetensors: safetensors file not found"):
        load_checkpoint(d)
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    index["weight_map"]["model.ghost.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"tensor (model\.norm\.weight|model\.ghost\.weight) listed in"):
        load_checkpoint(d)
    index_path.write_text("[]")
    with pytest.raises(CheckpointError, match="invalid safetensors index"):
        load_checkpoint(d)


def test_composite_missing_tensor_names_checkpoint_key(tmp_path):
    d = make_tiny_checkpoint(tmp_path / "c", "qwen3_5", model_type="qwen3_5")
    _rewrite(d, lambda t: t.pop("model.language_model.layers.1.linear_attn.in_proj_b.weight"))
    with pytest.raises(CheckpointError,
                       match=r"tensor model\.language_model\.layers\.1\.linear_attn\.in_proj_b\.weight is missing"):
        load_checkpoint(d)


QUANT_VALUES = [  # (tensor name, values, the error's words or None when the values are fine)
    pytest.param("m.q_proj.weight_scale_inv", [0.5, 0.0], None, id="block-scale-with-a-zero-block"),
    pytest.param("m.q_proj.weight_scale_inv", [0.5, float("nan")], "1 of 2 scales are not finite and >= 0",
                 id="block-scale-nan"),
    pytest.param("m.q_proj.weight_scale", [0.1, -0.1, 0.2], "1 of 3 scales are not finite and >= 0 (e.g. -0.1",
                 id="weight-scale-negative"),
    pytest.param("m.q_proj.weight_scale", [float("-inf")], "1 of 1 scales are not finite and >= 0 (e.g. -inf)",
                 id="weight-scale-inf"),
    pytest.param("m.q_proj.input_scale", [0.0], "1 of 1 scales are not finite and > 0 (e.g. 0.0)",
                 id="input-scale-zero"),
    pytest.param("m.q_proj.pre_quant_scale", [1.0, 2.0, -3.0], "1 of 3 scales are not finite and > 0 (e.g. -3.0)",
                 id="awq-pre-scale-negative"),
    pytest.param("m.q_proj.weight", [float("nan")], None, id="16-bit-weight-unchecked"),
]


@pytest.mark.parametrize("name,values,message", QUANT_VALUES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("read", ["get", "read_into"])
def test_quantized_values_no_quantizer_writes_are_refused(tmp_path, name, values, message, dtype, read):
    from gdn_export.weights.reader import CheckpointReader

    want = torch.tensor(values, dtype=dtype)
    save_file({name: want}, str(tmp_path / "model.safetensors"))

    def load(reader):
        if read == "get":
            return reader.get(name)
        out = torch.full((len(values),), 7.0, dtype=dtype)
        reader.read_into(name, out)
        return out

    with CheckpointReader(tmp_path) as reader:
        if message is None:
            torch.testing.assert_close(load(reader), want, equal_nan=True, rtol=0, atol=0)
            return
        with pytest.raises(CheckpointError) as info:
            load(reader)
    assert str(info.value).startswith(f"tensor {name}: {message}") and "\n" not in str(info.value)


@pytest.mark.parametrize("byte", [0x7F, 0xFF], ids=["nan", "minus-nan"])
@pytest.mark.parametrize("read", ["get", "read_into"])
def test_float8_nan_weight_is_refused(tmp_path, byte, read):
    from gdn_export.weights.reader import CheckpointReader

    w = torch.full((4, 8), 0.5).to(torch.float8_e4m3fn)
    w.view(torch.uint8)[2, 3] = byte
    w.view(torch.uint8)[0, 0] = 0x7E  # 448, the largest finite e4m3fn value: fine
    save_file({"m.q_proj.weight": w}, str(tmp_path / "model.safetensors"))
    with CheckpointReader(tmp_path) as reader, pytest.raises(CheckpointError) as info:
        if read == "get":
            reader.get("m.q_proj.weight")
        else:
            reader.read_into("m.q_proj.weight", torch.empty(4, 8, dtype=torch.float8_e4m3fn))
    assert str(info.value) == "tensor m.q_proj.weight holds 1 float8_e4m3fn NaN values (a corrupt FP8 weight)"
