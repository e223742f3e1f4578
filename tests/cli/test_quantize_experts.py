"""Quantized routed experts end to end, on MoE checkpoints made by transformers (save_pretrained):
`quantize` (fp8, int4-awq) writes every expert in ModelOpt's per-expert keys, the loader keeps them
quantized (Fp8MoeExperts / Int4MoeExperts), export puts DequantizeLinear of the stacked experts in
front of gdn.MoE and `validate` (ONNX Runtime, CPU) passes; published fine-grained FP8 MoE
checkpoints load with FP8 experts and validate; bad expert tensors are one line naming the key.

Sizes are unusual on purpose: 5-6 experts, top-k 2-3, hidden 160 (K not a multiple of 128 for the
gate_up groups), moe_intermediate_size 36 and 37 (odd: int4-awq refuses it by name)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from safetensors import safe_open

from gdn_export.modules.quant_experts import Fp8MoeExperts, Int4MoeExperts
from gdn_export.weights import load_checkpoint
from tests.onnx._tiny import TWO_LAYERS
from tests.weights.fp8_checkpoints import rewrite, to_published_fp8

transformers = pytest.importorskip("transformers")

# Two layers (GDN, attention): what the quantized experts need, at half the cost of every export.
TEXT = dict(vocab_size=256, hidden_size=160, **TWO_LAYERS, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=24, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=False)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


def _qwen3_5_moe():
    config = transformers.Qwen3_5MoeTextConfig(
        **TEXT, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=36, shared_expert_intermediate_size=48,
        rope_parameters=dict(ROPE, mrope_section=[1, 1, 0]))
    return transformers.Qwen3_5MoeForCausalLM(config)


def _qwen3_next():
    config = transformers.Qwen3NextConfig(
        **TEXT, intermediate_size=96, rope_parameters=ROPE, num_experts=5, num_experts_per_tok=2,
        moe_intermediate_size=37, shared_expert_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[1])
    return transformers.Qwen3NextForCausalLM(config)


BUILDERS = {"qwen3_5_moe": _qwen3_5_moe, "qwen3_next": _qwen3_next}
_MADE: dict = {}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    def get(name):
        if name not in _MADE:
            torch.manual_seed(0)
            hf = BUILDERS[name]().eval()
            with torch.no_grad():  # spread the routers: every expert gets tokens
                for n, p in hf.named_parameters():
                    if n.endswith("mlp.gate.weight"):
                        p.copy_(0.3 * torch.randn(p.shape))
            directory = tmp_path_factory.mktemp(name) / "bf"
            hf.save_pretrained(directory)
            _MADE[name] = directory
        return _MADE[name]

    return get


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "ids.npy"
    np.save(path, np.random.default_rng(0).integers(0, 256, 160))
    return path


def _keys(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in f.keys()}


CASES = [pytest.param("qwen3_5_moe", "fp8", id="qwen3_5_moe-E6-k3-I36-fp8"),
         pytest.param("qwen3_5_moe", "int4-awq", id="qwen3_5_moe-E6-k3-I36-int4-awq"),
         pytest.param("qwen3_next", "fp8", id="qwen3_next-E5-k2-I37-fp8")]


@pytest.mark.parametrize("name,fmt", CASES)
def test_quantize_export_validate(cli, made, ids_file, tmp_path, name, fmt):
    src = made(name)
    out = tmp_path / "q"
    r = cli("quantize", src, "-o", out, "--format", fmt, "--calib-data", ids_file, "--calib-samples", 4,
            "--calib-seq-len", 40)
    assert r.code == 0, r.err
    assert "routed experts:" in r.err
    if fmt == "fp8":
        assert "got no calibration token" in r.err
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert not any("experts" in entry for entry in qc["ignore"]), qc["ignore"]
    keys = _keys(out)
    E = 6 if name == "qwen3_5_moe" else 5
    layer = "model.layers.0.mlp.experts"
    for e in range(E):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            base = f"{layer}.{e}.{proj}."
            assert keys[base + "weight"] == ("F8_E4M3" if fmt == "fp8" else "U8"), base
            assert base + "weight_scale" in keys
            assert (base + "input_scale" in keys) == (fmt == "fp8")
    model = load_checkpoint(out)
    experts = [m for m in model.modules() if isinstance(m, (Fp8MoeExperts, Int4MoeExperts))]
    assert experts and all(m.FORMAT == fmt for m in experts)

    onnx_path = tmp_path / "q.onnx"
    assert cli("export", out, "-o", onnx_path, "-q").code == 0
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    inits = {i.name: i.data_type for i in graph.initializer}
    made_by = {o: n for n in graph.node for o in n.output}
    moe_nodes = [n for n in graph.node if n.op_type == "MoE"]
    assert moe_nodes
    for node in moe_nodes:
        for w in node.input[2:]:
            dq = made_by[w]
            assert dq.op_type == "DequantizeLinear", dq.op_type
            want = onnx.TensorProto.FLOAT8E4M3FN if fmt == "fp8" else onnx.TensorProto.INT4
            assert inits[dq.input[0]] == want
    r = cli("validate", out, "--onnx", onnx_path, "--baseline", src, "-q")
    assert r.code == 0, r.out
    assert "PASS" in r.out and f"quantization ({fmt}) vs the 16-bit" in r.out


def test_int4_refuses_odd_expert_size(cli, made, tmp_path):
    out = tmp_path / "q"
    r = cli("quantize", made("qwen3_next"), "-o", out, "--format", "int4-awq")
    assert "moe_intermediate_size 37 is odd" in r.error_line("quantize")
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def published(made, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pub") / "fp8"
    to_published_fp8(made("qwen3_5_moe"), folder)
    return folder


def test_published_fp8_experts_stay_fp8_and_validate(cli, published, tmp_path):
    model = load_checkpoint(published)
    experts = [m for m in model.modules() if isinstance(m, Fp8MoeExperts)]
    assert experts and all(m.FORMAT == "fp8-block128" and m.gate_up_proj.dtype == torch.float8_e4m3fn
                           for m in experts)
    assert experts[0].gate_up_proj_weight_scale.shape == (6, 72, 2)  # ceil(160 / 128) groups
    onnx_path = tmp_path / "fp8.onnx"
    assert cli("export", published, "-o", onnx_path, "-q").code == 0
    r = cli("validate", published, "--onnx", onnx_path, "-q")
    assert r.code == 0 and "PASS" in r.out and "quantization (fp8-block128)" in r.out, r.out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


BAD_PUBLISHED = [
    pytest.param(lambda t: t.update({"model.layers.0.mlp.experts.2.gate_proj.weight_scale_inv": torch.ones(1, 1)}),
                 "tensor model.layers.0.mlp.experts.2.gate_proj.weight_scale_inv has shape (1, 1)", id="scale-shape"),
    pytest.param(lambda t: t.pop("model.layers.1.mlp.experts.4.down_proj.weight_scale_inv"),
                 "tensor model.layers.1.mlp.experts.4.down_proj.weight_scale_inv is missing", id="scale-missing"),
]


@pytest.mark.parametrize("edit,message", BAD_PUBLISHED)
def test_bad_published_expert_scales(cli, published, tmp_path, edit, message):
    folder = _copy(published, tmp_path / "bad")
    rewrite(folder, edit_tensors=edit)
    r = cli("export", folder, "-o", tmp_path / "x.onnx", "-q")
    assert message in r.error_line("export")
    assert not (tmp_path / "x.onnx").exists()
