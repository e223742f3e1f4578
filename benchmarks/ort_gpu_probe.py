"""Where onnxruntime-gpu's CUDA provider fails in this environment, step by step (issue 42).

    python3 benchmarks/ort_gpu_probe.py [--provider CUDAExecutionProvider|CPUExecutionProvider]

Each step runs in a child process with faulthandler on, so a crash (ORT 1.31.1 on the H100 with torch
2.11 cu130, 2026-12-07: a segmentation fault in both ort_gpu_forms.py and the onnxruntime-genai peer)
names its step and prints the Python stack instead of ending the probe:

  add              an Add model, onnxruntime imported alone (preload_dlls() first)
  add-torch        the same after torch has initialised CUDA (the order gdn-export's runner uses)
  add-torch-no-preload  the same without preload_dlls() (torch's CUDA libraries only)
  gdn-ort-<dtype>  one com.microsoft GatedDeltaNet block (gdn_export.onnx.ort_form.to_ort of a single
                   gdn::GatedDeltaRule node) in fp32 / fp16, against the CPU provider's output

One line per step (OK, or the exit status and the last lines of its output), a table last.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ADD = """
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
if {torch_first}:
    import torch
    torch.zeros(1, device="cuda")
if {preload}:
    getattr(ort, "preload_dlls", lambda: None)()
vi = helper.make_tensor_value_info
f4 = lambda name: vi(name, TensorProto.FLOAT, [4])
g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "add", [f4("a"), f4("b")], [f4("c")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
s = ort.InferenceSession(m.SerializeToString(), providers=["{provider}"])
print("providers", s.get_providers())
x = np.arange(4, dtype=np.float32)
assert (s.run(None, {{"a": x, "b": x}})[0] == 2 * x).all()
print("OK")
"""

GDN = """
import numpy as np, onnx, onnxruntime as ort, torch
getattr(ort, "preload_dlls", lambda: None)()
sys_path = {root!r}
import sys; sys.path.insert(0, sys_path)
from gdn_export.onnx.ort_form import to_ort
from gdn_export.onnx.schemas import register_schemas
from gdn_export.ops.gated_delta_rule import INPUT_NAMES, OUTPUT_NAMES, PLUGIN_NAME
from tests.conftest import gdn_inputs
register_schemas()
dt = {dtype!r}
elem = onnx.TensorProto.FLOAT if dt == "fp32" else onnx.TensorProto.FLOAT16
tdt = torch.float32 if dt == "fp32" else torch.float16
B, T, Hk, Hv, D = 2, 70, 2, 4, 64
vi = onnx.helper.make_tensor_value_info
f = onnx.TensorProto.FLOAT
spec = dict(q=(elem, [B, T, Hk, D]), k=(elem, [B, T, Hk, D]), v=(elem, [B, T, Hv, D]), g=(f, [B, T, Hv]),
            beta=(elem, [B, T, Hv]), initial_state=(f, [B, Hv, D, D]))
node = onnx.helper.make_node(PLUGIN_NAME, list(INPUT_NAMES), list(OUTPUT_NAMES), domain="gdn", plugin_version="1",
                             plugin_namespace="gdn", scale=D ** -0.5, use_qk_l2norm=1)
graph = onnx.helper.make_graph([node], "gdr", [vi(n, *spec[n]) for n in INPUT_NAMES],
                               [vi(OUTPUT_NAMES[0], elem, None), vi(OUTPUT_NAMES[1], f, None)])
model = to_ort(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                              onnx.helper.make_opsetid("gdn", 1)]))
x = gdn_inputs(B, T, Hk, Hv, D, D, dtype=tdt, seed=0, correlated=True)
feeds = {{n: x[n].numpy() for n in INPUT_NAMES}}
feeds["g"] = x["g"].float().numpy()
feeds["initial_state"] = x["initial_state"].float().numpy()
cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
print("cpu done", flush=True)
s = ort.InferenceSession(model.SerializeToString(), providers=["{provider}"])
print("providers", s.get_providers(), flush=True)
out = s.run(None, feeds)
for name, a, b in zip(OUTPUT_NAMES, out, cpu):
    a, b = a.astype(np.float64), b.astype(np.float64)
    print(name, "relative RMS vs CPU", float(np.linalg.norm(a - b) / np.linalg.norm(b)))
print("OK")
"""


def step(name: str, code: str, timeout: float) -> tuple[str, str]:
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                           timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    out = (r.stdout + r.stderr).strip().splitlines()
    status = "OK" if r.returncode == 0 and out and out[-1] == "OK" else f"exit {r.returncode}"
    tail = "\n".join(out[-25:])
    print(f"== {name}: {status}\n{tail}\n", flush=True)
    return status, next((line for line in out if "relative RMS" in line), "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default="CUDAExecutionProvider")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args(argv)
    rows = []
    on_gpu = args.provider != "CPUExecutionProvider"  # torch initialises CUDA first only where there is one
    for name, code in (("add", ADD.format(torch_first=False, preload=True, provider=args.provider)),
                       ("add-torch", ADD.format(torch_first=on_gpu, preload=True, provider=args.provider)),
                       ("add-torch-no-preload", ADD.format(torch_first=on_gpu, preload=False, provider=args.provider)),
                       ("gdn-ort-fp32", GDN.format(root=ROOT, dtype="fp32", provider=args.provider)),
                       ("gdn-ort-fp16", GDN.format(root=ROOT, dtype="fp16", provider=args.provider))):
        rows.append((name, *step(name, code, args.timeout)))
    print(f"| step ({args.provider}) | result | note |\n|---|---|---|")
    for name, status, note in rows:
        print(f"| {name} | {status} | {note} |")
    return 0 if all(s == "OK" for _, s, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
