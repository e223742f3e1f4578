"""The backend registry: GPU-only backends given CPU tensors fail in one line that says what to do
(never a Triton compile error or a CUDA extension build), and Triton's interpreter stays usable."""

from __future__ import annotations

import pytest
import torch

from gdn_export.errors import GdnExportError
from gdn_export.ops import backends, causal_conv1d, gated_delta_rule
from gdn_export.ops.gated_delta_rule import gated_delta_rule_
from tests.conftest import gdn_inputs

TRITON_MESSAGE = ("gdn backend 'triton' needs CUDA tensors (got cpu); use the reference backend or "
                  "set TRITON_INTERPRET=1")
CUDA_MESSAGE = "gdn backend 'cuda' needs CUDA tensors (got cpu); use the reference backend"


def _run_gdr():
    x = gdn_inputs(1, 3, 2, 4, 16, 8)
    return gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"])


def _run_conv():
    return causal_conv1d(torch.randn(2, 5, 6), torch.randn(6, 4), torch.randn(6), torch.randn(2, 6, 3))


def _pick(how, name, monkeypatch):
    """Select backend `name` through the environment variable or a use_backend block."""
    if how == "env":
        monkeypatch.setenv(backends.ENV_VAR, name)
        return backends.use_backend(backends.current_name())  # a no-op block on the same backend
    monkeypatch.delenv(backends.ENV_VAR, raising=False)
    return backends.use_backend(name)


@pytest.mark.parametrize("how", ["env", "use_backend"])
@pytest.mark.parametrize("op", [_run_gdr, _run_conv], ids=["gated_delta_rule", "causal_conv1d"])
@pytest.mark.parametrize("name,message", [("triton", TRITON_MESSAGE), ("cuda", CUDA_MESSAGE)],
                         ids=["triton", "cuda"])
def test_gpu_backend_with_cpu_tensors_is_one_line(monkeypatch, how, op, name, message):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with _pick(how, name, monkeypatch), pytest.raises(GdnExportError) as info:
        op()
    assert str(info.value) == message


@pytest.mark.parametrize("value,raises", [("1", False), ("0", True)], ids=["interpret", "compiled"])
def test_triton_interpreter_accepts_cpu_tensors(monkeypatch, value, raises):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", value)
    if raises:
        with pytest.raises(GdnExportError, match="TRITON_INTERPRET=1"):
            backends.check_device("triton", torch.device("cpu"))
    else:
        backends.check_device("triton", torch.device("cpu"))
    with pytest.raises(GdnExportError, match="'cuda' needs CUDA tensors"):
        backends.check_device("cuda", torch.device("cpu"))  # no interpreter for our CUDA kernels


@pytest.mark.parametrize("name", ["reference", "triton", "cuda"])
def test_cuda_tensors_pass_every_backend(monkeypatch, name):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    backends.check_device(name, torch.device("cuda", 0))  # only the device type is looked at


def test_reference_backend_takes_cpu_tensors():
    backends.check_device("reference", torch.device("cpu"))


def test_reference_backend_runs_on_cpu_under_the_same_check(monkeypatch):
    monkeypatch.setenv(backends.ENV_VAR, "reference")
    o, state = _run_gdr()
    y, conv_state = _run_conv()
    assert o.shape == (1, 3, 4, 8) and state.shape == (1, 4, 16, 8) and state.dtype == torch.float32
    assert y.shape == (2, 5, 6) and conv_state.shape == (2, 6, 3)
    assert torch.isfinite(o).all() and torch.isfinite(y).all()


def test_ops_call_the_backend_directly_only_when_eager():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 3)
    assert backends.can_call_directly(x, None, x)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert not backends.can_call_directly(fake)  # a dispatch mode is active
    assert not backends.can_call_directly(mode.from_tensor(x))  # a tensor subclass
    seen = []

    @torch.compile(backend="eager", fullgraph=True)
    def traced(t):
        seen.append(backends.can_call_directly(t))
        return t + 1

    traced(x)
    assert seen == [False]


def test_eager_and_traced_calls_agree():
    """The direct eager path and the torch.ops path (what torch.compile / export see) give the same
    results, and tracing keeps the op as one node."""
    x = gdn_inputs(2, 5, 1, 2, 8, 8)
    eager = gated_delta_rule(**x, use_qk_l2norm=True)
    graphs = []

    def count_backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    fn = torch.compile(lambda **kw: gated_delta_rule(**kw, use_qk_l2norm=True), backend=count_backend,
                       fullgraph=True)
    traced = fn(**x)
    for a, b in zip(eager, traced):
        torch.testing.assert_close(a, b)
    assert any("gdn.gated_delta_rule" in str(n.target) for g in graphs for n in g.graph.nodes)
    c = torch.randn(2, 7, 6)
    w = torch.randn(6, 4)
    y_eager = causal_conv1d(c, w, None, torch.zeros(2, 6, 3))
    y_traced = torch.compile(causal_conv1d, backend="eager", fullgraph=True)(c, w, None, torch.zeros(2, 6, 3))
    for a, b in zip(y_eager, y_traced):
        torch.testing.assert_close(a, b)


def test_exporting_is_true_only_under_torch_export():
    """gdn_export.ops.backends.exporting picks the export-only paths (the functional K/V cache
    update): never in eager mode or inside torch.compile, always under torch.export."""
    from gdn_export.ops.backends import exporting

    class Probe(torch.nn.Module):
        def forward(self, x):
            return x + (1.0 if exporting() else 0.0)

    x = torch.zeros(1)
    assert Probe()(x).item() == 0.0
    assert torch.compile(Probe(), backend="eager")(x).item() == 0.0
    assert torch.export.export(Probe(), (x,)).module()(x).item() == 1.0


class _FastEntries:
    """A backend whose fast entries record their calls and decline when told to."""

    def __init__(self, decline):
        self.decline, self.calls = decline, []

    def fast(self, *args):
        self.calls.append(("fast", args[6], args[7]))
        return None if self.decline else ("o", "state")

    def inplace_fast(self, *args):
        self.calls.append(("inplace_fast", args[6], args[7]))
        return None if self.decline else "o"

    def checked(self, *args):
        self.calls.append(("checked",))
        return "checked-o", "checked-state"

    def checked_inplace(self, *args):
        self.calls.append(("checked_inplace",))
        return "checked-o"


@pytest.fixture
def fast_backend(monkeypatch):
    """Install a backend 'fastfake' with fast entries; tensors on the meta device stand in for CUDA
    ones (the fast entries are only looked up off the CPU)."""
    made = []

    def make(decline=False):
        impl = _FastEntries(decline)
        monkeypatch.setitem(backends._MODULES, "fastfake", "unused")
        monkeypatch.setitem(backends._LOADED, "fastfake", backends.Backend(
            "fastfake", impl.checked, None, None, impl.checked_inplace, impl.fast, impl.inplace_fast))
        made.append(impl)
        return impl

    return make


def _meta_inputs():
    return {k: t.to("meta") for k, t in gdn_inputs(1, 1, 2, 4, 16, 8).items()}


def test_eager_ops_take_the_fast_entry_with_the_resolved_scale(fast_backend):
    impl = fast_backend()
    x = _meta_inputs()
    with backends.use_backend("fastfake"):
        assert gated_delta_rule(**x, use_qk_l2norm=1) == ("o", "state")
        assert gated_delta_rule_(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], scale=0.5) == "o"
    assert impl.calls == [("fast", 16 ** -0.5, True), ("inplace_fast", 0.5, False)]


def test_a_declining_fast_entry_falls_back_to_the_checked_path(fast_backend):
    impl = fast_backend(decline=True)
    x = _meta_inputs()
    with backends.use_backend("fastfake"):
        assert gated_delta_rule(**x) == ("checked-o", "checked-state")
        gated_delta_rule_(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"])
    assert [c[0] for c in impl.calls] == ["fast", "checked", "inplace_fast", "checked_inplace"]


def test_fast_entries_are_skipped_on_cpu_and_with_a_state_dtype(fast_backend):
    impl = fast_backend()
    assert backends.loaded_for(torch.device("cpu")) is None
    x = _meta_inputs()
    with backends.use_backend("fastfake"):
        gated_delta_rule(**dict(x, initial_state=None), state_dtype=torch.float32)
    assert [c[0] for c in impl.calls] == ["checked"]
