"""`gdn-export quantize --kv-cache fp8` on checkpoints made by transformers (Qwen3.5, Qwen3-Next,
Qwen3.5-MoE, OLMo-Hybrid; save_pretrained, sharded): the scales are amax / 448 of what the cache
stores (checked against the amax of K / V over the same calibration rows, recomputed here from the
fp32 model), written as ModelOpt's unified form; the checkpoint loads with an FP8 cache, exports
with FLOAT8E4M3FN cache I/O and Q/DQ around TensorScatter, and validates in ONNX Runtime. Bad
checkpoints and flags are one-line errors naming the key, nothing written."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load_file, save_file

from gdn_export.errors import CheckpointError, GdnExportError
from gdn_export.modules.kv_cache_fp8 import attention_layers, kv_scales
from gdn_export.ops.attention.kv_fp8 import FP8
from gdn_export.quantize.pipeline import quantize_checkpoint
from gdn_export.weights import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint

transformers = pytest.importorskip("transformers")
from tests.test_transformers_parity import BUILDERS, _randomise  # noqa: E402

CASES = [pytest.param("qwen3_5_text", "fp8", id="qwen3_5-fp8"), pytest.param("qwen3_next", "int4-awq", id="qwen3_next-int4"),
         pytest.param("qwen3_5_moe_text", "fp8", id="qwen3_5_moe-fp8"),
         pytest.param("olmo_hybrid", "int4-awq", id="olmo_hybrid-int4")]
ROWS = [np.random.default_rng(1).integers(0, 256, 24) for _ in range(3)]


@pytest.fixture
def cli_main(capsys):
    """gdn-export's main() with argv; (code, stdout, stderr)."""
    from types import SimpleNamespace

    from gdn_export.cli.main import main

    def run(*argv):
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return SimpleNamespace(code=code, out=captured.out, err=captured.err)
    return run


def hf_checkpoint(case, root):
    torch.manual_seed(0)
    hf = BUILDERS[case]().eval()
    _randomise(hf, seed=1)
    hf.save_pretrained(root / case, max_shard_size="100KB")
    return root / case


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("kvq")


@pytest.fixture(scope="module")
def ids_file(root):
    np.save(root / "ids.npy", np.concatenate(ROWS))
    return root / "ids.npy"


def expected_scales(src) -> dict[int, tuple[float, float]]:
    """amax / 448 of K (after k_norm, RoPE) and V per attention layer, over ROWS, from the fp32 model:
    K / V taken from the in-place cache the forward writes (a model-dtype cache, fp32 here)."""
    model = load_checkpoint(src, dtype=torch.float32)
    out = {i: [0.0, 0.0] for i in attention_layers(model)}
    with torch.no_grad():
        for r in ROWS:
            ids = torch.as_tensor(r)[None]
            states = model(ids, torch.zeros(1, dtype=torch.long), torch.tensor([len(r)]), *model.empty_states(1))[1:]
            for spec, s in zip(model.state_specs(), states):
                if spec.kind in ("key", "value"):
                    j = 0 if spec.kind == "key" else 1
                    out[spec.layer][j] = max(out[spec.layer][j], float(s[:, :, :len(r)].abs().max()))
    return {i: (a / 448, b / 448) for i, (a, b) in out.items()}


@pytest.mark.parametrize("case,fmt", CASES)
def test_quantize_kv_fp8_scales_and_format(root, ids_file, case, fmt):
    src = hf_checkpoint(case, root)
    out = root / f"{case}-{fmt}-kv"
    quantize_checkpoint(src, out, fmt, calib_data=ids_file, samples=3, seq_len=24, kv_cache="fp8")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["kv_cache_scheme"] == {"dynamic": False, "num_bits": 8, "type": "float"}
    assert qc["kv_cache_quant_algo"] == "FP8"
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["kv_cache_quant_algo"] == "FP8"
    tensors = {}
    for f in out.glob("*.safetensors"):
        tensors.update(load_file(f))
    model = load_checkpoint(out)
    got = kv_scales(model)
    want = expected_scales(src)
    assert got is not None and set(got) == set(want) == set(attention_layers(model))
    prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in tensors else "model."
    for i, (ks, vs) in want.items():
        k_t = tensors[f"{prefix}layers.{i}.self_attn.k_proj.k_scale"]
        v_t = tensors[f"{prefix}layers.{i}.self_attn.v_proj.v_scale"]
        assert k_t.dtype == v_t.dtype == torch.float32 and k_t.shape == v_t.shape == ()
        # the calibration model's Linears are ModelOpt's fake-quantized ones (fp8) or AWQ-rescaled
        # (int4): K / V differ from the 16-bit model's by that rounding, a few percent
        assert got[i][0] == pytest.approx(ks, rel=0.15) and float(k_t) == got[i][0]
        assert got[i][1] == pytest.approx(vs, rel=0.15) and float(v_t) == got[i][1]
    specs = model.state_specs()
    assert [s.dtype for s in specs if s.kind in ("key", "value")] == [FP8] * (2 * len(want))
    assert all(s.dtype == torch.float32 for s in specs if s.kind == "recurrent")


def test_default_has_no_kv_keys(root, ids_file):
    src = make_tiny_checkpoint(root / "plain-src", "qwen3_5", seed=4)
    out = quantize_checkpoint(src, root / "plain", "fp8", calib_data=ids_file, samples=3, seq_len=24)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "kv_cache_scheme" not in qc and "kv_cache_quant_algo" not in qc
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["kv_cache_quant_algo"] is None
    assert not any(k.endswith(("k_scale", "v_scale")) for k in load_file(out / "model.safetensors"))
    assert kv_scales(load_checkpoint(out)) is None


@pytest.mark.parametrize("case,dtype", [("qwen3_5_text-fp8", "fp32"), ("qwen3_5_moe_text-fp8", "bf16"),
                                        ("olmo_hybrid-int4-awq", "bf16")])
def test_export_and_validate_in_onnxruntime(cli_main, root, case, dtype):
    """Needs test_quantize_kv_fp8_scales_and_format's folders (same module, run before)."""
    q = root / f"{case}-kv"
    if not q.is_dir():
        pytest.skip("run with the quantize tests of this module")
    onnx_path = root / f"{case}-{dtype}.onnx"
    assert cli_main("export", q, "-o", onnx_path, "--max-cache-len", 96, "--dtype", dtype, "-q").code == 0
    m = onnx.load(str(onnx_path))
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["gdn_export.kv_cache_format"] == "fp8"
    assert set(json.loads(meta["gdn_export.kv_cache_scales"])) == {str(i) for i in kv_scales(load_checkpoint(q))}
    f8 = onnx.TensorProto.FLOAT8E4M3FN
    for v in list(m.graph.input) + list(m.graph.output):
        if v.name.endswith((".key", ".value")):
            assert v.type.tensor_type.elem_type == f8, v.name
    producer = {o: n for n in m.graph.node for o in n.output}
    scatters = [n for n in m.graph.node if n.op_type == "TensorScatter"]
    assert scatters and all(producer[n.input[1]].op_type == "QuantizeLinear" for n in scatters)
    consumers = {n.output[0]: [c.op_type for c in m.graph.node if n.output[0] in c.input] for n in scatters}
    assert all(ops == ["DequantizeLinear"] for ops in consumers.values()), consumers
    r = cli_main("validate", q, "--onnx", onnx_path, "--prompt-len", 65, "--decode-steps", 3, "-q")
    assert r.code == 0, r.out
    assert "PASS" in r.out and ".key" in r.out


def _rewrite(folder, edit):
    path = folder / "model.safetensors"
    t = load_file(path)
    edit(t)
    save_file(t, path, metadata={"format": "pt"})


KEY = "model.layers.3.self_attn.k_proj.k_scale"


@pytest.fixture(scope="module")
def kv_ckpt(root, ids_file):
    src = make_tiny_checkpoint(root / "bad-src", "qwen3_5", seed=6)
    return quantize_checkpoint(src, root / "bad-kv", "fp8", calib_data=ids_file, samples=3, seq_len=24,
                               kv_cache="fp8")


BAD = {
    "missing": (lambda t: t.pop(KEY), f"tensor {KEY} is missing"),
    "mis-shaped": (lambda t: t.update({KEY: torch.ones(2)}), f"tensor {KEY} has shape \\(2,\\)"),
    "integer": (lambda t: t.update({KEY: torch.ones((), dtype=torch.int32)}), f"tensor {KEY} is I32"),
    "zero": (lambda t: t.update({KEY: torch.zeros(())}), f"tensor {KEY} is 0.0: .* finite and > 0"),
    "negative": (lambda t: t.update({KEY: -torch.ones(())}), f"tensor {KEY} is -1.0"),
    "nan": (lambda t: t.update({KEY: torch.tensor(float("nan"))}), f"tensor {KEY} is nan"),
    "stray": (lambda t: t.update({"model.layers.0.linear_attn.k_proj.k_scale": torch.ones(())}),
              "model.layers.0.linear_attn.k_proj.k_scale belongs to no attention layer"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_kv_scales_are_named(kv_ckpt, tmp_path, bad):
    import shutil

    folder = tmp_path / "c"
    shutil.copytree(kv_ckpt, folder)
    edit, message = BAD[bad]
    _rewrite(folder, edit)
    with pytest.raises(CheckpointError, match=message) as exc:
        load_checkpoint(folder)
    assert "\n" not in str(exc.value)


def test_scales_without_kv_scheme_are_refused(kv_ckpt, tmp_path):
    import shutil

    folder = tmp_path / "c"
    shutil.copytree(kv_ckpt, folder)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["quantization_config"]["kv_cache_scheme"], cfg["quantization_config"]["kv_cache_quant_algo"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=f"tensor {KEY} is an FP8 K/V cache scale, but"):
        load_checkpoint(folder)


def test_cli_refusals(cli_main, root, ids_file, tmp_path):
    src = make_tiny_checkpoint(root / "cli-src", "qwen3_5", seed=7)
    r = cli_main("quantize", src, "-o", tmp_path / "o", "--format", "fp8", "--kv-cache", "int8")
    assert r.code == 2 and "--kv-cache 'int8' is not one of fp8" in r.err and not (tmp_path / "o").exists()
    linear_only = make_tiny_checkpoint(root / "linear-only", "qwen3_5", seed=7,
                                       layer_types=["linear_attention"] * 4)
    r = cli_main("quantize", linear_only, "-o", tmp_path / "o", "--format", "fp8", "--kv-cache", "fp8",
                 "--calib-data", ids_file)
    assert r.code == 2 and "no attention layers" in r.err and not (tmp_path / "o").exists()
    with pytest.raises(GdnExportError, match="not one of fp8"):
        quantize_checkpoint(src, tmp_path / "o", "fp8", kv_cache="fp16")
