#!/usr/bin/env bash
# Run 6, device call 3 (H200, right after call 2): FlashInfer 0.7.2 from the wheels staged by call 2
# plus .carry/fi2, the recurrent-state-dtype benchmark beside FlashInfer's bf16-state decode, then the
# end-to-end bench (gdn-export bench vs transformers on a 1.66B-class model). Results in $OUT/c.tgz.
set -u
out=$OUT/c; mkdir -p "$out" /tmp/fi; cp .carry/fi2/* /tmp/fi/ 2>/dev/null
( cd /tmp/fi && cat cu13.part.* > nvidia_cutlass_dsl_libs_cu13-4.7.1-cp312-cp312-manylinux_2_28_x86_64.whl \
  && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ./*.whl ) > "$out/flashinfer_install.log" 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" >> "$out/flashinfer_install.log" 2>&1
t=$SECONDS; timeout 170 python3 benchmarks/state_dtype_bench.py --out-dir "$out/state" > "$out/state.log" 2>&1
echo "state rc=$? $((SECONDS-t))s" > "$out/summary.txt"
E2E_SECONDS=$((560 - SECONDS)) PYTHON=python3 bash benchmarks/e2e_bench.sh "$out/e2e" > "$out/e2e.log" 2>&1
echo "e2e rc=$? $((SECONDS-t))s" >> "$out/summary.txt"
cat "$out/summary.txt"; tail -4 "$out/flashinfer_install.log"; tail -25 "$out/state.log"; tail -30 "$out/e2e.log"
cd "$out" && tar czf ../c.tgz . && cd .. && rm -rf c
