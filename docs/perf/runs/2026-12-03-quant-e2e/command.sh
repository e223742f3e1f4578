#!/usr/bin/env bash
# Final GPU call: quantized checkpoints (made by gdn-export quantize) benched beside bf16 on the 1.66B shape.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=$PWD:/tmp/site
O=/tmp/res; rm -rf $O; mkdir -p $O; S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
[ -f /tmp/ck/model.safetensors ] || timeout 150 python3 benchmarks/make_random_checkpoint.py /tmp/ck --size 1.6b > $O/make.log 2>&1 || echo "make failed" >&2
echo "[$(el)s] checkpoint made" >&2
(timeout 330 python3 -m gdn_export quantize /tmp/ck -o /tmp/ck8 --format fp8 --calib-samples 2 --calib-seq-len 128 > $O/q8.log 2>&1; echo "fp8 quantize rc=$? at $(el)s" >&2) &
(timeout 330 python3 -m gdn_export quantize /tmp/ck -o /tmp/ck4 --format int4-awq --calib-samples 2 --calib-seq-len 128 > $O/q4.log 2>&1; echo "int4 quantize rc=$? at $(el)s" >&2) &
B="--device cuda --dtype bf16 --op-backend triton --decode-steps 32 --warmup 1 --repeats 3"
bench() { # name ckpt limit flags
  local n=$1 c=$2 l=$3; shift 3
  timeout $l python3 -m gdn_export bench $c $B "$@" --json $O/$n.json > $O/$n.md 2> $O/$n.log; echo "[$(el)s] $n rc=$?" >&2; tail -n 2 $O/$n.log >&2
}
bench bf16-b1 /tmp/ck 120 --batch 1 --prompt-len 4096
bench bf16-b32 /tmp/ck 90 --batch 32 --prompt-len 256
wait
for q in 8 4; do
  [ -f /tmp/ck$q/config.json ] || continue
  bench q$q-b1 /tmp/ck$q 100 --batch 1 --prompt-len 4096
  bench q$q-b32 /tmp/ck$q 80 --batch 32 --prompt-len 256
done
python3 - <<'PY' > $O/table.md
import json, os, glob
O = "/tmp/res"
rows = {}
for f in sorted(glob.glob(f"{O}/*.json")):
    d = json.load(open(f)); rows[os.path.basename(f)[:-5]] = d
print("| run | prefill ms | decode ms/step | peak GiB | weights GiB |")
print("|---|---|---|---|---|")
for k, d in rows.items():
    g = lambda key: d.get(key) if not isinstance(d.get(key), dict) else None
    print(f"| {k} | {d.get('prefill_ms')} | {d.get('decode_ms_per_step')} | {(d.get('peak_memory_bytes') or 0)/2**30:.2f} | {(d.get('weights_bytes') or 0)/2**30:.2f} |")
for b in ("b1", "b32"):
    base = rows.get(f"bf16-{b}")
    for q in ("q8", "q4"):
        r = rows.get(f"{q}-{b}")
        if base and r:
            print(f"{q} {b}: decode {r['decode_ms_per_step']/base['decode_ms_per_step']:.3f}x bf16, prefill {r['prefill_ms']/base['prefill_ms']:.3f}x")
PY
cat $O/table.md
echo "[$(el)s] accuracy" >&2
[ $(el) -lt 470 ] && timeout 60 python3 -c "
import torch
from gdn_export.weights import load_checkpoint
from gdn_export.quantize.accuracy import compare
b = load_checkpoint('/tmp/ck', 'bfloat16', 'cuda')
ids = torch.randint(0, b.config.vocab_size, (1, 128), device='cuda', generator=torch.Generator('cuda').manual_seed(0))
import os
for q in ('8', '4'):
    if os.path.exists(f'/tmp/ck{q}/config.json'):
        print('fp8' if q == '8' else 'int4-awq', compare(load_checkpoint(f'/tmp/ck{q}', 'bfloat16', 'cuda'), b, ids, 64))
" 2>&1 | tail -4 | tee $O/accuracy.txt
echo "[$(el)s] done" >&2
tail -n 3 $O/q8.log $O/q4.log >&2
tar czf $OUT/res.tgz -C $O .
