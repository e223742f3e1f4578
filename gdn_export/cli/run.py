"""`gdn-export run MODEL --input-ids ... --max-new-tokens N`: greedy generation on one backend."""

from __future__ import annotations

from gdn_export.cli.common import (Progress, add_device, add_dtype, add_op_backend, add_overwrite, add_plugins, add_quiet,
                                   device_of, dtype_of, op_backend_of, output_file,
                                   parse_input_ids, save_logits)
from gdn_export.cli import run_speculative
from gdn_export.cli.runners import BACKENDS, add_ort_kernels, guess_backend, open_runner
from gdn_export.cli.vlm import add_image_flags, run_with_images, wants_vlm
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="greedy generation with torch, ONNX Runtime or TensorRT",
                       description="Prefill the prompt, then decode greedily with the recurrent "
                       "state, conv state and KV cache kept by the backend. Prints one line per "
                       "row: the prompt's ids, then the generated ids.")
    p.add_argument("model", help="checkpoint folder (torch), .onnx (ort) or .engine (trt)")
    p.add_argument("--backend", choices=BACKENDS,
                   help="default: from the MODEL path (folder: torch, .onnx: ort, .engine: trt)")
    p.add_argument("--input-ids", action="append", default=[], metavar="ID,ID,...", required=True,
                   help="prompt token ids; repeat the flag for a batch (rows may differ in length)")
    p.add_argument("--max-new-tokens", type=int, default=16,
                   help="tokens to generate per row; the states, the K/V cache and every step's "
                   "logits are allocated up front and refused when they exceed the device's memory")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prefill long prompts in calls of at most N tokens per row (default: as many "
                   "as the cache allows; with --device cuda sized from the prompt and the free memory, "
                   "4096..16384 tokens a call over the batch)")
    p.add_argument("--save-logits", metavar="OUT.npz",
                   help="save generated [B, N], prompt_lengths [B] and the logits of every step: "
                   "step_0 = the prompt's ([B, 1, V] at each row's last prompt token, or [B, T, V] "
                   "when the model keeps all logits, zeros past a row's length), then step_i [B, 1, V] (default: not saved)")
    g = p.add_argument_group("torch and ort backends")
    add_dtype(g, "the torch backend's model")
    add_device(g, "the torch or ort backend", "ort on cuda needs onnxruntime-gpu")
    add_op_backend(g)
    add_plugins(p, "the trt backend")
    add_ort_kernels(p)
    add_overwrite(p, "the --save-logits file")
    run_speculative.add_arguments(p)
    add_image_flags(p)
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.runtime.base import as_prompts, check_generation_fits, generate
    from gdn_export.runtime.memory import check_generation_memory

    if wants_vlm(args):  # images, or a vision-language model.onnx
        if args.speculative is not None:
            raise InputError("--speculative does not take images or a vision-language export")
        return run_with_images(args)
    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise InputError(f"--prefill-chunk must be >= 1, got {args.prefill_chunk}")
    ids = parse_input_ids(args.input_ids)
    if args.save_logits:
        output_file(args.save_logits, "--save-logits", args)
    backend = args.backend or guess_backend(args.model)
    _check_flags_apply(args, backend)
    run_speculative.check_flags(args, backend)
    progress = Progress("run", args.quiet)
    if args.speculative is not None:
        return (run_speculative.run_ort if backend == "ort" else run_speculative.run)(args, ids, progress)
    device = device_of(args)
    runner = open_runner(args.model, backend, dtype=dtype_of(args), device=device, plugins=args.plugins,
                         op_backend=op_backend_of(args, device) if backend == "torch" else None,
                         ort_kernels=args.ort_kernels,
                         layout=_torch_layout(ids, args.max_new_tokens) if backend == "torch" else None)
    # Checked before the progress line, so that an error stays the only line on stderr.
    prompts = as_prompts(ids, runner.vocab_size)
    check_generation_fits(runner.layout, prompts, args.max_new_tokens)
    check_generation_memory(runner, prompts, args.max_new_tokens)
    if args.save_logits:
        from gdn_export.runtime.memory import generation_bytes

        output_file(args.save_logits, "--save-logits", args,
                    need_bytes=generation_bytes(runner, prompts, args.max_new_tokens)[1])
    if backend == "ort":
        progress(f"ort on {runner.device}: {runner.kernels_note}")
    if backend == "torch":
        from gdn_export.vlm.weights import has_vision_tower

        if has_vision_tower(args.model):
            progress("vision-language checkpoint without --image / --pixel-values: running its language "
                     "model alone")
    lengths = sorted({len(p) for p in prompts})
    size = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]}..{lengths[-1]}"
    progress(f"{runner.backend}: prefill {size} tokens x {len(prompts)} rows, then greedy decoding of "
             f"{args.max_new_tokens} new tokens")
    result = generate(runner, prompts, args.max_new_tokens, prefill_chunk=args.prefill_chunk)
    for row in result.rows():
        print(" ".join(str(int(t)) for t in row))
    summary = getattr(runner, "ort_log", None) and runner.ort_log.summary()
    if summary:  # ONNX Runtime's warnings of the whole run, one line
        progress(summary)
    if args.save_logits:
        save_logits(args, result, progress)
    return 0


def _torch_layout(prompts, max_new_tokens: int):
    """A checkpoint run in PyTorch gets an in-place cache just long enough for this generation."""
    from gdn_export.layout import DeployLayout

    return DeployLayout.make(cache_len=max(len(p) for p in prompts) + max(max_new_tokens, 1))


def _check_flags_apply(args, backend: str) -> None:
    """A flag of another backend would be ignored without a word (`run m.onnx --dtype fp16`
    would still run the fp32 graph)."""
    only = {"--dtype": (args.dtype, "torch"),
            "--device": (args.device, "torch" if backend != "ort" else "ort"),
            "--ort-kernels": (None if args.ort_kernels == "auto" else args.ort_kernels, "ort"),
            "--op-backend": (args.op_backend, "torch"), "--plugins": (args.plugins, "trt")}
    for flag, (value, owner) in only.items():
        if value is not None and backend != owner:
            raise InputError(f"{flag} applies to the {owner} backend only; {args.model} runs on {backend}")
