"""The CPU references inside pluginHostTest (plugins/tests/reference.cpp) agree with the golden
references in gdn_export/ops/*/naive.py, so that a host-test failure on the GPU means the kernel
or the plugin is wrong, not the test. reference.cpp is compiled here with g++ into a small shared
library and called through ctypes."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from gdn_export.ops.causal_conv1d.naive import causal_conv1d
from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import gdn_inputs
from tests.plugins.cmake_build import PLUGINS_SRC

_SHIM = r"""
#include "reference.h"
#include <vector>
using namespace gdn::test;
static std::vector<float> vec(const float* p, size_t n) { return std::vector<float>(p, p + n); }
extern "C" void gdrRef(int B, int T, int Hk, int Hv, int Dk, int Dv, const float* q, const float* k,
    const float* v, const float* g, const float* beta, const float* s0, float scale, int l2, double* o, double* s)
{
    GdrShape sh{B, T, Hk, Hv, Dk, Dv};
    size_t nqk = (size_t)B * T * Hk * Dk, nv = (size_t)B * T * Hv * Dv, ng = (size_t)B * T * Hv;
    size_t ns = (size_t)B * Hv * Dk * Dv;
    std::vector<double> oo, ss;
    gatedDeltaRuleReference(sh, vec(q, nqk), vec(k, nqk), vec(v, nv), vec(g, ng), vec(beta, ng), vec(s0, ns),
        scale, l2 != 0, oo, ss, 2);
    std::copy(oo.begin(), oo.end(), o);
    std::copy(ss.begin(), ss.end(), s);
}
extern "C" void convRef(int B, int T, int C, int K, const float* x, const float* w, const float* b,
    const float* s0, const int* lens, int silu, double* y, double* s)
{
    std::vector<double> yy, ss;
    std::vector<int32_t> ll = lens ? std::vector<int32_t>(lens, lens + B) : std::vector<int32_t>();
    causalConv1dReference(B, T, C, K, vec(x, (size_t)B * T * C), vec(w, (size_t)C * K), vec(b, C),
        vec(s0, (size_t)B * C * (K - 1)), ll, silu != 0, yy, ss);
    std::copy(yy.begin(), yy.end(), y);
    std::copy(ss.begin(), ss.end(), s);
}
"""


@pytest.fixture(scope="module")
def reference_lib(tmp_path_factory):
    nvcc = shutil.which("nvcc")
    candidates = [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    if nvcc:
        candidates.append(Path(nvcc).resolve().parents[1] / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    cuda_include = next((c for c in candidates if (c / "cuda_fp16.h").is_file()), None)
    if shutil.which("g++") is None or cuda_include is None:
        pytest.skip("needs g++ and a CUDA toolkit (cuda_fp16.h) to compile plugins/tests/reference.cpp")
    folder = tmp_path_factory.mktemp("hostref")
    (folder / "shim.cpp").write_text(_SHIM)
    lib = folder / "libhostref.so"
    subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-pthread", f"-I{PLUGINS_SRC / 'tests'}",
                    f"-I{cuda_include}", str(PLUGINS_SRC / "tests" / "reference.cpp"), str(folder / "shim.cpp"),
                    "-o", str(lib)], check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv,l2", [
    (1, 1, 1, 1, 16, 16, True),
    (2, 65, 2, 4, 16, 24, True),
    (1, 33, 1, 3, 24, 8, False),
], ids=["decode", "prefill-Hv2Hk-DkneDv", "no-l2norm-Hv3Hk"])
def test_gated_delta_rule_reference_matches_naive(reference_lib, B, T, Hk, Hv, Dk, Dv, l2):
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, seed=7)
    if not l2:
        x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    scale = Dk ** -0.5
    o_ref, s_ref = recurrent_gated_delta_rule(*(x[n].double() for n in ("q", "k", "v", "g", "beta", "initial_state")),
                                              scale=scale, use_qk_l2norm=l2)
    arrays = [np.ascontiguousarray(x[n].numpy(), dtype=np.float32) for n in ("q", "k", "v", "g", "beta",
                                                                              "initial_state")]
    o = np.full((B, T, Hv, Dv), np.nan)
    s = np.full((B, Hv, Dk, Dv), np.nan)
    reference_lib.gdrRef(B, T, Hk, Hv, Dk, Dv, *(_ptr(a) for a in arrays), ctypes.c_float(scale), int(l2),
                         _ptr(o), _ptr(s))
    np.testing.assert_allclose(o, o_ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, s_ref.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("B,T,C,K,silu,lens", [(1, 1, 8, 4, True, None), (3, 17, 5, 3, False, None),
                                               (2, 2, 4, 2, True, None), (3, 17, 5, 4, True, [17, 0, 9]),
                                               (3, 1, 7, 3, False, [0, 1, 0])],
                         ids=["decode", "prefill-odd-C", "T-less-than-K-1", "ragged", "ragged-decode"])
def test_causal_conv1d_reference_matches_naive(reference_lib, B, T, C, K, silu, lens):
    gen = torch.Generator().manual_seed(3)
    x, w, b, s0 = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                   for shape in ((B, T, C), (C, K), (C,), (B, C, K - 1)))
    seq_lens = None if lens is None else torch.tensor(lens, dtype=torch.int32)
    y_ref, s_ref = causal_conv1d(x, w, b, s0, silu=silu, seq_lens=seq_lens)
    arrays = [np.ascontiguousarray(t.numpy(), dtype=np.float32) for t in (x, w, b, s0)]
    lens_arr = None if lens is None else np.ascontiguousarray(lens, dtype=np.int32)  # kept alive for the call
    lens_arg = None if lens_arr is None else _ptr(lens_arr)
    y = np.full((B, T, C), np.nan)
    s = np.full((B, C, K - 1), np.nan)
    reference_lib.convRef(B, T, C, K, *(_ptr(a) for a in arrays), lens_arg, int(silu), _ptr(y), _ptr(s))
    np.testing.assert_allclose(y, y_ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, s_ref.numpy(), rtol=1e-5, atol=1e-6)
