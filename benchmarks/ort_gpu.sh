#!/usr/bin/env bash
# ONNX Runtime's CUDA execution provider on the GPU (issue 42): the three ONNX forms beside gdn-export's
# own runtime (benchmarks/ort_gpu_forms.py), then onnxruntime-genai's builder and generator beside our
# forms (benchmarks/peer_ort_genai.py --device cuda). docs/onnx_forms.md and docs/perf/peer_ort_genai.md
# hold the results.
#
#   benchmarks/ort_gpu.sh [OUT]        # repo root; OUT defaults to $OUT, else /tmp/ort_gpu
#
# The onnxruntime-gpu 1.31.1 wheel (256 MB; CUDA 13 kernels, which torch 2.11 cu130's libraries serve)
# is more than one device call carries (64 MiB), so it travels split (`split -b 60000000 WHEEL
# .carry/ort/ortgpu.part.`) over calls made back to back on one warm machine, one part a call, each
# call this script: it keeps the parts it was given under /tmp/ort_wheel (which lives while the machine
# stays warm) and, with fewer than PARTS_N (default 5) there, says how many it has and stops. The call
# that brings the last part joins them, installs the wheel into /tmp/ortgpu (--no-deps: the image has
# onnxruntime's dependencies) and runs PHASES (default "probe forms peer"): `probe` the CUDA provider
# step by step (benchmarks/ort_gpu_probe.py: an Add model, then one GatedDeltaNet block), `forms` the three forms
# (ort_gpu_forms.py, BUDGET seconds, default 420), `peer` onnxruntime-genai-cuda's builder and
# generator (its wheel, .carry/ort/onnxruntime_genai_cuda-*.whl, carried in any of the calls; installed
# into /tmp/peer/site, first on the path of the image's python) against our three forms on a tiny
# random Qwen3.5. With the
# wheel installed already, a call runs PHASES at once (e.g. PHASES=peer in a call of its own).
set -u
FINAL=${1:-${OUT:-/tmp/ort_gpu}}
W=/tmp/ort_wheel
WHEEL=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
mkdir -p "$W" "$FINAL"
for f in .carry/ort/ortgpu.part.* .carry/ort/onnxruntime_genai_cuda-*.whl; do
  [ -f "$f" ] && cp -n "$f" "$W/"
done
if [ ! -d /tmp/ortgpu/onnxruntime ]; then
  have=$(ls "$W"/ortgpu.part.* 2>/dev/null | wc -l)
  if [ "$have" -lt "${PARTS_N:-5}" ]; then
    echo "ort_gpu: $have of ${PARTS_N:-5} wheel parts on this machine ($(cd "$W" && ls ortgpu.part.* 2>/dev/null | tr '\n' ' ')); carry the next"
    exit 0
  fi
  cat "$W"/ortgpu.part.* > "$W/$WHEEL"
  python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/ortgpu "$W/$WHEEL" > "$FINAL/pip.log" 2>&1 \
    || { echo "ort_gpu: the wheel did not install (see pip.log)"; tail -3 "$FINAL/pip.log"; exit 1; }
fi
# a crash prints the Python stack (ORT 1.31.1 + torch 2.11 cu130 on the H100, 2026-12-07: both
# ort_gpu_forms.py and the peer ended in a segmentation fault; `probe` localises it)
export PYTHONPATH=/tmp/ortgpu:$PWD PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
# torch's CUDA 13 libraries for the peer's process (ours find them with onnxruntime.preload_dlls())
NV=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib')))))" 2>/dev/null)
export LD_LIBRARY_PATH=${NV}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import onnxruntime as o; o.preload_dlls(); print('onnxruntime', o.__version__, o.get_available_providers())"
} 2>&1 | tee "$FINAL/gpu.txt"
for phase in ${PHASES:-probe forms peer}; do
  case $phase in
    probe)
      python3 benchmarks/ort_gpu_probe.py > "$FINAL/probe.log" 2>&1
      echo "probe exit $?"
      sed -n '/^| step/,$p' "$FINAL/probe.log" ;;
    forms)
      python3 benchmarks/ort_gpu_forms.py --out /tmp/ort_forms --budget "${BUDGET:-420}" > "$FINAL/forms.log" 2>&1
      echo "forms exit $?"
      cp /tmp/ort_forms/summary.json "$FINAL/forms.json" 2>/dev/null
      sed -n '/^| /,$p' "$FINAL/forms.log" ;;
    peer)
      genai=$(ls "$W"/onnxruntime_genai_cuda-*.whl 2>/dev/null | head -1)
      if [ -z "$genai" ]; then echo "ort_gpu: no onnxruntime_genai_cuda wheel carried; peer skipped"; continue; fi
      if [ ! -x /tmp/peer/python ]; then  # the image's python with the peer's package first on its path
        python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/peer/site "$genai" \
          > "$FINAL/peer_pip.log" 2>&1 || { echo "ort_gpu: onnxruntime-genai did not install"; continue; }
        printf '#!/bin/sh\nPYTHONPATH=/tmp/peer/site:$PYTHONPATH exec %s "$@"\n' "$(command -v python3)" > /tmp/peer/python
        chmod +x /tmp/peer/python
      fi
      timeout "${PEER_S:-240}" python3 benchmarks/peer_ort_genai.py --peer-python /tmp/peer/python --device cuda \
        --out "$FINAL/peer.md" > "$FINAL/peer.log" 2>&1
      echo "peer exit $?"
      cat "$FINAL/peer.md" 2>/dev/null || tail -5 "$FINAL/peer.log" ;;
    *) echo "ort_gpu: unknown phase $phase" ;;
  esac
done
