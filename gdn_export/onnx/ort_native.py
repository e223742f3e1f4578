"""Prepare an exported graph for ONNX Runtime: native contrib kernels or standard-ONNX function bodies.

ONNX Runtime (>= 1.32) has kernels for the contrib ops com.microsoft.LinearAttention and
com.microsoft.CausalConvWithState (CPU: fp32 only; CUDA: fp32 / fp16 / bf16). Their attributes and
semantics are those of the opset-27 standard ops, so `prepare` rewrites, in memory:

    gdn form       gdn.GatedDeltaRule / gdn.CausalConv1d -> standard blocks (standard_ops.to_standard)
                   whose two ops are in com.microsoft
    standard form  the blocks' LinearAttention / CausalConvWithState moved to com.microsoft
    ort form       unchanged: its com.microsoft GatedDeltaNet / VarlenCausalConvWithState /
                   GatedRMSNorm run on ORT's kernels only (gdn_export.onnx.ort_form); an ORT whose
                   session providers register none of one of them is refused by name
                   (`check_runnable`, also before any loading)

The blocks cast every op input to fp32 (the gdn ops' math dtype), so the CPU kernels apply to fp32,
fp16 and bf16 graphs and to every recurrent state dtype alike. Where no kernel applies (the session's
first execution provider registers none, e.g. onnxruntime < 1.32, or a node's shapes are not static)
the graph runs through the function bodies (gdn_export.onnx.functions: a Loop over tokens, a K-tap
window), the standard form first rewritten back to gdn nodes (standard_ops.to_gdn). gdn.MoE always
runs through its function body (no ORT kernel of its semantics exists). The file is never changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from gdn_export.errors import GdnExportError
from gdn_export.onnx import standard_ops
from gdn_export.onnx.forms import MS_DOMAIN, ORT, STANDARD, form_of
from gdn_export.onnx.functions import attach_reference_functions

KERNELS = ("auto", "native", "functions")
NATIVE_OPS = (standard_ops.LINEAR_ATTENTION, standard_ops.CAUSAL_CONV)


@dataclass(frozen=True)
class OrtPlan:
    """What the session runs: `kernels` "native" or "functions", and a one-line `note` saying why."""

    model: onnx.ModelProto
    kernels: str
    note: str


def _provider_name(provider) -> str:
    return provider if isinstance(provider, str) else provider[0]


def missing_native_kernels(provider: str, ops=NATIVE_OPS) -> list[str]:
    """The com.microsoft `ops` that ONNX Runtime registers no `provider` kernel for."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    have = {k.op_name for k in C.get_all_opkernel_def() if k.domain == MS_DOMAIN and k.provider == provider}
    return [op for op in ops if op not in have]


def check_runnable(model: onnx.ModelProto, kernels: str = "auto", providers=("CPUExecutionProvider",)) -> None:
    """GdnExportError (one line) when ONNX Runtime cannot run `model` (graph only is enough) as
    asked: an ort-form file under --ort-kernels functions, or whose com.microsoft ops no provider of
    the session (`providers`, as InferenceSession takes them) has kernels for. Other forms always run
    (function bodies where kernels lack)."""
    if kernels not in KERNELS:
        raise GdnExportError(f"kernels {kernels!r}: choose one of {', '.join(KERNELS)}")
    if form_of(model) != ORT:
        return
    from gdn_export.onnx.ort_form import MIN_ORT_VERSION, OPS

    if kernels == "functions":
        raise GdnExportError(f"--ort-kernels functions: the file is the ort form (com.microsoft.{', '.join(OPS)}), "
                             f"which runs on ONNX Runtime's kernels only (export --onnx-ops gdn for function bodies)")
    names = [_provider_name(p) for p in providers]
    missing = set(OPS)
    for name in names:
        missing &= set(missing_native_kernels(name, OPS))
    if missing:
        import onnxruntime

        lacking = ", ".join(f"com.microsoft.{op}" for op in OPS if op in missing)
        need = min((MIN_ORT_VERSION.get(n, "1.32") for n in names), key=lambda v: tuple(map(int, v.split("."))))
        package = "onnxruntime-gpu" if "CUDAExecutionProvider" in names else "onnxruntime"
        raise GdnExportError(f"the file is the ort form, and onnxruntime {onnxruntime.__version__} has no "
                             f"{' / '.join(names)} kernel for {lacking}: it needs {package} >= {need}, or "
                             f"export the file with --onnx-ops gdn or standard")


def check_file(path, kernels: str = "auto", providers=("CPUExecutionProvider",)) -> None:
    """check_runnable on the graph of the file `path` (its weights are not read), as InputError
    naming the file: what the command line calls before its first progress line. A file that
    cannot be read passes (the runner then names the problem)."""
    from gdn_export.errors import InputError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - reported by the runner
        return
    try:
        check_runnable(model, kernels, providers)
    except GdnExportError as exc:
        raise InputError(f"{path}: {exc}") from None


def _ort_form_plan(model: onnx.ModelProto, providers) -> OrtPlan:
    from gdn_export.onnx.ort_form import OPS

    first = _provider_name(providers[0])
    elsewhere = missing_native_kernels(first, OPS)
    moe = any(n.op_type == "MoE" for n in model.graph.node)
    note = (f"ort form: native ORT kernels com.microsoft.{', '.join(OPS)}"
            + (f" ({', '.join(elsewhere)} not on {first}: on the next provider)" if elsewhere else "")
            + (" (MoE: function body)" if moe else ""))
    return OrtPlan(attach_reference_functions(model) if moe else model, "native", note)


def prepare(model: onnx.ModelProto, kernels: str = "auto", provider="CPUExecutionProvider",
            providers=None) -> OrtPlan:
    """The in-memory model ORT should load for `model` (any form), per `kernels`:
    "native" (GdnExportError when no kernel applies), "functions", or "auto" (native where it
    applies, else functions, the reason in the note). `providers`: the session's, in order
    (default: [provider]); the kernels of the first decide the gdn and standard forms, any of
    them serves the ort form (check_runnable)."""
    providers = list(providers) if providers is not None else [provider]
    provider = _provider_name(providers[0])
    check_runnable(model, kernels, providers)
    form = form_of(model)
    if form == ORT:
        return _ort_form_plan(model, providers)
    reason = None
    if kernels != "functions":
        missing = missing_native_kernels(provider)
        if missing:
            import onnxruntime

            reason = (f"onnxruntime {onnxruntime.__version__} has no {provider} kernel for "
                      f"com.microsoft.{', '.join(missing)}")
        else:
            try:
                if form == STANDARD:
                    native = standard_ops.retarget(model, MS_DOMAIN)
                else:
                    native = standard_ops.to_standard(model, domain=MS_DOMAIN)
            except GdnExportError as exc:
                reason = str(exc)
            else:
                moe = any(n.op_type == "MoE" for n in model.graph.node)
                note = ("native ORT kernels: com.microsoft.LinearAttention, CausalConvWithState"
                        + (" (MoE: function body)" if moe else ""))
                return OrtPlan(attach_reference_functions(native), "native", note)
        if kernels == "native":
            raise GdnExportError(f"--ort-kernels native: {reason}")
    gdn = standard_ops.to_gdn(model) if form == STANDARD else model
    note = "function bodies (Loop over tokens, K-tap window)" + (f": {reason}" if reason else "")
    return OrtPlan(attach_reference_functions(gdn), "functions", note)


def main(argv=None) -> int:
    """`python -m gdn_export.onnx.ort_native IN.onnx OUT.onnx [--kernels ...]`: write the model ONNX
    Runtime runs (what OrtRunner builds in memory), e.g. for `polygraphy run OUT.onnx --onnxrt`."""
    import argparse
    import sys

    from gdn_export.onnx.bf16 import emulate_bf16, has_bf16

    p = argparse.ArgumentParser(prog="python -m gdn_export.onnx.ort_native", description=main.__doc__)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--kernels", choices=KERNELS, default="auto")
    args = p.parse_args(argv)
    try:
        model = onnx.load(args.input)
        if has_bf16(model):
            model = emulate_bf16(model)
        plan = prepare(model, args.kernels)
    except (GdnExportError, OSError) as exc:
        print(f"ort_native: error: {exc}", file=sys.stderr)
        return 2
    onnx.save(plan.model, args.output)
    print(f"wrote {args.output}: {plan.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
