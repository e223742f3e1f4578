"""The quantized MoE ops' contract (gdn_export.ops.moe_quant), held by the fp32 reference through
the public entries and by the Triton kernels (on the GPU; under TRITON_INTERPRET=1 on the small
cases without one), every weight form, outputs NaN-poisoned: ids `impl-form-case-dtype`."""

from __future__ import annotations

import pytest
import torch

from tests.ops.impl import HAS_CUDA, NO_GPU, big_marks
from tests.ops.moe_quant.cases import ALL, CASES, FORMS, Case, args, check, make_inputs, oracle


# the public entries on CUDA tensors (dispatch to the Triton kernels through the custom op)
OP_CUDA_CASES = ("N7-H160-E5-I37-k3", "decode-B32-qwen35")


def _op(x, case):
    from gdn_export.ops.moe_quant import moe_fp8, moe_int4

    return (moe_fp8 if x["form"].startswith("fp8") else moe_int4)(*args(x, case))


def _triton(x, case):
    from kernels.moe_quant.triton import moe_quant as quant_triton

    return (quant_triton.moe_fp8 if x["form"].startswith("fp8") else quant_triton.moe_int4)(*args(x, case))


def _params():
    out = []
    impls = (("op", _op, "cpu"), ("op-cuda", _op, "cuda"), ("triton", _triton, "cuda" if HAS_CUDA else "cpu"))
    for impl, run, device in impls:
        for n, case in enumerate(CASES):
            gpu_case = "gpu" in case.tags
            if (gpu_case and impl == "op") or (impl == "op-cuda" and case.name not in OP_CUDA_CASES):
                continue
            needs_gpu = gpu_case or impl == "op-cuda"
            marks = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)] if needs_gpu else (
                [pytest.mark.gpu] if device == "cuda" else [])
            for f, form in enumerate(FORMS):
                dtypes = ALL if (device == "cuda" or impl == "op") else (
                    (torch.float32, (torch.bfloat16, torch.float16)[(n + f) % 2]))  # interpreter: fp32 + one 16-bit
                for dtype in dtypes:
                    did = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
                    out.append(pytest.param(run, device, case, form, dtype, id=f"{impl}-{form}-{case.name}-{did}",
                                            marks=marks + big_marks(case)))
    return out


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every floating torch.empty the ops allocate (act, per-pair outputs) starts as NaN."""
    empty = torch.empty

    def nan_empty(*a, **k):
        t = empty(*a, **k)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", nan_empty)


@pytest.mark.parametrize("run,device,case,form,dtype", _params())
def test_matches_reference(run, device, case, form, dtype, poisoned_outputs):
    x = make_inputs(case, form, dtype, device)
    want = oracle(case, x)
    out = run(x, case)
    assert torch.isfinite(out).all()
    check(case, x, out, want)


@pytest.mark.parametrize("run", [pytest.param(_op, id="op"), pytest.param(_triton, id="triton",
                                 marks=[pytest.mark.gpu] if HAS_CUDA else [])])
@pytest.mark.parametrize("form", FORMS)
def test_unrouted_experts_are_never_read(run, form):
    """NaN in the weight scales (and activation scales) of experts no token picks stays out of out."""
    case = Case("unrouted", 5, 64, 8, 32, 2)
    device = "cuda" if run is _triton and HAS_CUDA else "cpu"
    x = make_inputs(case, form, torch.float32, device, seed=3)
    x["router_logits"][:, 4:] = -30.0
    want = oracle(case, x)
    for name in ("gate_up_scale", "down_scale", "gate_up_input_scale", "down_input_scale"):
        if x.get(name) is not None:
            x[name][4:] = float("nan")
    out = run(x, case)
    assert torch.isfinite(out).all()
    check(case, x, out, want)


@pytest.mark.gpu
@pytest.mark.big_gpu_memory
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
@pytest.mark.parametrize("form", FORMS)
def test_cuda_graph_replay_and_compile(form):
    """The ops capture in a CUDA graph (no host sync, no data-dependent allocation) and compile as
    one node each: replay and torch.compile give eager's output on fresh inputs."""
    case = next(c for c in CASES if c.name == "decode-B32-qwen35")
    x = make_inputs(case, form, torch.bfloat16, "cuda", seed=5)
    eager = _op(x, case)
    fresh = make_inputs(case, form, torch.bfloat16, "cuda", seed=6)
    static = dict(x, hidden=x["hidden"].clone(), router_logits=x["router_logits"].clone())  # refilled below
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = _op(static, case)
    for name in ("hidden", "router_logits"):
        static[name].copy_(fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    want = _op({**x, "hidden": fresh["hidden"], "router_logits": fresh["router_logits"]}, case)
    assert torch.equal(captured, want)
    torch._dynamo.reset()  # each form compiles afresh (dynamo's recompile limit counts per code object)
    compiled = torch.compile(lambda *a: _op(dict(zip(("hidden", "router_logits"), a), **{k: v for k, v in x.items()
                                                   if k not in ("hidden", "router_logits")}), case))
    torch.testing.assert_close(compiled(x["hidden"], x["router_logits"]), eager, rtol=0, atol=0)
