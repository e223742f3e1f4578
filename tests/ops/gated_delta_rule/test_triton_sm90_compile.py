"""The chunked prefill's Triton kernels compile for sm_90 as their launchers launch them (no GPU): the
interpreter runs only the taken branches with widened dot operands, so a dtype mismatch in a branch
that a constexpr leaves dead (fp32 halves met a bf16 tile after wy.py's INVERSE return on the H100)
passes every CPU test and fails the first GPU launch. tests/sm90_launch_compile.py records each
launch of the launchers on meta tensors and compiles it with triton.compile for sm_90."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[3]


# the 16-bit forms the GPU runs (raw tensor-core operands, packed and not); the fp32 cases
# (`python tests/sm90_launch_compile.py` runs every case) take ~20 s each to compile here
@pytest.mark.parametrize("case", ["gdn-fused-bf16-D128", "gdn-fused-fp16-D64-varlen", "gdn-two-pass-fp16-D64-varlen"])
def test_chunk_kernels_compile_for_sm90_as_launched(case, tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(REPO / "tests" / "sm90_launch_compile.py"), case], env=env,
                       capture_output=True, text=True, timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith((case, "FAIL"))]
    assert r.returncode == 0, "\n".join(lines) or r.stderr[-2000:]
    kernels = {line.split()[2] for line in lines}
    want = {"chunk_wy_fwd_kernel", "chunk_fused_fwd_kernel" if "fused" in case else "chunk_state_output_fwd_kernel"}
    assert kernels == want, lines
