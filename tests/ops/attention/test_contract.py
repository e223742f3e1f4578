"""gdn::attention and the K/V cache write, held by every implementation (impls.py) on every case that
applies (cases.py): ids are `impl-case-dtype` (write: `impl-case-cachedtype-indexdtype`).

`pytest tests/ops/attention -k triton-prefill` runs one implementation; `-m gpu` the GPU ones
(skipped with the reason on a machine without CUDA); `-m "not slow"` leaves out the cases Triton's
interpreter takes seconds for on a CPU.
"""

from dataclasses import replace

import pytest
import torch

from tests.ops.attention.cases import (CASES, HALF, WRITE_CASES, WRITE_DTYPES, check, make_inputs,
                                             make_write_inputs, oracle, write_check, write_oracle)
from tests.ops.attention.impls import ATTENTION, WRITE
from tests.ops.impl import params

# The Triton kernels take 16-bit inputs only: their params come from the cases' 16-bit dtypes (under
# the interpreter one of the two per case, alternating; both on a GPU).
_KERNELS = [i for i in ATTENTION if i.kind == "triton"]
_HALF_CASES = [replace(c, dtypes=tuple(d for d in c.dtypes if d in HALF)) for c in CASES if set(c.dtypes) & set(HALF)]


@pytest.mark.parametrize("impl,case,dtype",
                         params([i for i in ATTENTION if i.kind != "triton"], CASES, None, cost=lambda c: c.cost)
                         + params(_KERNELS, _HALF_CASES, None, cost=lambda c: c.cost))
def test_attention_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    x = make_inputs(case, dtype, impl.device, poison_unread=impl.extra.get("skips_unread", False))
    want = oracle(case, x)
    check(case, dtype, impl.run(x, case), x, want)


INDEX = {"i64": torch.int64, "i32": torch.int32}


def _write_params():
    """Every (cache dtype, update dtype) per case, int64 and int32 indices in turn over the cases; on
    a GPU both. Under Triton's interpreter all eight combinations of the cases of up to 100 programs,
    one in turn of the larger ones."""
    combos = [(d, i) for d in WRITE_DTYPES for i in INDEX]
    out = []
    for impl in WRITE:
        for n, case in enumerate(WRITE_CASES):
            if impl.interpreted:  # all eight for up to 100 programs (the rest marked slow), else one
                chosen = combos if case.B * case.Hkv * case.S <= 100 else [combos[n % len(combos)]]
            elif impl.device == "cuda":
                chosen = combos
            else:  # ONNX's TensorScatter takes int64 indices only
                chosen = [(d, "i64" if impl.kind == "onnx" else list(INDEX)[n % 2]) for d in WRITE_DTYPES]
            for dname, iname in chosen:
                dtypes, index_dtype = WRITE_DTYPES[dname], INDEX[iname]
                if impl.supports(case, dtypes, index_dtype):
                    # interpreted: one combination per case may be in the fast tier, the others are slow
                    turn = not impl.interpreted or (dname, iname) == combos[n % len(combos)]
                    out.append(pytest.param(impl, case, dtypes, index_dtype,
                                            id=f"{impl.name}-{case.name}-{dname}-{iname}",
                                            marks=impl.marks(case.cost) if turn else [pytest.mark.slow]))
    return out


@pytest.mark.parametrize("impl,case,dtypes,index_dtype", _write_params())
def test_kv_write_equals_a_loop(impl, case, dtypes, index_dtype):
    impl.skip_if_unavailable()
    x = make_write_inputs(case, dtypes, index_dtype, impl.device)
    want = write_oracle(case, x)
    given = {n: x[n] for n in ("key_cache", "value_cache")}
    got = impl.run(x, case)
    if impl.extra.get("inplace"):
        assert all(got[n] is given[n] for n in given), "the in-place write did not return the caches it was given"
    write_check(case, got, want)
