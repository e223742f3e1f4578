"""Calibration and quantization of the routed experts (gdn_export.quantize.experts): the recorded
per-expert ranges are those of the tokens the router sends each expert (checked against a plain
loop), an expert no token reached takes its layer's largest scale, the written checkpoint loads back
to the same quantized model, and bad ModelOpt-form expert tensors are one line naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from gdn_export.errors import CheckpointError
from gdn_export.modules.quant_experts import Fp8MoeExperts, Int4MoeExperts
from gdn_export.ops.moe.naive import route
from gdn_export.quantize.experts import _input_scales, apply_experts, quantize_experts, recording
from gdn_export.quantize.writer import write_quantized
from gdn_export.weights.loader import FAMILIES, load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint


def _logits(model, ids):
    B, T = ids.shape
    with torch.no_grad():
        return model(ids, torch.zeros(B, dtype=torch.long), torch.full((B,), T), *model.empty_states(B))[0]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("e") / "bf", "qwen3_5_moe", seed=4, hidden_size=160,
                                moe_intermediate_size=40, num_experts=5, num_experts_per_tok=2)


def test_recorded_ranges_are_the_routed_tokens(src):
    model = load_checkpoint(src)
    block = model.model.layers[0].mlp
    seen = {}

    def grab(mod, inputs, output):  # the MoE block's input, what the router and the experts see
        seen["x"] = inputs[0].reshape(-1, inputs[0].shape[-1]).detach().clone()

    handle = block.register_forward_hook(grab)
    ids = torch.randint(0, 256, (2, 21), generator=torch.Generator().manual_seed(0))
    want = _logits(model, ids)
    with recording(model) as stats:
        got = _logits(model, ids)
    handle.remove()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # recording runs the same experts
    s = stats["model.layers.0.mlp.experts"]
    x = seen["x"]  # route the block's input as the block does
    expert_ids, _ = route(torch.nn.functional.linear(x, block.gate.weight), block.top_k, block.norm_topk_prob)
    I = block.experts.intermediate_size
    for e in range(5):
        tok = (expert_ids == e).any(-1)
        assert int(s.tokens[e]) == int(tok.sum())
        if tok.any():
            xe = x[tok]
            h = xe @ block.experts.gate_up_proj[e].T
            act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            torch.testing.assert_close(s.gate_up_amax[e], xe.abs().max(), rtol=1e-6, atol=0)
            torch.testing.assert_close(s.down_amax[e], act.abs().max(), rtol=1e-5, atol=0)
    assert "routed" not in block.experts.__dict__  # the recorder is gone after the block


def test_unreached_expert_takes_the_layer_max():
    amax = torch.tensor([1.0, 4.0, 0.0, 2.0])
    tokens = torch.tensor([3, 1, 0, 7])
    got = _input_scales(amax, tokens)
    torch.testing.assert_close(got, torch.tensor([1.0, 4.0, 4.0, 2.0]) / 448)


@pytest.mark.parametrize("fmt", ["fp8", "int4-awq"])
def test_written_experts_load_back_identical(src, tmp_path, fmt):
    calib = load_checkpoint(src)
    rng = np.random.default_rng(0)
    with recording(calib) as stats:
        for _ in range(2):
            _logits(calib, torch.as_tensor(rng.integers(0, 256, (1, 24))))
    notes = []
    tensors = quantize_experts(calib, fmt, stats, torch.float32, notes.append)
    assert len(tensors) == 4 and any("routed experts: 20 in 4 layers" in n for n in notes)
    model = apply_experts(load_checkpoint(src), fmt, tensors)
    cls = Fp8MoeExperts if fmt == "fp8" else Int4MoeExperts
    assert sum(isinstance(m, cls) for m in model.modules()) == 4
    out = write_quantized(model, FAMILIES[model.config.family], model.config, src, tmp_path / "q", fmt, "test",
                          torch.float32)
    # the 16-bit Linears are not quantized here: the config's ModelOpt section still parses
    loaded = load_checkpoint(out)
    # The same model: every tensor bit for bit (dtype, shape, values), the same modules and config.
    want, got = model.state_dict(), loaded.state_dict()
    assert list(got) == list(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape, key
        assert torch.equal(got[key].view(torch.uint8), tensor.view(torch.uint8)), key
    assert repr(loaded) == repr(model) and loaded.config == model.config
    # Logits to fp32 rounding only: with one intra-op thread (pytest-xdist workers) CPU GEMMs sum in
    # an order that depends on the operands' memory alignment (loaded tensors sit in other buffers).
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids), rtol=1e-6, atol=1e-6)
    full = _logits(load_checkpoint(src), ids)
    rel = float((_logits(model, ids) - full).norm() / full.norm())
    assert 1e-5 < rel < (0.3 if fmt == "fp8" else 0.6), rel  # experts only; measured 0.05-0.2 (fp8)


@pytest.fixture(scope="module")
def written_fp8(src, tmp_path_factory):
    calib = load_checkpoint(src)
    with recording(calib) as stats:
        _logits(calib, torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(2)))
    model = apply_experts(load_checkpoint(src), "fp8", quantize_experts(calib, "fp8", stats, torch.float32))
    return write_quantized(model, FAMILIES[model.config.family], model.config, src,
                           tmp_path_factory.mktemp("w") / "q", "fp8", "test", torch.float32)


def _edit(folder, fn):
    path = folder / "model.safetensors"
    t = load_file(str(path))
    fn(t)
    save_file(t, str(path))


E = "model.layers.2.mlp.experts.3."
BAD = [
    pytest.param(lambda t: t.update({E + "up_proj.weight_scale": torch.ones(7)}),
                 f"tensor {E}up_proj.weight_scale has shape (7,)", id="weight-scale-shape"),
    pytest.param(lambda t: t.update({E + "down_proj.input_scale": torch.ones(2)}),
                 f"tensor {E}down_proj.input_scale has shape (2,)", id="input-scale-shape"),
    pytest.param(lambda t: t.pop(E + "gate_proj.input_scale"),
                 f"tensor {E}gate_proj.input_scale is missing", id="input-scale-missing"),
    pytest.param(lambda t: t.update({E + "down_proj.weight": t[E + "down_proj.weight"][:, :8].contiguous()}),
                 f"tensor {E}down_proj.weight has shape", id="weight-shape"),
]


@pytest.mark.parametrize("edit,message", BAD)
def test_bad_modelopt_expert_tensors(written_fp8, tmp_path, edit, message):
    import shutil

    folder = tmp_path / "bad"
    shutil.copytree(written_fp8, folder)
    _edit(folder, edit)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["quant_algo"] == "FP8"


def test_expert_awq_pre_scale_is_refused_by_name(src, tmp_path):
    calib = load_checkpoint(src)
    with recording(calib) as stats:
        _logits(calib, torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(3)))
    model = apply_experts(load_checkpoint(src), "int4-awq", quantize_experts(calib, "int4-awq", stats, torch.float32))
    out = write_quantized(model, FAMILIES[model.config.family], model.config, src, tmp_path / "q", "int4-awq", "test",
                          torch.float32)
    key = "model.layers.1.mlp.experts.0.up_proj.pre_quant_scale"
    _edit(out, lambda t: t.update({key: torch.ones(160)}))
    with pytest.raises(CheckpointError, match=f"tensor {key}: an AWQ pre-scale on routed experts is not supported"):
        load_checkpoint(out)
