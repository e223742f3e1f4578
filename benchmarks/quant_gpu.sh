#!/usr/bin/env bash
# Quantized models on one GPU in one device call of <= 9 minutes (issue 39): the GPU tests of the
# quantized kernels and the eager glue kernels (norm, silu * up, GDN gating, rotary), the kernel
# table (GB/s against the copy bandwidth beside bf16 F.linear and torch._scaled_mm) and the
# end-to-end `gdn-export bench --quant` ratios against bf16, one short table printed last.
# docs/perf/quantization.md holds the results and the command.
#
#   benchmarks/quant_gpu.sh [OUT]        # repo root; OUT defaults to $OUT, else /tmp/quant_gpu
#
# OUT receives four files (the device tool brings back at most eight): table.md (printed last),
# sweep.md and kernels.md (the launch sweep and the full kernel table) and quant_gpu.tgz (every log
# and JSON file of the run).
#
# Environment: PARTS, run in the order given (default "tests sweep kernels e2e"; "sweep" times the
# skinny-GEMM launch parameters and int4_dequant's tile and the later parts use the fastest,
# "profile" a torch.profiler pass over bf16 / fp8 / int4-awq prefills (4096 tokens) and decode steps after a
# 4096-token prompt (the e2e batch-1 depth, so the decode attention kernel runs),
# benchmarks/decode_profile.py on checkpoints that `gdn-export quantize` writes on the GPU; PROFILES
# the models, default "bf16 fp8 int4-awq", "fp8lm" is fp8 with --quantize-lm-head; PROFILE_MODES
# default "decode prefill"; PROFILE_BATCH the decode profiles' batch, default 1, each row's prompt 4096 /
# PROFILE_BATCH tokens, at least 256: the e2e batch-32 rows' length), SWEEP_CONFIGS
# (the first N launch configurations of the sweep), TESTS_S (seconds for the GPU tests, default 160; a
# failing test is named in tests.txt as it fails),
# BUDGET (seconds for the whole script, default 520), LAYERS (default 24: the full 1.66B Qwen3.5
# with its 248320 vocabulary; fewer layers cut the vocabulary by the same factor), RUNS (the
# end-to-end runs in order, default below), CK (checkpoint folder, default /tmp/quant_gpu_ck).
# Needs NVIDIA ModelOpt for the end-to-end part: installed from the wheels in .whl/ (an ignored
# folder carried with the tree: nvidia_modelopt 0.47.0 and the pure-Python dependencies the device
# image lacks: omegaconf, pulp, pydantic, pydantic_core, annotated_types, typing_inspection) into
# /tmp/site when `import modelopt` fails.
#
# End-to-end runs (each one `gdn-export bench --quant FMT` on the 16-bit checkpoint: ModelOpt
# calibration on the GPU with 2 rows of 128 random ids, the bf16 model timed, the quantized one
# timed and compared over 64 teacher-forced greedy steps; CUDA graphs, triton ops, 32 decode steps,
# medians of 3 after 1 warm-up), in the order of RUNS while the budget lasts. A run's name is its
# parts joined by "-": the format (fp8, int4-awq, fp8lm: fp8 with --quantize-lm-head), the batch
# (b1: one 4096-token prompt; b32: 32 prompts of 256 tokens), then optionally "skinny" (M <= 64 to the
# skinny GEMM of triton/skinny.py, the default route; without it the routes before it),
# "compile" (--compile), "unfused" (the PyTorch forms of the RMSNorms, the MLP's silu(gate) * up,
# the GDN gating and the rotary instead of their fused eager kernels: gdn_export.ops.backends.FUSED)
# "pdl" (our Triton kernels with programmatic dependent launch: kernels.triton_utils.PDL) and
# "fastacc" (the FP8 prefill GEMMs with cuBLASLt's fast accumulation: kernels.quant_linear.gpu.FP8_FAST_ACCUM).
# The default: the skinny runs of every format first, fp8 compiled, then the batch-1 runs without
# the skinny GEMM.
# The archive holds tests.log, kernels.{json,md,log}, e2e.log, <run>.{json,md}, gpu.txt and table.md.
set -u
FINAL=${1:-${OUT:-/tmp/quant_gpu}}
OUT=$(mktemp -d /tmp/quant_gpu_run.XXXX)
PARTS=${PARTS:-tests sweep kernels e2e}
BUDGET=${BUDGET:-520}
LAYERS=${LAYERS:-24}
VOCAB=${VOCAB:-$(( (248320 * LAYERS / 24 + 127) / 128 * 128 ))}
RUNS=${RUNS:-fp8-b1-skinny int4-awq-b1-skinny fp8lm-b1-skinny fp8-b1-skinny-compile fp8-b32-skinny int4-awq-b32-skinny fp8-b1 int4-awq-b1 fp8lm-b1}
CK=${CK:-/tmp/quant_gpu_ck}
PROFILE_BATCH=${PROFILE_BATCH:-1}                      # the decode profiles' batch
KM=${KM:-1 32 4096}                                    # the kernel table's rows M
KSHAPES=${KSHAPES:-}                                   # its shapes (names in quant_linear_bench.py; default all)
SWEEP_CONFIGS=${SWEEP_CONFIGS:-3}
TESTS_S=${TESTS_S:-160}                                # seconds for the GPU tests at most
TESTS=${TESTS:-tests/modules/test_norm_fp8.py tests/runtime/test_glue_kernels.py tests/ops/output_gate tests/ops/rms_norm tests/ops/silu_mul tests/ops/rotary tests/ops/gated_delta_rule/test_gating.py tests/ops/quant_linear tests/ops/moe_quant}   # TEST_K: a pytest -k expression
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/quant_gpu_triton}
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
left() { echo $(( BUDGET - $(el) )); }
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
mkdir -p "$FINAL"
export PYTHONPATH=$PWD
[ -d /tmp/site/modelopt ] && export PYTHONPATH=$PWD:/tmp/site   # installed by an earlier call on this machine
if { has e2e || has profile; } && ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('modelopt') is None)"; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.log" 2>&1 && export PYTHONPATH=$PWD:/tmp/site || echo "ModelOpt not installable from .whl/ (see $OUT/pip.log)" >&2
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt" >&2

# ------------------------------------------------------------------ the checkpoint (in the background:
# on the GPU by default, beside the first part; MAKE_DEVICE=cpu leaves the GPU to it)
if { has e2e || has profile; } && [ ! -f "$CK/model.safetensors" ]; then
  ( python3 benchmarks/make_random_checkpoint.py "$CK" --size 1.6b --device "${MAKE_DEVICE:-cuda}" --layers "$LAYERS" --vocab "$VOCAB" \
    > "$OUT/make.log" 2>&1 || echo "make_random_checkpoint failed" >> "$OUT/make.log" ) &
  MAKE_PID=$!
fi

# ------------------------------------------------------------------ GPU tests
part_tests() {
  echo "[$(el)s] tests" >&2
  timeout $(( $(left) > TESTS_S ? TESTS_S : $(left) )) python3 -m pytest -v -m gpu -n 8 -p no:cacheprovider \
    ${TEST_K:+-k "$TEST_K"} $TESTS > "$OUT/tests.log" 2>&1
  echo "tests exit $?: $(tail -1 "$OUT/tests.log")" > "$OUT/tests.txt"
  grep -E "^\[gw[0-9]+\].* (FAILED|ERROR) " "$OUT/tests.log" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | sort -u >> "$OUT/tests.txt"
  cat "$OUT/tests.txt" >&2
}

# ------------------------------------------------------------------ launch sweep and kernel table
part_sweep() {
  echo "[$(el)s] sweep" >&2
  timeout $(( $(left) > 100 ? 100 : $(left) )) python3 benchmarks/quant_linear_bench.py --sweep-skinny --sweep-only \
    ${SWEEP_CONFIGS:+--sweep-configs $SWEEP_CONFIGS} --tuned "$OUT/tuned.json" > "$OUT/sweep.md" 2> "$OUT/sweep.log"
  echo "[$(el)s] sweep exit $?" >&2
}
part_kernels() {
  echo "[$(el)s] kernels" >&2
  TUNED=""; [ -f "$OUT/tuned.json" ] && TUNED="--tuned $OUT/tuned.json"
  timeout $(( $(left) > 130 ? 130 : $(left) )) python3 benchmarks/quant_linear_bench.py --m $KM --json "$OUT/kernels.json" \
    ${KSHAPES:+--shapes $KSHAPES} $TUNED > "$OUT/kernels.md" 2> "$OUT/kernels.log"
  echo "[$(el)s] kernels exit $?" >&2
}

# ------------------------------------------------------------------ end to end
part_e2e() {
  [ -n "${MAKE_PID:-}" ] && wait "$MAKE_PID" && MAKE_PID=
  echo "[$(el)s] e2e: checkpoint $(tail -1 "$OUT/make.log" 2>/dev/null)" >&2
  timeout $(( $(left) > 10 ? $(left) : 10 )) python3 - "$CK" "$OUT" "$(( $(left) - 5 ))" $RUNS > "$OUT/e2e.log" 2>&1 <<'PY'
import contextlib, signal, sys, time
import torch
from gdn_export.cli.main import main

ck, out, budget, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
t0 = time.time()
import json, os
if os.path.exists(f"{out}/tuned.json"):  # the sweep's launch parameters (quant_linear_bench.py --sweep-skinny)
    sys.path.insert(0, "benchmarks")
    from quant_linear_bench import apply_tuned
    apply_tuned(json.load(open(f"{out}/tuned.json")))
    print(f"tuned launch parameters: {open(f'{out}/tuned.json').read()}", flush=True)
base = ["--device", "cuda", "--dtype", "bf16", "--op-backend", "triton", "--cuda-graph", "--decode-steps", "32",
        "--warmup", "1", "--repeats", "3", "--calib-samples", "2", "--calib-seq-len", "128", "--quant-steps", "64"]
RUN = {"b1": ["--batch", "1", "--prompt-len", "4096"], "b32": ["--batch", "32", "--prompt-len", "256"]}


class OutOfTime(Exception):
    pass


def alarm(*_):
    raise OutOfTime()


signal.signal(signal.SIGALRM, alarm)
from kernels.quant_linear import gpu as quant_gpu
from kernels import triton_utils
from gdn_export.ops import backends

for name in runs:
    parts = name.split("-")
    fmt = "-".join(p for p in parts if not p.startswith("b") and p not in ("compile", "skinny", "unfused", "pdl", "fastacc"))
    quant_gpu.SKINNY_DECODE = "skinny" in parts  # M <= 64 through triton/skinny.py
    backends.FUSED = "unfused" not in parts  # the eager glue kernels (docs/backends.md) or their PyTorch forms
    triton_utils.PDL = "pdl" in parts  # programmatic dependent launch of our Triton kernels (kernels/triton_utils.py)
    quant_gpu.FP8_FAST_ACCUM = "fastacc" in parts  # cuBLASLt's fast accumulation in the FP8 prefill GEMMs
    lm = fmt.startswith("fp8lm")
    fmt = "fp8" if lm else fmt
    batch = next(p for p in parts if p.startswith("b"))
    args = ["bench", ck, *base, "--quant", fmt, *RUN[batch], "--json", f"{out}/{name}.json"]
    args += ["--quantize-lm-head"] if lm else []
    args += ["--compile"] if "compile" in parts else []
    left = int(budget - (time.time() - t0))
    if left < 40:
        print(f"[{time.time() - t0:.0f}s] {name} skipped: {left}s of the budget left", flush=True)
        continue
    torch._dynamo.reset()
    signal.alarm(left)
    start = time.time()
    try:
        with open(f"{out}/{name}.md", "w") as md, contextlib.redirect_stdout(md):
            code = main(args)
    except OutOfTime:
        code = "out of time"
    except (Exception, SystemExit) as exc:  # one failed run must not cost the others
        code = f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
    print(f"[{time.time() - t0:.0f}s] {name}: {code} ({time.time() - start:.0f}s)", flush=True)
PY
  echo "[$(el)s] e2e exit $?" >&2
}

# ------------------------------------------------------------------ profiles
part_profile() {
  [ -n "${MAKE_PID:-}" ] && wait "$MAKE_PID" && MAKE_PID=
  echo "[$(el)s] profile" >&2
  for fmt in ${PROFILES:-fp8 int4-awq}; do
    [ "$fmt" = bf16 ] && continue
    q="--format $fmt"; [ "$fmt" = fp8lm ] && q="--format fp8 --quantize-lm-head"
    [ "$(left)" -gt 40 ] && timeout $(( $(left) - 20 )) python3 -m gdn_export quantize "$CK" -o "$CK-$fmt" $q \
      --device cuda --calib-samples 2 --calib-seq-len 128 --overwrite > "$OUT/quantize-$fmt.log" 2>&1
  done
  for name in ${PROFILES:-bf16 fp8 int4-awq}; do
    ck=$CK; [ $name != bf16 ] && ck=$CK-$name
    [ -f "$ck/config.json" ] || continue
    TUNED=""; [ -f "$OUT/tuned.json" ] && TUNED="--tuned $OUT/tuned.json"
    case " ${PROFILE_MODES:-decode prefill} " in *" decode "*) ;; *) false;; esac && [ "$(left)" -gt 40 ] && timeout $(( $(left) - 20 )) python3 benchmarks/decode_profile.py "$ck" --steps 20 \
      --batch "$PROFILE_BATCH" --prompt-len $(( 4096 / PROFILE_BATCH > 256 ? 4096 / PROFILE_BATCH : 256 )) $TUNED --out "$OUT/prof-$name-decode" \
      > "$OUT/prof-$name-decode.log" 2>&1
    case " ${PROFILE_MODES:-decode prefill} " in *" prefill "*) ;; *) false;; esac && [ "$(left)" -gt 30 ] && \
      timeout $(( $(left) - 10 )) python3 benchmarks/decode_profile.py "$ck" --prefill \
      --steps 2 --prompt-len 4096 $TUNED --out "$OUT/prof-$name-prefill" > "$OUT/prof-$name-prefill.log" 2>&1
  done
  echo "[$(el)s] profile done" >&2
}

for part in $PARTS; do
  [ "$(left)" -gt 20 ] || { echo "[$(el)s] $part skipped: out of budget" >&2; continue; }
  "part_$part"
done

# ------------------------------------------------------------------ the table
python3 - "$OUT" "$LAYERS" "$VOCAB" > "$OUT/table.md" <<'PY'
import glob, json, os, sys
out, layers, vocab = sys.argv[1:4]
gpu = open(os.path.join(out, "gpu.txt")).read().strip().replace("\n", "; ")
print(f"{gpu}")
if os.path.exists(os.path.join(out, "tests.txt")):
    print(open(os.path.join(out, "tests.txt")).read().strip())
if os.path.exists(os.path.join(out, "tuned.json")):
    print("tuned launch parameters:", json.dumps(json.load(open(os.path.join(out, "tuned.json")))))
k = os.path.join(out, "kernels.json")
if os.path.exists(k):
    d = json.load(open(k))
    print(f"\nKernels: per 1.66B decode step (fused shapes x counts), us, ratio to bf16; copy {d['copy_tbps']:.2f} TB/s")
    meths = ["bf16", "fp8", "fp8_skinny", "fp8_scaled_mm", "fp8_block", "fp8_block_skinny", "int4", "int4_skinny",
             "int4_skinny_shifts", "int4_shifts"]
    print("| M | " + " | ".join(meths) + " |\n|---|" + "---|" * len(meths))
    for M in sorted({r["M"] for r in d["rows"]}):
        sel = [r for r in d["rows"] if r["M"] == M]
        tot = {m: sum(r["us"][m] * r["count"] for r in sel) if all(m in r["us"] for r in sel) else None for m in meths}
        b = tot["bf16"]
        print(f"| {M} | " + " | ".join("-" if tot[m] is None else f"{tot[m]:.0f}" + ("" if m == "bf16" or not b else
                                       f" ({tot[m] / b:.2f})") for m in meths) + " |")
runs = sorted(glob.glob(os.path.join(out, "*-b*.json")))
if runs:
    print(f"\nEnd to end: Qwen3.5 1.66B shapes, {layers} layers, vocab {vocab}; bf16 vs quantized in the same run "
          "(CUDA graphs, triton ops); accuracy vs bf16 on random weights")
    print("| run | bf16 prefill ms | quant prefill ms | prefill ratio | bf16 decode ms | quant decode ms | decode ratio "
          "| peak ratio | greedy agreement |")
    print("|---|---|---|---|---|---|---|---|---|")
    for f in runs:
        d = json.load(open(f)); q = d["quant"]; r = q["ratios"]; a = q["vs_16bit"]
        print(f"| {os.path.basename(f)[:-5]} | {d['prefill_ms']:.2f} | {q['prefill_ms']:.2f} | {r['prefill_ms']:.3f} "
              f"| {d['decode_ms_per_step']:.3f} | {q['decode_ms_per_step']:.3f} | {r['decode_ms_per_step']:.3f} "
              f"| {r['peak_memory_bytes']:.3f} | {a['greedy_agreement']:.3f} |")
profs = sorted(glob.glob(os.path.join(out, "prof-*", "decode_profile.json")))
if profs:
    print("\nProfiles (torch.profiler; ms per decode step, or per 4096-token prefill): wall / kernels busy; groups")
    for f in profs:
        d = json.load(open(f))
        groups = ", ".join(f"{k} {v['ms_per_step']:.3f}" for k, v in
                           sorted(d["groups"].items(), key=lambda kv: -kv[1]["ms_per_step"])[:6])
        host = f" (host {d['host_ms_per_step']:.3f})" if d.get("host_ms_per_step") else ""
        print(f"- {os.path.basename(os.path.dirname(f))}: {d['wall_ms_per_step']:.3f}{host} / {d['kernel_busy_ms_per_step']:.3f} "
              f"({d['kernels_per_step']:.0f} kernels); {groups}")
PY
echo "[$(el)s] done" >&2
tar czf "$FINAL/quant_gpu.tgz" -C "$OUT" . 2>/dev/null
cp "$OUT/table.md" "$FINAL/"
[ -f "$OUT/sweep.md" ] && cp "$OUT/sweep.md" "$FINAL/" && cat "$OUT/sweep.md"
[ -f "$OUT/kernels.md" ] && cp "$OUT/kernels.md" "$FINAL/" && cat "$OUT/kernels.md"
echo
cat "$OUT/table.md"
