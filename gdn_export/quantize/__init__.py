"""`gdn-export quantize`: calibrate a 16-bit checkpoint with NVIDIA ModelOpt and write it in
ModelOpt's unified Hugging Face form (fp8: FP8 weights per channel + static per-tensor FP8
activations; int4-awq: W4A16 with AWQ, groups of 128). See docs/quantization.md.

    calib_data.py   calibration tokens: a text file (the checkpoint's tokenizer), a token file
                    (.npy or whitespace-separated ids) or the built-in default
    calibrate.py    ModelOpt calibration (mtq.quantize) -> per-Linear quantized tensors; `apply`
                    swaps them into a model as gdn_export.modules.quant_linear layers
    experts.py      the routed experts: per-expert activation ranges recorded during the same
                    forward loop, FP8 per channel / INT4 round-to-nearest, written per expert
    writer.py       the quantized checkpoint folder (config.json quantization_config,
                    hf_quant_config.json, model.safetensors), written atomically
    bench.py        `bench --quant`: the 16-bit and the quantized model timed side by side
"""

FORMATS = ("fp8", "int4-awq")
