"""The CPU references inside pluginHostTest (plugins/tests/reference.cpp), compiled with g++ into a
small shared library once per process and called through ctypes: the `host` implementation of the
contract suites (tests/ops), so that a host-test failure on the GPU means the kernel or the
plugin is wrong, not the test."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

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


def _cuda_include() -> Path | None:
    nvcc = shutil.which("nvcc")
    candidates = [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    if nvcc:
        candidates.append(Path(nvcc).resolve().parents[1] / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda_fp16.h").is_file()), None)


def missing() -> str | None:
    """Why the library cannot be built here, or None."""
    if shutil.which("g++") is None or _cuda_include() is None:
        return "needs g++ and a CUDA toolkit (cuda_fp16.h) to compile plugins/tests/reference.cpp"
    return None


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The compiled reference library (built once per process, in a temporary folder)."""
    folder = Path(tempfile.mkdtemp(prefix="gdn-hostref-"))
    (folder / "shim.cpp").write_text(_SHIM)
    lib = folder / "libhostref.so"
    subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-pthread", f"-I{PLUGINS_SRC / 'tests'}",
                    f"-I{_cuda_include()}", str(PLUGINS_SRC / "tests" / "reference.cpp"), str(folder / "shim.cpp"),
                    "-o", str(lib)], check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _f32(t) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().float().numpy(), dtype=np.float32)


def gated_delta_rule(q, k, v, g, beta, s0, scale, use_qk_l2norm):
    """q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv], s0 [B, Hv, Dk, Dv] (fp32 copies are
    passed) -> (o [B, T, Hv, Dv], final_state [B, Hv, Dk, Dv]) as float64 numpy arrays."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2:]
    arrays = [_f32(t) for t in (q, k, v, g, beta, s0)]
    o = np.full((B, T, Hv, Dv), np.nan)
    s = np.full((B, Hv, Dk, Dv), np.nan)
    library().gdrRef(B, T, Hk, Hv, Dk, Dv, *(_ptr(a) for a in arrays), ctypes.c_float(scale), int(use_qk_l2norm),
                     _ptr(o), _ptr(s))
    return o, s


def causal_conv1d(x, w, b, s0, silu, lens=None):
    """x [B, T, C], w [C, K], b [C], s0 [B, C, K-1], lens [B] int or None -> (y [B, T, C],
    new_state [B, C, K-1]) as float64 numpy arrays."""
    B, T, C = x.shape
    K = w.shape[1]
    arrays = [_f32(t) for t in (x, w, b, s0)]
    lens_arr = None if lens is None else np.ascontiguousarray(lens.cpu().numpy(), dtype=np.int32)
    y = np.full((B, T, C), np.nan)
    s = np.full((B, C, K - 1), np.nan)
    library().convRef(B, T, C, K, *(_ptr(a) for a in arrays), None if lens_arr is None else _ptr(lens_arr),
                      int(silu), _ptr(y), _ptr(s))
    return y, s
