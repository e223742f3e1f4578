"""Shared test helpers: fresh random inputs, NaN poisoning and relative-RMS closeness."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

import pytest
import torch

from tests.triton_interpreter import interpret_without_gpu

# Triton's interpreter is chosen when a kernel is defined (the language's own jit functions included,
# at `import triton`): TRITON_INTERPRET is set here, before any test imports Triton, so that a subset
# of the suite runs the kernels as the whole suite does (CPU-only machines; with a GPU they run on it).
interpret_without_gpu()

# pytest-xdist workers share the CPU cores: one intra-op thread each, or torch's OpenMP threads spin
# against each other (a token-by-token loop of small ops ran ~20x slower with 2 threads a worker on 2
# cores). GDN_TEST_THREADS overrides.
# ONNX Runtime sessions likewise: as many intra-op threads, and no spin-waiting between runs (the
# CPU contract and ORT runner tests took ~10-20% less wall time on 2 cores with 2 workers).
_THREADS = (int(os.environ["GDN_TEST_THREADS"]) if os.environ.get("GDN_TEST_THREADS") else
            max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
            if os.environ.get("PYTEST_XDIST_WORKER_COUNT") else None)
if _THREADS is not None:
    import onnxruntime as ort

    torch.set_num_threads(_THREADS)
    # inductor (torch.compile on the CPU) compiles in the worker itself, not in a pool of one
    # process per core started for the first compile (~7 CPU-seconds a worker on 2 cores).
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(_THREADS))

    class _SharedCoresSession(ort.InferenceSession):
        def __init__(self, path_or_bytes, sess_options=None, *args, **kwargs):
            options = sess_options if sess_options is not None else ort.SessionOptions()
            if options.intra_op_num_threads == 0:  # 0: ONNX Runtime's default, one per core
                options.intra_op_num_threads = _THREADS
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            super().__init__(path_or_bytes, options, *args, **kwargs)

    ort.InferenceSession = _SharedCoresSession


# The stamped export's trace cache (gdn_export.onnx.trace_cache): one folder for every worker and
# session on this machine (its keys hash gdn_export's sources), not the user's ~/.cache.
os.environ.setdefault("GDN_EXPORT_CACHE", os.path.join(tempfile.gettempdir(), "gdn-export-trace-cache"))

if os.environ.get("GDN_EXPORT_LOG"):  # where the suite's time goes: one line per whole-model trace
    import hashlib

    import gdn_export.onnx.export as _export

    _run_exporter = _export.run_exporter

    def _logged_run_exporter(model, args, *rest, **kwargs):
        digest = hashlib.sha256(repr((type(model).__name__, getattr(model, "config", None),
                                      getattr(model, "layout", None), rest[-1:], kwargs)).encode())
        for t in list(model.state_dict().values()) + [a for a in args if isinstance(a, torch.Tensor)]:
            digest.update(str((t.dtype, tuple(t.shape))).encode())
            digest.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()[:4096])
        t0 = time.perf_counter()
        try:
            return _run_exporter(model, args, *rest, **kwargs)
        finally:
            with open(os.environ["GDN_EXPORT_LOG"], "a") as f:
                f.write(f"{time.perf_counter() - t0:.2f}\t{digest.hexdigest()[:16]}\t"
                        f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\n")

    _export.run_exporter = _logged_run_exporter

if torch.cuda.is_available():  # one compile per Triton kernel specialization across the workers
    from tests.triton_compiles import install as _share_triton_compiles

    _share_triton_compiles()


def pytest_configure(config):
    """In the controlling process: note when the session began (tests/plugins/cmake_build.py reads
    it) and, for a run of the whole suite, start the plugin build beside the first tests."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller did this
        return
    os.environ.setdefault("GDN_TEST_SESSION_START", str(time.time()))
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if whole_suite and config.option.markexpr.strip() != "gpu":
        from tests.plugins.cmake_build import start_background_build

        start_background_build()


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        from tests.plugins.cmake_build import stop_builds

        stop_builds()


def pytest_runtest_logreport(report):
    """GDN_TEST_LOG=FILE: one line per test phase that failed or took time, as it ends (outcome,
    seconds, id; a failure's traceback after it), so that a run cut by a time limit still says where
    its time went and why its failures failed (tests/gpu_run.sh sets it). In the controlling
    process only: pytest-xdist reports every worker's results there."""
    path = os.environ.get("GDN_TEST_LOG")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when != "call" and report.passed and report.duration < 1:
        return
    line = f"{report.outcome}\t{report.duration:.2f}\t{report.when}\t{report.nodeid}\n"
    if report.failed:
        line += "".join(f"    {text}\n" for text in str(report.longreprtext)[-4000:].splitlines())
    with open(path, "a") as f:
        f.write(line)


def pytest_collection_modifyitems(config, items):
    """The tests that need a build last, by when it is ready (it compiles beside the others): the
    plugin library's, and on a GPU the CUDA extension's (tests/gpu_run.sh starts it first: on the H200
    ~7 of 12 workers waited 60-110 s for it when its tests came early); before them the fast tier
    first, then the tests marked slow, so that a failure shows early under -x. Stable otherwise."""
    if torch.cuda.is_available():  # the CUDA kernels' tests: tests/ops/<op>/test_cuda*.py
        here = os.path.join(os.path.dirname(__file__), "ops")
        for item in items:
            path = str(item.fspath)
            if path.startswith(here + os.sep) and os.path.basename(path).startswith("test_cuda"):
                item.add_marker(pytest.mark.cuda_ext)
    items.sort(key=lambda item: ("plugin_build" in getattr(item, "fixturenames", ()),
                                 item.get_closest_marker("cuda_ext") is not None,
                                 item.get_closest_marker("slow") is not None))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if torch.cuda.is_available() and workers > 1:
        items[:] = _each_worker_builds_last(items, workers)


def _each_worker_builds_last(items, workers):
    """The GPU run's order for `--dist worksteal`, which gives worker i the i-th of `workers` equal
    contiguous slices of the list: each slice holds a contiguous run of the tests that need no build
    (neighbours share Triton kernel specializations, compiled once) and then a run of those that wait
    for the CUDA extension or the plugin library, so that every worker compiles Triton kernels while
    the builds run instead of the last workers starting on them."""
    def waits(item):
        return bool(item.get_closest_marker("cuda_ext")) or "plugin_build" in getattr(item, "fixturenames", ())

    later = [i for i in items if waits(i)]
    first = [i for i in items if not waits(i)]

    def chunks(seq):
        return [seq[len(seq) * w // workers:len(seq) * (w + 1) // workers] for w in range(workers)]

    return [item for a, b in zip(chunks(first), chunks(later)) for item in a + b]


# Relative RMS bound per dtype for fast paths against the fp32 reference.
RMS_BOUND = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}

# The activation dtypes every fast path supports, with readable ids.
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]

# Module-level marks of GPU-only test files: `pytestmark = GPU_ONLY`.
GPU_ONLY = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)"),
]


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64; inf if actual has a NaN."""
    a, e = actual.double(), expected.double()
    if torch.isnan(a).any():
        return float("inf")
    return ((a - e).norm() / e.norm().clamp_min(1e-30)).item()


def assert_close_rms(actual, expected, dtype, name="output"):
    err = rel_rms(actual, expected)
    bound = RMS_BOUND[dtype]
    assert err <= bound, f"{name}: relative RMS {err:.3g} > {bound:g} ({dtype})"


@contextlib.contextmanager
def fp32_products(device):
    """IEEE fp32 matrix products inside the block on a CUDA `device` (float32 matmul precision
    "highest": no TF32), for fp32 references run on the GPU; nothing to change on the CPU."""
    if torch.device(device).type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=torch.float32, device="cpu", state=True, seed=None,
               correlated=False):
    """Fresh random gated-delta-rule inputs in the op's layout (never zeros).

    correlated: keys as a model makes them (SiLU of the conv output: all positive, so after the L2
    norm neighbouring keys have cosines near 1), with strong writes (beta ~ 0.9) and slow decay.
    That makes I + A of the WY form hard to invert: products of powers of A lose everything there,
    while independent Gaussian keys (cosines ~ Dk^-1/2) hide the problem.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = rnd(B, T, Hk, Dk), rnd(B, T, Hk, Dk)
    v = rnd(B, T, Hv, Dv)
    g = -torch.nn.functional.softplus(rnd(B, T, Hv)) * 0.5  # log decay <= 0
    beta = torch.sigmoid(rnd(B, T, Hv))
    if correlated:
        k = torch.nn.functional.silu(k + 4 * rnd(1, 1, Hk, Dk))
        g = g * 0.02
        beta = torch.sigmoid(rnd(B, T, Hv) + 2.5)
    s0 = rnd(B, Hv, Dk, Dv) * 0.1 if state else None
    cast = lambda x: x.to(device=device, dtype=dtype)  # noqa: E731
    out = dict(q=cast(q), k=cast(k), v=cast(v), g=g.to(device), beta=cast(beta))
    out["initial_state"] = None if s0 is None else s0.to(device)
    return out


if torch.cuda.is_available():
    @pytest.fixture(autouse=True)
    def _gpu_memory(request):
        """Several pytest-xdist workers share one GPU: a big_gpu_memory test first takes a slot
        (_gpu_memory_slot); every test gives the caching allocator's blocks and the spill stack back
        after it."""
        slot = _gpu_memory_slot() if request.node.get_closest_marker("big_gpu_memory") else None
        try:
            yield
        finally:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
                _shrink_local_memory()
            if slot is not None:
                slot.close()  # releases the lock

    def _shrink_local_memory():
        """Set the context's per-thread stack back to CUDA's default 1 KB. The driver grows it for a
        kernel that spills (fp32 Triton kernels: 4-13 KB a thread) and keeps it: 13 KB for each of
        the 132 x 2048 resident threads of an H100 / H200 is 3.4 GiB held by every worker that ever
        ran one (14 workers on an 80 GB H100 ran out of memory)."""
        import ctypes

        try:
            ctypes.CDLL("libcuda.so.1").cuCtxSetLimit(ctypes.c_int(0), ctypes.c_size_t(1024))  # CU_LIMIT_STACK_SIZE
        except OSError:
            pass

    def _gpu_memory_slot():
        """One of the card's slots for big_gpu_memory tests (real-size MoE experts: up to ~8 GiB each,
        inputs, copies and the reference together), a file lock shared by every process of this user:
        one slot per 24 GiB of the card (an H100: 3, an H200: 5), leaving the rest to the other
        workers' contexts and tests (14 workers on an 80 GB H100 ran out of memory without)."""
        import fcntl
        import tempfile

        slots = max(1, int(torch.cuda.get_device_properties(0).total_memory / 2**30) // 24)
        folder = os.path.join(tempfile.gettempdir(), f"gdn-gpu-memory-slots-{os.getuid()}")
        os.makedirs(folder, exist_ok=True)
        while True:
            for i in range(slots):
                f = open(os.path.join(folder, str(i)), "w")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return f
                except BlockingIOError:
                    f.close()
            time.sleep(0.05)


@pytest.fixture
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none found)")
    return torch.device("cuda")
