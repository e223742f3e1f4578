"""`gdn-export serve CHECKPOINT`: an OpenAI-compatible HTTP server with continuous batching
(gdn_export/serve). Flags, checkpoint files, the tokenizer and the port are refused in one line before
the model loads; state rows the device cannot hold, once the model is on it (before they are
allocated)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gdn_export.cli.args import (add_device, add_dtype, add_op_backend, add_quiet, add_seed, checkpoint_dir, device_of,
                                  dtype_of, input_file, op_backend_of)
from gdn_export.cli.common import Progress, torch_dtype
from gdn_export.cli.runners import add_ort_kernels
from gdn_export.errors import InputError

DEFAULTS = dict(host="127.0.0.1", port=8000, max_model_len=4096, max_num_seqs=64, max_prefill_seqs=8,
                max_queue=512, prefill_tokens=2048, drain_timeout=30.0)
API_KEY_ENV = "GDN_EXPORT_API_KEY"


def add_parser(sub) -> None:
    d = DEFAULTS
    p = sub.add_parser("serve", help="serve a checkpoint over OpenAI's HTTP API (continuous batching)",
                       description="Serve a checkpoint folder at /v1/completions, /v1/chat/completions "
                       "(the checkpoint's chat template), /v1/models, /health and /metrics, with "
                       "continuous batching: requests join and leave the running decode batch at every "
                       "step, each with its own recurrent state, conv state and K/V cache rows. SIGTERM "
                       "drains: no new requests, the running ones finish (--drain-timeout), exit 0. "
                       "docs/serving.md has examples.")
    p.add_argument("checkpoint", help="checkpoint folder (config.json + *.safetensors; quantized ones too); "
                   "its tokenizer files serve text, without them prompts are token ids")
    g = p.add_argument_group("HTTP")
    g.add_argument("--host", default=d["host"], help=f"address to listen on (default {d['host']}; 0.0.0.0: all)")
    g.add_argument("--port", type=int, default=d["port"], help=f"TCP port (default {d['port']}; 0: a free one)")
    g.add_argument("--served-model-name", metavar="NAME",
                   help="the id clients send as \"model\" (default: the checkpoint folder's name)")
    g.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV}, else none)")
    g.add_argument("--drain-timeout", type=float, default=d["drain_timeout"], metavar="S",
                   help=f"on SIGTERM, seconds the running requests get to finish (default {d['drain_timeout']:g})")
    g.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="uvicorn's log level (default info)")
    g.add_argument("--no-access-log", action="store_true", help="no line per HTTP request")
    g = p.add_argument_group("model")
    g.add_argument("--runtime", choices=("torch", "ort"), default="torch",
                   help="torch (default): the checkpoint on the fast torch runner; ort: the graph --onnx "
                   "exported from this checkpoint, in ONNX Runtime on the CPU (the checkpoint gives the "
                   "tokenizer, chat template and stop ids)")
    g.add_argument("--onnx", metavar="FILE", help="--runtime ort: the exported graph (in-place K/V cache, "
                   "last-position logits: `gdn-export export`'s defaults); its --max-cache-len bounds each "
                   "request's prompt + max_tokens")
    add_ort_kernels(g)
    add_device(g, "the model", "a GPU serves with --device cuda --dtype bf16")
    add_dtype(g)
    add_op_backend(g)
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="replay the decode step from CUDA graphs, one per power-of-two batch size "
                   "(default: on with a CUDA --device)")
    g.add_argument("--compile", action="store_true", help="torch.compile the decode step before capturing it")
    add_seed(g, "the sampling of requests that give no seed (one generator for the server's life)")
    g.add_argument("--speculative", type=int, default=None, metavar="K",
                   help="decode by speculative rounds: the checkpoint's MTP head drafts K tokens a row, one "
                   "model call verifies them (greedy requests get the tokens of plain decoding, faster "
                   "where the head agrees; sampling requests keep drafts by the rejection rule, under their "
                   "own parameters). K in [1, 16]; docs/serving.md (default: off)")
    g = p.add_argument_group("limits")
    g.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help=f"prompt + generated tokens per request: the K/V cache slots of each row "
                   f"(default: {d['max_model_len']}, or max_position_embeddings if smaller)")
    g.add_argument("--max-num-seqs", type=int, default=d["max_num_seqs"], metavar="N",
                   help=f"requests running at once: the decode batch's rows (default {d['max_num_seqs']})")
    g.add_argument("--max-prefill-seqs", type=int, default=None, metavar="N",
                   help=f"requests prefilled together (default {d['max_prefill_seqs']}, at most --max-num-seqs)")
    g.add_argument("--prefill-tokens", type=int, default=d["prefill_tokens"], metavar="N",
                   help=f"tokens of one prefill call, rows x chunk: longer prompts are prefilled in chunks "
                   f"between decode steps (default {d['prefill_tokens']})")
    g.add_argument("--max-cached-tokens", type=int, default=None, metavar="N",
                   help="prompt + max_tokens reserved by the running requests together (default: "
                   "max-num-seqs x max-model-len, i.e. no bound beyond those)")
    g.add_argument("--max-queue", type=int, default=d["max_queue"], metavar="N",
                   help=f"requests waiting for a row; more get 429 with Retry-After (default {d['max_queue']})")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.hf_config import read_config
    from gdn_export.weights.loader import check_checkpoint

    _check_flags(args)
    if Path(args.checkpoint).suffix in (".onnx", ".engine", ".plan") and Path(args.checkpoint).is_file():
        raise InputError(f"{args.checkpoint}: serve takes the checkpoint folder the graph or engine was exported "
                         f"from (an ONNX graph is served with CHECKPOINT --runtime ort --onnx FILE)")
    checkpoint_dir(args.checkpoint)
    config = read_config(Path(args.checkpoint) / "config.json")
    if args.runtime == "ort":
        return _run_ort(args, config)
    if args.onnx or args.ort_kernels != "auto":
        raise InputError("--onnx / --ort-kernels apply to --runtime ort")
    check_checkpoint(args.checkpoint)  # files, names, shapes: before the slow part
    max_len = args.max_model_len or min(DEFAULTS["max_model_len"], config.max_position_embeddings)
    if max_len > config.max_position_embeddings:
        raise InputError(f"--max-model-len {max_len} exceeds the model's max_position_embeddings "
                         f"({config.max_position_embeddings})")
    if args.speculative is not None:
        from gdn_export.weights.mtp import check_has_mtp

        check_has_mtp(config, args.checkpoint)
    _check_imports()

    from gdn_export.cli.runners import check_device

    device = device_of(args)
    op_backend = op_backend_of(args, device)
    check_device(device, op_backend)
    if args.cuda_graph and not device.startswith("cuda"):
        raise InputError(f"--cuda-graph needs a CUDA --device, got {device}")
    dtype = dtype_of(args)

    from gdn_export.serve.server import bind_socket
    from gdn_export.serve.tokenizer import ServeTokenizer

    limits = _limits(args)
    progress = Progress("serve", args.quiet)
    tokenizer = ServeTokenizer.load(args.checkpoint)
    _tokenizer_note(tokenizer, config, progress)
    sock = bind_socket(args.host, args.port)  # a taken port is said before the model loads
    try:
        engine = _engine(args, device, dtype, op_backend, max_len, limits, tokenizer, progress)
        return _serve(args, engine, tokenizer, sock, progress)
    finally:
        sock.close()


def _tokenizer_note(tokenizer, config, progress) -> None:
    if tokenizer is not None and len(tokenizer) > config.vocab_size:
        progress(f"note: the tokenizer has {len(tokenizer)} tokens, the model {config.vocab_size}: prompts "
                 f"with ids past the model's vocabulary get 400")


def _limits(args):
    from gdn_export.serve.scheduler import Limits

    return Limits(max_num_seqs=args.max_num_seqs, max_prefill_seqs=args.max_prefill_seqs,
                  max_cached_tokens=args.max_cached_tokens, max_queue=args.max_queue,
                  prefill_tokens=args.prefill_tokens)


def _run_ort(args, config) -> int:
    """--runtime ort: the exported graph in ONNX Runtime (CPU) behind the same engine and server."""
    from gdn_export.onnx.ort_native import check_file
    from gdn_export.runtime import ort_device
    from gdn_export.serve.server import bind_socket
    from gdn_export.serve.tokenizer import ServeTokenizer

    if not args.onnx:
        raise InputError("--runtime ort needs --onnx FILE (the graph exported from the checkpoint)")
    for flag, value in (("--dtype", args.dtype), ("--op-backend", args.op_backend), ("--compile", args.compile),
                        ("--cuda-graph", args.cuda_graph), ("--speculative", args.speculative),
                        ("--max-model-len", args.max_model_len)):
        if value:
            raise InputError(f"{flag} applies to --runtime torch only" + {
                "--dtype": " (the graph keeps the precision it was exported in)",
                "--max-model-len": " (a request's tokens are bounded by the graph's K/V cache: export's "
                                   "--max-cache-len)"}.get(flag, ""))
    device = device_of(args)
    if device != "cpu":
        raise InputError(f"--runtime ort serves on the CPU (the engine's state rows are CPU tensors), not "
                         f"--device {device}; serve the checkpoint with --runtime torch on a GPU")
    input_file(args.onnx, "ONNX file")
    providers = ort_device.providers_for(ort_device.parse_device(device))
    check_file(args.onnx, args.ort_kernels, providers)  # an ort form this ONNX Runtime lacks
    from gdn_export.runtime.ort_runner import OrtRunner
    from gdn_export.runtime.ort_serving import OrtStepRunner, check_servable, graph_identity

    from gdn_export.vlm.detect import is_vlm_onnx

    if is_vlm_onnx(args.onnx):
        raise InputError(f"{args.onnx}: the language graph of a vision-language export (image inputs); serve "
                         f"the text model's graph (export --text-only)")
    family, vocab, layout = graph_identity(args.onnx)
    if (vocab and vocab != config.vocab_size) or (family is not None and family != config.family):
        raise InputError(f"{args.onnx} ({family}, vocab {vocab}) was not exported from {args.checkpoint} "
                         f"({config.family}, vocab {config.vocab_size})")
    check_servable(args.onnx, layout)
    _check_imports()

    progress = Progress("serve", args.quiet)
    limits = _limits(args)
    tokenizer = ServeTokenizer.load(args.checkpoint)
    _tokenizer_note(tokenizer, config, progress)
    sock = bind_socket(args.host, args.port)  # a taken port is said before the graph loads
    try:
        progress(f"loading {args.onnx} in ONNX Runtime on the CPU")
        runner = OrtStepRunner(OrtRunner(args.onnx, kernels=args.ort_kernels))
        if runner.vocab_size != config.vocab_size:
            raise InputError(f"{args.onnx} (vocab {runner.vocab_size}) was not exported from {args.checkpoint} "
                             f"(vocab {config.vocab_size})")
        progress(f"ort: {runner.kernels_note}")
        engine = _make_engine(args, runner, None, runner.layout.cache_len, limits, tokenizer, progress, "cpu")
        return _serve(args, engine, tokenizer, sock, progress)
    finally:
        sock.close()


def _check_flags(args) -> None:
    for flag, value in (("--max-num-seqs", args.max_num_seqs), ("--max-prefill-seqs", args.max_prefill_seqs),
                        ("--prefill-tokens", args.prefill_tokens), ("--max-queue", args.max_queue),
                        ("--max-model-len", args.max_model_len), ("--max-cached-tokens", args.max_cached_tokens)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {args.port}")
    if not args.drain_timeout >= 0:
        raise InputError(f"--drain-timeout must be >= 0 seconds, got {args.drain_timeout}")
    if args.max_prefill_seqs is None:
        args.max_prefill_seqs = min(DEFAULTS["max_prefill_seqs"], max(args.max_num_seqs, 1))
    elif args.max_prefill_seqs > args.max_num_seqs:
        raise InputError(f"--max-prefill-seqs ({args.max_prefill_seqs}) cannot exceed --max-num-seqs "
                         f"({args.max_num_seqs})")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise InputError("--served-model-name must not be empty")
    if args.speculative is not None and not 1 <= args.speculative <= 16:
        raise InputError(f"--speculative must be in [1, 16], got {args.speculative}")


def _check_imports() -> None:
    missing = []
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise InputError(f"serving needs {', '.join(missing)}: pip install 'gdn-export[serve]'")


def _engine(args, device, dtype, op_backend, max_len, limits, tokenizer, progress):
    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint

    progress(f"loading {args.checkpoint} ({dtype}) on {device}")
    model = load_checkpoint(args.checkpoint, dtype=torch_dtype(dtype))
    k = args.speculative
    # a speculative round writes up to 2K slots past a request's prompt + max_tokens
    model.layout = DeployLayout.make(cache_len=max_len + (2 * k if k else 0))
    runner = GraphRunner(model, device=device, op_backend=op_backend, cuda_graph=args.cuda_graph,
                         compile=args.compile)
    speculation = None
    if k:
        from gdn_export.serve.speculation import Speculation
        from gdn_export.weights.mtp import load_mtp

        speculation = Speculation(runner, load_mtp(args.checkpoint, model), k)
    return _make_engine(args, runner, speculation, max_len, limits, tokenizer, progress, device)


def _make_engine(args, runner, speculation, max_len, limits, tokenizer, progress, device):
    """The engine over `runner` (GraphRunner, or OrtStepRunner), its rows checked against the free
    memory first, its prefill warmed up."""
    from gdn_export.runtime.memory import available_bytes, size_text
    from gdn_export.serve.engine import Engine, pool_batch_sizes
    from gdn_export.serve.metrics import ServeMetrics
    from gdn_export.serve.tokenizer import eos_token_ids

    k = args.speculative
    rows = limits.max_num_seqs + limits.max_prefill_seqs
    need = rows * _row_bytes(runner, speculation)
    free = available_bytes(device)
    if free is not None and need > free:
        raise InputError(f"{rows} state rows (--max-num-seqs {limits.max_num_seqs} + --max-prefill-seqs "
                         f"{limits.max_prefill_seqs}) of {max_len} cache slots need {size_text(need)}; {device} "
                         f"has {size_text(free)} available: lower --max-num-seqs or --max-model-len")
    sizes = pool_batch_sizes(limits.max_num_seqs, runner.cuda_graph)
    if speculation is not None:
        how = f"; speculative rounds of K = {k} MTP drafts" + (
            f", capturing {len(sizes)} round graphs (batch {sizes[0]}..{sizes[-1]}; greedy rounds)"
            if speculation.cuda_graph else "")
    elif runner.cuda_graph:
        how = f"; capturing {len(sizes)} decode graphs (batch {sizes[0]}..{sizes[-1]})"
    else:
        how = ""
    progress(f"state rows: {rows} x {size_text(_row_bytes(runner, speculation))}{how}")
    engine = Engine(runner, limits, eos_ids=eos_token_ids(args.checkpoint, tokenizer), metrics=ServeMetrics(),
                    seed=args.seed, speculation=speculation)
    start = time.perf_counter()
    calls = engine.warm_up()
    progress(f"prefill warmed up ({calls} calls, {time.perf_counter() - start:.1f} s)")
    return engine


def _row_bytes(runner, speculation=None) -> int:
    """Bytes of one state row: the model's states, and with speculation the head's cache and catch-up."""
    import math

    import torch

    model = sum(math.prod(s.concrete_shape(1)) * torch.empty((), dtype=s.dtype).element_size()
                for s in runner.model.state_specs())
    extra = sum(t.numel() * t.element_size() for t in speculation.extra_states(1)) if speculation else 0
    return model + extra


def _serve(args, engine, tokenizer, sock, progress) -> int:
    from gdn_export.serve import server
    from gdn_export.serve.app import ServeConfig, create_app
    from gdn_export.serve.tokenizer import sampling_defaults

    name = args.served_model_name or Path(args.checkpoint).resolve().name
    config = ServeConfig(model_name=name, checkpoint=str(args.checkpoint), api_key=args.api_key,
                         sampling_defaults=sampling_defaults(args.checkpoint))
    app = create_app(engine, tokenizer, config)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    text = "text and token-id prompts" if tokenizer is not None else "token-id prompts only (no tokenizer)"
    progress(f"serving {name!r} at http://{shown}:{port}/v1 ({text}; max {engine.sched.limits.max_num_seqs} "
             f"running, {engine.cache_len} tokens each)")
    sys.stderr.flush()
    # The engine thread waits for the GIL while the HTTP thread writes events; Python's default
    # switch interval (5 ms) is longer than a decode step on a GPU (2-4 ms for a 1.66B model).
    sys.setswitchinterval(0.001)
    return server.run(app, engine, sock, args.drain_timeout, log_level=args.log_level,
                      access_log=not args.no_access_log)
