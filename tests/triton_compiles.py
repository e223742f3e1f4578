"""Triton compiles shared by the pytest-xdist workers of a GPU run (tests/gpu_run.sh).

Workers that need the same kernel specialization at the same time would each compile it (Triton's
on-disk cache is filled only when a compile ends): `install()` wraps `triton.compiler.compile` so that
one process compiles a specialization under a file lock named by its key while the others wait, then
load it from the shared cache (TRITON_CACHE_DIR). With GDN_TRITON_LOG=FILE every compile call appends
one line: pid, kernel, key, seconds waited for the lock, seconds compiling (or loading), cache hit,
the constexpr arguments.

Installed by tests/conftest.py in every process that has a GPU; a no-op without Triton.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time

_local = threading.local()


def _key(src, target, options) -> str:
    try:
        ident = src.hash()  # ASTSource / IRSource: the function, signature, constexprs, attributes
    except Exception:  # noqa: BLE001 - an unknown source type: its text is the identity
        ident = repr(src)
    opts = sorted((options or {}).items())
    return hashlib.sha256(f"{ident}|{target}|{opts}".encode()).hexdigest()[:24]


def install() -> bool:
    """Wrap triton.compiler.compile (once per process); True when it is wrapped."""
    try:
        import triton
        import triton.compiler as compiler
    except ImportError:
        return False
    real = compiler.compile
    if getattr(real, "_gdn_shared", False):
        return True
    cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    locks = os.path.join(cache, "gdn-locks")
    os.makedirs(locks, exist_ok=True)
    log = os.environ.get("GDN_TRITON_LOG")

    knobs = getattr(getattr(triton, "knobs", None), "compilation", None)
    if knobs is not None and hasattr(knobs, "listener") and knobs.listener is None:
        def listener(*, cache_hit, **_):
            _local.hit = cache_hit
        knobs.listener = listener

    def compile(src, target=None, options=None, *args, **kwargs):
        key = _key(src, target, options)
        t0 = time.perf_counter()
        with open(os.path.join(locks, key), "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            t1 = time.perf_counter()
            _local.hit = None
            try:
                return real(src, target, options, *args, **kwargs)
            finally:
                t2 = time.perf_counter()
                if log:
                    hit = _local.hit
                    try:
                        names = getattr(getattr(src, "fn", None), "arg_names", ())
                        spec = " ".join(f"{names[k[0]] if len(k) == 1 and k[0] < len(names) else k}={v}"
                                        for k, v in sorted((getattr(src, "constants", None) or {}).items()))
                    except Exception:  # noqa: BLE001 - another Triton's source layout: no constexprs logged
                        spec = ""
                    line = (f"{os.getpid()}\t{getattr(src, 'name', '?')}\t{key}\t{t1 - t0:.2f}\t{t2 - t1:.2f}\t"
                            f"{'?' if hit is None else int(bool(hit))}\t{spec}\n")
                    with open(log, "a") as out:
                        out.write(line)

    compile._gdn_shared = True
    compiler.compile = compile
    return True


def summarize(path: str, top: int = 15) -> str:
    """A few lines on a GDN_TRITON_LOG file: compiles, cache hits, seconds compiling and waiting,
    the kernels that cost most."""
    rows = []
    with open(path) as f:
        for line in f:
            pid, name, key, wait, secs, hit = line.rstrip("\n").split("\t")[:6]
            rows.append((pid, name, key, float(wait), float(secs), hit))
    compiled = [r for r in rows if r[5] == "0" or (r[5] == "?" and r[4] >= 0.5)]
    by_name: dict[str, list[float]] = {}
    for r in compiled:
        by_name.setdefault(r[1], []).append(r[4])
    out = [f"triton: {len(rows)} compile calls, {len(compiled)} compiled ({len({r[2] for r in compiled})} keys), "
           f"{sum(r[4] for r in compiled):.0f} s compiling, {sum(r[3] for r in rows):.0f} s waiting on another "
           f"process's compile, {len({r[0] for r in rows})} processes"]
    for name, secs in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
        out.append(f"  {sum(secs):7.1f} s  {len(secs):4d} x  max {max(secs):5.1f} s  {name}")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    print(summarize(sys.argv[1]))
