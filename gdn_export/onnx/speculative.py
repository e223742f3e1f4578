"""The graphs of speculative decoding: the verify form of the model and the MTP head, each its own
ONNX file beside the model's (`gdn-export export --speculative K`).

`<name>.verify.onnx` (export_verify): K + 1 tokens a row in one call, every GDN state kept

    inputs   input_ids [batch, K+1] int64, past_lengths [batch], seq_lens [batch], past.{i}.* as the
             model's graph (gdn_export.onnx.export)
    outputs  logits [batch, K+1, V] fp32, hidden [batch, K+1, hidden] (after the final norm: the MTP
             head's input), then per layer in state order
               linear_attention  present.{i}.conv_window     [batch, C, W-1+K+1]   (W the conv width)
                                 present.{i}.recurrent_steps [batch, K+1, Hv, Dk, Dv]
               full_attention    present.{i}.key / value     (the cache, K+1 slots written)

Each row then keeps its state after kept[b] tokens (gdn_export.models.verify.roll_back: conv
columns kept .. kept + W-2 of the window, recurrent step kept - 1; the K/V caches by length). Each
GDN layer's recurrence is one gdn.GatedDeltaRuleSteps node (gdn_export.ops.gated_delta_rule.steps;
the TensorRT plugin of that name) and its conv a grouped Conv over the window, so no state input is
updated in place (TensorRT-RTX fails to build the copy an aliased input read elsewhere needs).

`<name>.mtp.onnx` (export_mtp): the head, its own K/V cache (layer N = num_hidden_layers)

    inputs   input_ids [batch, seq] int64 (the next tokens), hidden [batch, seq, hidden] (the model's,
             at the same positions), past_lengths [batch], seq_lens [batch], past.N.key, past.N.value
    outputs  logits [batch, 1, V] fp32 and mtp_hidden [batch, 1, hidden] at each row's last real
             token (the next chained draft's hidden), present.N.key, present.N.value

`compare_in_ort` runs either file in ONNX Runtime against the PyTorch modules on random ragged
inputs (the tests' validation).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from gdn_export import __version__
from gdn_export.errors import GdnExportError
from gdn_export.layout import LOGITS_LAST
from gdn_export.onnx import metadata
from gdn_export.onnx.export import (BATCH, EXAMPLE_BATCH, INPUT_IDS, LOGITS, SEQ, TOKEN_INPUTS, check_export_target,
                                    default_opset, run_exporter, write_checked)

HIDDEN, MTP_HIDDEN = "hidden", "mtp_hidden"
KEY_ROLE = metadata.KEY_SPECULATIVE_ROLE  # "verify" | "mtp"
KEY_K = metadata.KEY_SPECULATIVE_K
_STEP_NAMES = {"conv": "conv_window", "recurrent": "recurrent_steps"}


class VerifyForm(nn.Module):
    """forward(input_ids [B, K+1], past_lengths, seq_lens, *states) -> (logits, hidden, *step states)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, past_lengths, seq_lens, *states):
        hidden, *steps = self.model.hidden_states(input_ids, past_lengths, seq_lens, *states, capture_steps=True)
        return (self.model.lm_head(hidden).float(), hidden, *steps)


def verify_output_names(model) -> list[str]:
    return [LOGITS, HIDDEN] + [f"present.{s.layer}.{_STEP_NAMES.get(s.kind, s.kind)}" for s in model.state_specs()]


def mtp_input_names(mtp) -> list[str]:
    return [INPUT_IDS, HIDDEN, *TOKEN_INPUTS[1:], *(s.name for s in mtp.state_specs())]


def mtp_output_names(mtp) -> list[str]:
    return [LOGITS, MTP_HIDDEN, *(s.output_name for s in mtp.state_specs())]


def _states(specs, gen, device):
    return [(0.1 * torch.randn(s.concrete_shape(EXAMPLE_BATCH), generator=gen)).to(device, s.dtype) for s in specs]


def verify_inputs(model, k: int, batch: int = EXAMPLE_BATCH, seed: int = 0):
    """Example inputs of the verify form: ragged rows (the second holds one token fewer)."""
    gen = torch.Generator().manual_seed(seed)
    dev = model.device
    ids = torch.randint(0, model.config.vocab_size, (batch, k + 1), generator=gen).to(dev)
    past = torch.arange(batch, device=dev) + 1
    lens = torch.full((batch,), k + 1, device=dev)
    lens[1::2] = k
    specs = model.state_specs()
    states = [(0.1 * torch.randn(s.concrete_shape(batch), generator=gen)).to(dev, s.dtype) for s in specs]
    return (ids, past, lens, *states)


def mtp_inputs(mtp, seq: int = 3, batch: int = EXAMPLE_BATCH, seed: int = 0):
    """Example inputs of the MTP graph: ragged rows at different positions."""
    gen = torch.Generator().manual_seed(seed)
    dev = mtp.device
    ids = torch.randint(0, mtp.config.vocab_size, (batch, seq), generator=gen).to(dev)
    hidden = torch.randn(batch, seq, mtp.config.hidden_size, generator=gen).to(dev, mtp.dtype)
    past = torch.arange(batch, device=dev) + 2
    lens = torch.full((batch,), seq, device=dev)
    lens[1::2] = seq - 1
    states = [(0.1 * torch.randn(s.concrete_shape(batch), generator=gen)).to(dev, s.dtype) for s in mtp.state_specs()]
    return (ids, hidden, past, lens, *states)


def _check_model(model) -> None:
    from gdn_export.models.verify import check_layout
    from gdn_export.modules.kv_cache_fp8 import kv_scales
    from gdn_export.modules.quant_linear import quantized_formats

    check_layout(model.layout)
    if kv_scales(model) is not None or quantized_formats(model):
        raise GdnExportError("the speculative graphs are written for 16-bit models (no quantized layers, "
                             "no FP8 K/V cache)")


def _metadata(model, opset: int, role: str, k: int | None) -> dict[str, str]:
    """The model graph's metadata_props (gdn_export.onnx.metadata: the states are this graph's
    inputs) and the role: "verify" with K, or "mtp"."""
    props = metadata.make_metadata(version=__version__, family=model.config.family,
                                   dtype=metadata.torch_dtype_name(model.dtype), opset=opset,
                                   vocab_size=model.config.vocab_size,
                                   states=metadata.layouts_from_specs(model.state_specs()), layout=model.layout)
    props[KEY_ROLE] = role
    if k is not None:
        props[KEY_K] = str(k)
    return props


def export_verify(model, path, k: int, opset: int | None = None, overwrite: bool = True,
                  progress: Callable[[str], None] | None = None) -> Path:
    """Write the verify form of `model` (HybridForCausalLM, in-place cache without streaming,
    16-bit) for K drafts to `path` (module docstring)."""
    from torch.export import Dim

    _check_model(model)
    if not 1 <= k <= 16:
        raise GdnExportError(f"K must be in [1, 16], got {k}")
    opset = default_opset(model.layout) if opset is None else opset
    path = check_export_target(path, opset, model.layout)
    say = progress or (lambda _m: None)
    model.eval()
    specs = model.state_specs()
    batch = Dim(BATCH, min=1)
    dynamic = ({0: batch}, {0: batch}, {0: batch}, tuple({0: batch} for _ in specs))
    say(f"tracing the verify form: {k + 1} tokens a row, every GDN state kept, opset {opset}; all "
        f"{len(model.config.layer_kinds)} layers (the stamped export serves the model graph only)")
    ir_model = run_exporter(VerifyForm(model), verify_inputs(model, k), dynamic,
                            [*TOKEN_INPUTS, *(s.name for s in specs)], verify_output_names(model), opset)
    ir_model.metadata_props.update(_metadata(model, opset, "verify", k))
    return write_checked(ir_model, path, say, overwrite=overwrite)


def export_mtp(mtp, path, opset: int | None = None, progress: Callable[[str], None] | None = None,
               overwrite: bool = True) -> Path:
    """Write the MTP head (gdn_export.models.mtp.MtpModel) to `path` (module docstring)."""
    from torch.export import Dim

    _check_model(mtp)
    mtp.layout = dataclasses.replace(mtp.layout, logits=LOGITS_LAST)
    opset = default_opset(mtp.layout) if opset is None else opset
    path = check_export_target(path, opset, mtp.layout)
    say = progress or (lambda _m: None)
    mtp.eval()
    batch, seq = Dim(BATCH, min=1), Dim(SEQ, min=1)
    dynamic = ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch}, {0: batch}, {0: batch}, {0: batch})
    say(f"tracing the MTP head, opset {opset}")
    ir_model = run_exporter(mtp, mtp_inputs(mtp), dynamic, mtp_input_names(mtp), mtp_output_names(mtp), opset)
    ir_model.metadata_props.update(_metadata(mtp, opset, "mtp", None))
    return write_checked(ir_model, path, say, overwrite=overwrite)


def speculative_paths(path) -> tuple[Path, Path]:
    """(<stem>.verify.onnx, <stem>.mtp.onnx) beside the model's `<stem>.onnx`."""
    path = Path(path)
    return path.with_name(path.stem + ".verify.onnx"), path.with_name(path.stem + ".mtp.onnx")


def compare_in_ort(path, module: nn.Module, inputs: tuple) -> dict[str, float]:
    """{output name: max |ORT - PyTorch| / max |PyTorch|} of the exported `path` in ONNX Runtime
    (CPU; gdn nodes through gdn_export.onnx.ort_native; a bf16 graph as fp32 tensors rounded to bf16
    where it rounds, gdn_export.onnx.bf16) against `module(*inputs)` in PyTorch."""
    import onnx
    import onnxruntime as ort

    from gdn_export.onnx import bf16
    from gdn_export.onnx.ort_native import prepare

    proto = onnx.load(str(path))
    plan = prepare(bf16.emulate_bf16(proto) if bf16.has_bf16(proto) else proto)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # TensorScatter's note that it copies the cache (no IOBinding here)
    session = ort.InferenceSession(plan.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [v.name for v in proto.graph.input]
    feeds = {n: _numpy(t) for n, t in zip(names, inputs)}
    got = session.run(None, feeds)
    with torch.no_grad():
        want = module(*[t.clone() for t in inputs])
    out = {}
    for value, mine, theirs in zip(proto.graph.output, got, want):
        theirs = _numpy(theirs)
        if mine.shape != theirs.shape:
            raise GdnExportError(f"{value.name}: ONNX Runtime gives {mine.shape}, PyTorch {theirs.shape}")
        scale = max(float(np.abs(theirs).max()), 1e-12)
        out[value.name] = float(np.abs(mine.astype(np.float64) - theirs.astype(np.float64)).max()) / scale
    return out


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
