"""gdn-export: ONNX / TensorRT export and deployment of hybrid Gated DeltaNet language models."""

__version__ = "0.1.0"
