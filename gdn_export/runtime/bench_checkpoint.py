"""What `gdn-export bench` measures on a checkpoint: the fast torch runner's timing and memory,
its accuracy against the fp32 model, and transformers beside it (the primitives are
gdn_export.runtime.bench's; this module loads the models and fills the result dict).

    setup = Setup(device, dtype, "bf16", layout, "triton", cuda_graph=True, batch=1, prompt_len=512, ...)
    check_memory(checkpoint, setup)                       # before any allocation
    runner, model = measure(checkpoint, ids, setup, result)   # ids [B, T] int64 on setup.device
    result["accuracy"] = accuracy(checkpoint, runner, prompts, setup)
    result["transformers"] = bench_transformers(checkpoint, ids, prompts, setup, result["accuracy"])

Result keys (measure): parameters, weights_bytes, states_bytes, prefill_chunk, prefill_ms,
decode_ms_per_step, decode_tokens_per_s, prefill_runs_ms, decode_runs_ms_per_step,
peak_memory_bytes, peak_memory_source, and on CUDA peak_memory_phases {load, setup, prefill, decode}.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Callable

from gdn_export.errors import GdnExportError
from gdn_export.runtime import bench as B

ACCURACY_STEPS = 8


@dataclass
class Setup:
    """What every timed model of one bench call shares."""

    device: Any  # torch.device
    dtype: Any  # torch.dtype
    dtype_name: str  # "fp32" | "fp16" | "bf16"
    layout: Any  # gdn_export.layout.DeployLayout
    op_backend: str | None  # None: the registry's active backend (gdn_export.ops.backends)
    cuda_graph: bool
    batch: int
    prompt_len: int
    decode_steps: int
    warmup: int
    repeats: int
    prefill_chunk: int | None = None
    compile: bool = False
    compile_mode: str = "default"
    progress: Callable[[str], None] = lambda _msg: None


def model_weights(model) -> tuple[int, int]:
    """(parameters, bytes) of model's weights: its nn.Parameters (tied ones once) and the quantized
    layers' buffers (fp8 / int4 weights and their scales); quantized weights count in_features *
    out_features parameters."""
    from gdn_export.modules.quant_linear import QuantLinear

    params = list({id(p): p for p in model.parameters()}.values())
    count = sum(p.numel() for p in params)
    tensors = list(params)
    for m in model.modules():
        if isinstance(m, QuantLinear):
            count += m.in_features * m.out_features
            tensors.extend(b for b in m.buffers(recurse=False) if b is not None)
    return count, B.tensor_bytes(tensors)


def check_memory(checkpoint, setup: Setup) -> None:
    """InputError, with the numbers, when the states and K/V cache of setup.batch rows of
    prompt_len + decode_steps tokens exceed the device's memory (gdn_export.runtime.memory)."""
    from pathlib import Path

    import numpy as np
    import torch

    from gdn_export.hf_config import read_config
    from gdn_export.models.hybrid import HybridForCausalLM
    from gdn_export.runtime.memory import check_generation_memory, model_plan

    with torch.device("meta"):
        model = HybridForCausalLM(read_config(Path(checkpoint) / "config.json")).to(setup.dtype)
    model.layout = setup.layout
    prompts = [np.zeros(setup.prompt_len, np.int64)] * setup.batch
    check_generation_memory(model_plan(model, setup.device), prompts, setup.decode_steps, keep_logits=False,
                            hint="lower --batch, --prompt-len or --decode-steps")


def measure(checkpoint, ids, setup: Setup, result: dict, label: str = "ours"):
    """Load `checkpoint` in setup.dtype on setup.device, time it on a GraphRunner over prompts ids
    [B, T] and add the timing / memory keys to `result`. Returns (runner, model): the caller drops
    them before the next model is loaded."""
    from gdn_export.ops.backends import current_name
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint

    device, progress = setup.device, setup.progress
    B.reset_peak_memory(device)
    progress(f"loading {checkpoint} ({setup.dtype_name}, {device})")
    model = load_checkpoint(checkpoint, dtype=setup.dtype, device=device)
    model.layout = setup.layout
    phases = {"load": B.peak_memory(device)[0]}
    result["parameters"], result["weights_bytes"] = model_weights(model)
    B.reset_peak_memory(device)
    runner = GraphRunner(model, device=device, op_backend=setup.op_backend, cuda_graph=setup.cuda_graph,
                         compile=setup.compile, compile_mode=setup.compile_mode)
    result["prefill_chunk"] = setup.prefill_chunk or runner.default_prefill_chunk(setup.batch, setup.prompt_len)
    result["states_bytes"] = B.tensor_bytes(runner.empty_states(setup.batch))
    phases["setup"] = B.peak_memory(device)[0]  # fused projections, states, decode graph capture
    progress(f"{label}: {result['parameters'] / 1e9:.3f}B parameters, batch {setup.batch}, prompt "
             f"{setup.prompt_len}, {setup.decode_steps} decode steps, {setup.op_backend or current_name()} ops, "
             f"CUDA graph {'on' if setup.cuda_graph else 'off'}{', compiled' if setup.compile else ''}")
    timings = B.bench_runner(runner, ids, setup.decode_steps, setup.warmup, setup.repeats,
                             setup.prefill_chunk, progress)
    result.update(timings.as_dict())
    result["peak_memory_bytes"], result["peak_memory_source"] = B.peak_memory_through(timings, device)
    if device.type == "cuda":  # the peak of each phase: where the memory above weights + states goes
        phases.update(prefill=timings.prefill_peak_bytes, decode=timings.decode_peak_bytes)
        result["peak_memory_phases"] = phases
        result["peak_memory_bytes"] = max(result["peak_memory_bytes"], phases["load"])
    return runner, model


def accuracy(checkpoint, runner, prompts, setup: Setup) -> dict:
    """Our model in setup.dtype against our fp32 model (forced to the fp32 model's greedy tokens),
    and the fast fp32 runner's greedy tokens against the eager runner's; prompts [B, T] int64.

    Keys: steps, fp32_fast_tokens_equal_eager, ours_vs_fp32 {rel_rms, argmax_agreement}, and
    _truth [S + 1, B, V] / _forced [B, S] for bench_transformers (private: not for the JSON)."""
    import numpy as np
    import torch

    from gdn_export.runtime.base import generate
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.runtime.torch_runner import TorchRunner
    from gdn_export.weights import load_checkpoint

    device, progress = setup.device, setup.progress
    progress(f"accuracy: fp32 model, {ACCURACY_STEPS} greedy steps")
    ref_model = load_checkpoint(checkpoint, dtype=torch.float32, device=device)
    ref_model.layout = runner.layout
    eager = TorchRunner(ref_model, device=device, op_backend=setup.op_backend)
    want = generate(eager, prompts, ACCURACY_STEPS + 1)
    forced = want.generated[:, :ACCURACY_STEPS]
    truth = np.stack([lg[:, -1] for lg in want.step_logits])  # [S + 1, B, V]
    fast32 = GraphRunner(ref_model, device=device, op_backend=setup.op_backend, cuda_graph=runner.cuda_graph)
    got32 = generate(fast32, prompts, ACCURACY_STEPS + 1)
    out = {"steps": ACCURACY_STEPS,
           "fp32_fast_tokens_equal_eager": bool((got32.generated == want.generated).all())}
    del fast32, eager, ref_model
    gc.collect()
    progress(f"accuracy: {setup.dtype_name} model, the fp32 model's tokens forced")
    out["ours_vs_fp32"] = B.compare_logits(B.forced_logits_ours(runner, prompts, forced), truth)
    out["_truth"], out["_forced"] = truth, forced
    return out


def bench_transformers(checkpoint, ids, prompts, setup: Setup, accuracy: dict | None) -> dict:
    """transformers' AutoModelForCausalLM in setup.dtype on the same prompts: class, the timing keys,
    peak memory, and with `accuracy` (from `accuracy`) its own fp32 comparisons; {"skipped": why}
    where transformers cannot load the checkpoint."""
    import torch

    device, progress = setup.device, setup.progress
    B.reset_peak_memory(device)
    progress(f"transformers: loading {checkpoint} ({setup.dtype_name}, {device})")
    try:
        model = B.load_hf(checkpoint, setup.dtype, device)
    except GdnExportError as exc:
        progress(f"transformers skipped: {exc}")
        return {"skipped": str(exc)}
    out = {"class": type(model).__name__}
    timings = B.bench_hf(model, ids, setup.decode_steps, setup.warmup, setup.repeats, progress)
    out.update(timings.as_dict())
    out["peak_memory_bytes"], out["peak_memory_source"] = B.peak_memory_through(timings, device)
    if accuracy is not None:
        truth, forced = accuracy["_truth"], accuracy["_forced"]
        logits = B.forced_logits_hf(model, prompts, forced, device)
        del model
        gc.collect()
        B.reset_peak_memory(device)
        progress("transformers: fp32 model, for its own accuracy against it")
        model32 = B.load_hf(checkpoint, torch.float32, device)
        hf_truth = B.forced_logits_hf(model32, prompts, forced, device)
        out["accuracy"] = {"hf_vs_fp32_hf": B.compare_logits(logits, hf_truth),
                           "hf_vs_fp32_ours": B.compare_logits(logits, truth),
                           "fp32_hf_vs_fp32_ours": B.compare_logits(hf_truth, truth)}
    return out
