"""Backend-neutral runners behind one interface: torch (the model), ONNX Runtime, TensorRT.

    base.py          Runner (abstract), StateInfo, input checks, greedy `generate`
    torch_runner.py  TorchRunner: HybridForCausalLM in PyTorch
    cuda_graph.py    GraphRunner: the same with static states and CUDA-graph decode (the GPU fast path)
    bench.py         timing / accuracy primitives of `gdn-export bench`
    bench_checkpoint.py  what `bench` measures on a checkpoint (fast runner, fp32 accuracy, transformers)
    bench_ort.py     what `bench --runtime ort` measures on an exported file
    speculative.py   SpeculativeDecoder: drafts from the checkpoint's MTP head, verified by the model
                     (TorchRunner / GraphRunner; docs/speculative.md)
    ort_runner.py    OrtRunner: an exported .onnx in ONNX Runtime (gdn bodies attached at load)
    ort_log.py       ONNX Runtime's warnings folded into one summary line
"""

from gdn_export.runtime.base import GenerationResult, Runner, StateInfo, generate

__all__ = ["GenerationResult", "Runner", "StateInfo", "generate"]
