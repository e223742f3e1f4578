"""What a generation allocates, bounded before it allocates.

`generate` holds, for B rows, one set of states (conv / recurrent states and a K/V cache whose
length is fixed by the layout: in place, `cache_len` slots; concatenated, grows to the prompt plus
the generation) and the logits of every step (`GenerationResult.step_logits`, fp32 [B, 1, V] per
step). The cache is allocated whole, up front (empty_states): it does not grow in steps, so a
generation that cannot fit is refused before anything is allocated, with the numbers
(`check_generation_memory`), instead of failing in the allocator with a traceback.

Available memory: on the CPU, /proc/meminfo's MemAvailable, capped by the cgroup's memory.max less
its memory.current where one is set; on a CUDA device, torch.cuda.mem_get_info's free bytes. Where
neither can be read the check passes.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from gdn_export.errors import InputError

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
             "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def size_text(n: int) -> str:
    """n bytes as "1.25 GiB" (from 64 MiB up) or "3.0 MiB"."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**26 else f"{n / 2**20:.1f} MiB"


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cpu_available_bytes() -> int | None:
    """MemAvailable, capped by the cgroup (v2) limit less its usage; None if neither is readable."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        found.append(max(limit - used, 0))
    return min(found) if found else None


def available_bytes(device) -> int | None:
    """Free memory for new tensors on `device` ("cpu", "cuda:1", a torch.device); None: unknown."""
    kind = str(device)
    if kind.startswith("cuda"):
        try:
            import torch

            return int(torch.cuda.mem_get_info(torch.device(kind))[0])
        except Exception:  # no CUDA torch, no such device: the allocator will say
            return None
    return cpu_available_bytes()


def check_host_bytes(need: int, what: str, hint: str) -> None:
    """InputError when `need` bytes of host memory (for `what`) exceed what is available."""
    free = cpu_available_bytes()
    if free is not None and need > free:
        raise InputError(f"{what} need {size_text(need)}, but the host has {size_text(free)} available; {hint}")


def model_plan(model, device) -> SimpleNamespace:
    """What `generation_bytes` reads from a runner, for a HybridForCausalLM (a meta-device one will
    do) that is not loaded yet: its state specs, layout, vocab size and the device it will run on."""
    return SimpleNamespace(state_specs=model.state_specs(), layout=model.layout,
                           vocab_size=int(model.config.vocab_size), backend="torch", device=device)


def runner_device(runner) -> str:
    """Where a runner keeps its states: its torch device, the GPU for TensorRT, else the CPU."""
    device = getattr(runner, "device", None)
    if device is not None:
        return str(device)
    return "cuda" if runner.backend == "trt" else "cpu"


def generation_bytes(runner, prompts: Sequence[np.ndarray], max_new_tokens: int,
                     keep_logits: bool = True) -> tuple[int, int]:
    """(states bytes, logits bytes) that `generate(runner, prompts, max_new_tokens)` holds (logits
    0 when the caller keeps none, as the benchmark)."""
    batch = len(prompts)
    longest = max(len(p) for p in prompts)
    past = longest + max(max_new_tokens - 1, 0)  # the concat layout's cache at its longest
    states = 0
    # run_specs: the arrays a runner really holds (ONNX Runtime: bf16 / float8 states as fp32)
    for spec in getattr(runner, "run_specs", runner.state_specs):
        n = 1
        for d in spec.concrete_shape(batch, past):
            n *= int(d)
        states += n * _ITEMSIZE.get(str(spec.dtype).removeprefix("torch."), 4)
    prompt_positions = longest if runner.layout.logits == "all" else 1
    logits = 4 * batch * runner.vocab_size * (prompt_positions + max(max_new_tokens - 1, 0))
    return states, logits if keep_logits else 0


def check_generation_memory(runner, prompts: Sequence[np.ndarray], max_new_tokens: int,
                            keep_logits: bool = True, hint: str = "lower --max-new-tokens or the batch") -> None:
    """InputError, with the numbers, when the states and kept logits of this generation exceed
    the memory available on the runner's device (module docstring)."""
    states, logits = generation_bytes(runner, prompts, max_new_tokens, keep_logits)
    device = runner_device(runner)
    free = available_bytes(device)
    if free is None or states + logits <= free:
        return
    raise InputError(f"batch {len(prompts)}, prompts of up to {max(len(p) for p in prompts)} tokens, "
                     f"{max_new_tokens} new tokens: needs {size_text(states + logits)} (states and K/V cache "
                     f"{size_text(states)}" + (f", logits of every step {size_text(logits)}" if keep_logits else "")
                     + f"), but {device} has {size_text(free)} available; {hint}")
