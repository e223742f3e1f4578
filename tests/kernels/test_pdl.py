"""Programmatic dependent launch of our Triton kernels (kernels.triton_utils.PDL): where it is taken, and
on a GPU that it changes no bit. A kernel launched with PDL may start before the one before it ends; it
waits (gdc_wait) before reading activations or writing, so every output must equal the output without
PDL, in eager chains and inside CUDA graphs (a decode step replayed), the skinny GEMM's split-K
counters and partials included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import triton_utils
from tests.ops.impl import HAS_CUDA, NO_GPU


@pytest.fixture
def pdl_switch(monkeypatch):
    """set(on): PDL on or off for the kernels launched after (the per-device answer recomputed)."""
    def set_(on: bool) -> None:
        monkeypatch.setattr(triton_utils, "PDL", on)
        monkeypatch.setattr(triton_utils, "_PDL_DEVICES", {})
    return set_


def test_never_on_cpu_tensors_or_when_off(pdl_switch):
    pdl_switch(True)
    assert not triton_utils.pdl(torch.zeros(2))
    assert triton_utils.pdl_launch(torch.zeros(2)) == {"USE_PDL": False}
    pdl_switch(False)
    assert not triton_utils.pdl(torch.zeros(2))


def test_off_by_default_and_by_environment():
    """GDN_EXPORT_PDL=1 turns it on; anything else, or nothing, leaves it off (off until timed)."""
    assert triton_utils.pdl_from_env({}) is False
    assert triton_utils.pdl_from_env({"GDN_EXPORT_PDL": "0"}) is False
    assert triton_utils.pdl_from_env({"GDN_EXPORT_PDL": "1"}) is True


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
def test_taken_on_hopper_cuda_tensors(pdl_switch):
    pdl_switch(True)
    x = torch.zeros(2, device="cuda")
    want = torch.cuda.get_device_capability()[0] >= 9 and triton_utils._triton_has_pdl()
    assert triton_utils.pdl(x) is want
    assert triton_utils.pdl_launch(x) == ({"USE_PDL": True, "launch_pdl": True} if want else {"USE_PDL": False})


def _chain(x, p):
    """norm -> fp8 skinny GEMM (split K) -> silu * up -> int4 skinny GEMM -> norm with residual: each
    kernel reads the one before it."""
    from gdn_export.ops.rms_norm import add_rms_norm_fused, rms_norm_fused
    from gdn_export.ops.silu_mul import silu_mul_fused
    from kernels.quant_linear.triton import skinny

    h = rms_norm_fused(x, p["w_norm"], 1e-6, zero_centered=True)
    gu = skinny.skinny(skinny.FP8_TENSOR, h, p["w8"], p["ws"], p["s_in"])
    a = silu_mul_fused(gu[:, : p["I"]], gu[:, p["I"]:])
    y = skinny.skinny(skinny.INT4, a, p["qw"], p["sc"], group_size=128)
    return add_rms_norm_fused(x, y, p["w_norm"], 1e-6, zero_centered=True)


def _params(H=2048, I=3072):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(2 * I, H, device="cuda", generator=g) * 0.05
    ws = w.abs().amax(1) / 448
    return dict(I=I, w_norm=torch.randn(H, device="cuda", generator=g).to(torch.bfloat16) * 0.2,
                w8=(w / ws[:, None]).to(torch.float8_e4m3fn), ws=ws.float(), s_in=torch.tensor(0.05, device="cuda"),
                qw=torch.randint(0, 256, (H, I // 2), device="cuda", dtype=torch.uint8, generator=g),
                sc=(torch.rand(H, I // 128, device="cuda", generator=g) * 0.01).to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
@pytest.mark.parametrize("M", [1, 5, 64])
def test_kernel_chain_equal_with_and_without_pdl(pdl_switch, M):
    """The chain eagerly and replayed from a CUDA graph, PDL on, against PDL off: bit-equal, fresh inputs
    per replay (written into the graph's static input), outputs NaN-poisoned before each replay."""
    p = _params()
    torch.manual_seed(M)
    xs = [(torch.randn(M, 2048, device="cuda") * 3).to(torch.bfloat16) for _ in range(3)]
    pdl_switch(False)
    want = [_chain(x, p) for x in xs]
    pdl_switch(True)
    got = [_chain(x, p) for x in xs]
    for (ws, wy), (gs, gy) in zip(want, got):
        assert torch.equal(ws, gs) and torch.equal(wy, gy)
    static = xs[0].clone()
    _chain(static, p)  # compiled and probed outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(static, p)
    for x, (ws, wy) in zip(xs, want):
        static.copy_(x)
        out[0].fill_(float("nan"))
        out[1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], ws) and torch.equal(out[1], wy)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
@pytest.mark.parametrize("family", ["qwen3_5", "olmo_hybrid"])
def test_graph_runner_tokens_and_logits_equal_with_and_without_pdl(pdl_switch, tmp_path, family):
    """Greedy generation on the GraphRunner (eager prefill, CUDA-graph decode, triton ops, bf16): the
    same tokens and bit-equal step logits with PDL on and off."""
    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.base import generate
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint
    from gdn_export.weights.tiny import make_tiny_checkpoint

    src = make_tiny_checkpoint(tmp_path / "ck", family, seed=3)
    prompts = [np.array([3, 1, 4, 1, 5, 9, 2]), np.array([6, 5]), np.array([7, 9, 3, 2, 3, 8, 4, 6, 2, 6])]
    results = []
    for on in (False, True):
        pdl_switch(on)
        model = load_checkpoint(src, dtype=torch.bfloat16, device="cuda")
        model.layout = DeployLayout.make(cache_len=64)
        runner = GraphRunner(model, device="cuda", op_backend="triton")
        results.append(generate(runner, prompts, 10))
    np.testing.assert_array_equal(results[0].generated, results[1].generated)
    for a, b in zip(results[0].step_logits, results[1].step_logits):
        np.testing.assert_array_equal(a, b)
