"""The quantized-MoE fp32 references (gdn_export.ops.moe_quant.naive) against a literal float64 loop
over every token and every expert (weights dequantized element by element, activations rounded to
e4m3 by torch's float8 conversion), the fake (shape) implementations and the one-line input errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn_export.ops.moe_quant import moe_fp8, moe_int4
from tests.ops.moe_quant.cases import CASES, FORMS, args, make_inputs


def _dequant(x, which, K):
    w, s = x[which], x[f"{which}_scale"].double()
    E, N = w.shape[:2]
    out = torch.empty(E, N, K, dtype=torch.float64)
    for k in range(K):
        if x["form"].startswith("fp8"):
            g = 0 if s.shape[2] == 1 else k // 128
            out[:, :, k] = w[:, :, k].double() * s[:, :, g]
        else:
            byte = w[:, :, k // 2].to(torch.int16)
            nib = (byte >> (4 * (k % 2))) & 15
            out[:, :, k] = torch.where(nib >= 8, nib - 16, nib).double() * s[:, :, k // x["group_size"]]
    return out


def _e4m3(v, s):
    return (v / s).float().clamp(-448, 448).to(torch.float8_e4m3fn).double() * s


def _literal(x, top_k, norm):
    hidden, logits = x["hidden"].double(), x["router_logits"].double()
    N, H = hidden.shape
    E, I = logits.shape[1], x["gate_up"].shape[1] // 2
    gu, dn = _dequant(x, "gate_up", H), _dequant(x, "down", I)
    probs = torch.softmax(logits, -1)
    out = torch.zeros(N, H, dtype=torch.float64)
    static = x.get("gate_up_input_scale") is not None
    for n in range(N):
        chosen = sorted(range(E), key=lambda e: -probs[n, e].item())[:top_k]
        total = sum(probs[n, e] for e in chosen) if norm else 1.0
        for e in chosen:
            xe = _e4m3(hidden[n], x["gate_up_input_scale"][e].double()) if static else hidden[n]
            h = gu[e] @ xe
            act = F.silu(h[:I]) * h[I:]
            if static:
                act = _e4m3(act, x["down_input_scale"][e].double())
            out[n] += probs[n, e] / total * (dn[e] @ act)
    return out


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", [c for c in CASES if "small" in c.tags][:3], ids=lambda c: c.name)
def test_reference_matches_literal_loop(case, form):
    x = make_inputs(case, form, torch.float32, "cpu", seed=11)
    fn = moe_fp8 if form.startswith("fp8") else moe_int4
    got = fn(*args(x, case)).double()
    want = _literal(x, case.top_k, case.norm)
    err = ((got - want).norm() / want.norm()).item()
    # fp32 against float64 arithmetic; a static-FP8 activation on an e4m3 rounding boundary may round
    # one step apart (fp32 vs float64 sums), a 2^-3 change of that one element
    assert err < (2e-3 if form == "fp8-static" else 1e-5), err


def test_fake_shapes_and_one_node_under_export():
    case = CASES[1]
    for form in ("fp8-static", "int4-g32"):
        x = make_inputs(case, form, torch.float32, "cpu", seed=1)
        op = torch.ops.gdn.moe_fp8 if form.startswith("fp8") else torch.ops.gdn.moe_int4
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as mode:
            fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args(x, case)]
            out = op(*fake)
        assert tuple(out.shape) == (case.N, case.H) and out.dtype == torch.float32


def _bad(form, edit):
    case = CASES[1]
    x = make_inputs(case, form, torch.float32, "cpu", seed=2)
    edit(x)
    a = args(x, case)
    return (moe_fp8 if form.startswith("fp8") else moe_int4)(*a)  # the public entry checks first


BAD = [
    pytest.param("fp8-static", lambda x: x.update(gate_up_scale=x["gate_up_scale"][:, :5]),
                 "gate_up_scale must be fp32", id="fp8-gate_up_scale-rows"),
    pytest.param("fp8-block", lambda x: x.update(down_scale=torch.ones(5, 160, 3)), "down_scale must be fp32",
                 id="fp8-down_scale-groups"),
    pytest.param("fp8-static", lambda x: x.update(down_input_scale=None), "given together", id="fp8-one-input-scale"),
    pytest.param("fp8-static", lambda x: x.update(gate_up_input_scale=torch.ones(4)),
                 "gate_up_input_scale must be fp32 [E=5]", id="fp8-input-scale-shape"),
    pytest.param("fp8-channel", lambda x: x.update(gate_up=x["gate_up"].float()), "gate_up must be float8_e4m3fn",
                 id="fp8-16bit-weight"),
    pytest.param("int4-g32", lambda x: x.update(down_scale=x["down_scale"][..., :1]), "down_scale must be",
                 id="int4-down_scale-groups"),
    pytest.param("int4-g32", lambda x: x.update(gate_up=x["gate_up"][:, :, :3]), "gate_up must be uint8",
                 id="int4-packed-width"),
    pytest.param("int4-g32", lambda x: x.update(group_size=31), "group_size must be an even int", id="int4-odd-group"),
]


@pytest.mark.parametrize("form,edit,message", BAD)
def test_bad_input_is_one_line(form, edit, message):
    with pytest.raises(ValueError) as info:
        _bad(form, edit)
    text = str(info.value)
    assert message in text and "\n" not in text, text
