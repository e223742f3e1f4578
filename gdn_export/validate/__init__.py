"""Parity checks between the PyTorch model, ONNX Runtime and TensorRT."""

from gdn_export.validate.compare import DEFAULT_TOLERANCES, Report, Tolerances, run_parity
from gdn_export.validate.report import format_table, write_json

__all__ = ["DEFAULT_TOLERANCES", "Report", "Tolerances", "format_table", "run_parity", "write_json"]
