"""Backend-neutral runners behind one interface: torch (the model), ONNX Runtime, TensorRT.

    base.py          Runner (abstract), StateInfo, input checks, greedy `generate`
    torch_runner.py  TorchRunner: HybridForCausalLM in PyTorch
    cuda_graph.py    GraphRunner: the same with static states and CUDA-graph decode (the GPU fast path)
    speculative.py   SpeculativeDecoder: drafts from the checkpoint's MTP head, verified by the model
                     (TorchRunner / GraphRunner; docs/speculative.md)
    bench.py         timing / accuracy helpers of `gdn-export bench` (spec_bench.py: its --speculative)
    ort_runner.py    OrtRunner: an exported .onnx in ONNX Runtime (gdn bodies attached at load)
"""

from gdn_export.runtime.base import GenerationResult, Runner, StateInfo, generate

__all__ = ["GenerationResult", "Runner", "StateInfo", "generate"]
