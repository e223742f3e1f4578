"""What tests/gpu_run.sh relies on, checked without a GPU: tests/triton_compiles.py (processes
compiling one kernel specialization for sm_90 at once compile it once, the others wait and load it
from the shared cache; each call is logged and summarised) and tests/conftest.py's order of the
GPU run's worker slices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]
COMPILE = r"""
import sys
sys.path.insert(0, {repo!r})
from tests.triton_compiles import install
assert install()
import triton, triton.language as tl
import triton.compiler as compiler
from triton.backends.compiler import GPUTarget

@triton.jit
def double(x, y, n, B: tl.constexpr):
    o = tl.arange(0, B)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)

src = compiler.ASTSource(fn=double, signature={{"x": "*fp32", "y": "*fp32", "n": "i32", "B": "constexpr"}},
                         constexprs={{"B": int(sys.argv[1])}})
compiler.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
"""


def _run(tmp_path, blocks):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), GDN_TRITON_LOG=str(tmp_path / "log.tsv"),
               TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    script = tmp_path / "compile_double.py"  # triton.jit reads the kernel's source file
    script.write_text(COMPILE.format(repo=str(REPO)))
    procs = [subprocess.Popen([sys.executable, str(script), str(b)], env=env, stderr=subprocess.PIPE, text=True)
             for b in blocks]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    return [line.rstrip("\n").split("\t") for line in (tmp_path / "log.tsv").read_text().splitlines()]


def test_concurrent_compiles_of_one_specialization_compile_once(tmp_path):
    rows = _run(tmp_path, [64, 64, 64, 128])
    assert len(rows) == 4 and {r[1] for r in rows} == {"double"}
    by_key = {}
    for pid, name, key, wait, secs, hit, spec in rows:
        by_key.setdefault(key, []).append((hit, spec, float(wait)))
    assert sorted(len(v) for v in by_key.values()) == [1, 3]
    three = next(v for v in by_key.values() if len(v) == 3)
    assert sorted(h for h, _, _ in three) == ["0", "1", "1"]  # one compile, two loads of its cache entry
    assert {s for _, s, _ in three} == {"B=64"}

    from tests.triton_compiles import summarize

    text = summarize(str(tmp_path / "log.tsv"))
    assert text.startswith("triton: 4 compile calls, 2 compiled (2 keys)") and "double" in text


def test_each_gpu_worker_slice_ends_with_the_build_waiting_tests():
    """tests/conftest.py's GPU order for --dist worksteal (worker i takes the i-th equal slice):
    every slice holds its share of both kinds, the tests that wait for a build last."""
    from tests.conftest import _each_worker_builds_last

    class Item:
        def __init__(self, name, waits):
            self.name, self.fixturenames = name, ["plugin_build"] if waits == "plugin" else []
            self._ext = waits == "ext"

        def get_closest_marker(self, name):
            return self._ext if name == "cuda_ext" else None

    items = [Item(f"t{i}", None) for i in range(9)] + [Item("e1", "ext"), Item("e2", "ext"), Item("p1", "plugin")]
    order = _each_worker_builds_last(items, 3)
    assert sorted(i.name for i in order) == sorted(i.name for i in items)
    slices = [order[0:4], order[4:8], order[8:12]]
    assert [[i.name for i in s] for s in slices] == [["t0", "t1", "t2", "e1"], ["t3", "t4", "t5", "e2"],
                                                     ["t6", "t7", "t8", "p1"]]
