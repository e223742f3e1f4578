"""Parity checks between the PyTorch model, ONNX Runtime and TensorRT."""

from gdn_export.validate.compare import (DEFAULT_TOLERANCES, Report, Row, Tolerances,
                                        check_parity_sizes, run_parity)
from gdn_export.validate.report import format_table, write_json

__all__ = ["DEFAULT_TOLERANCES", "Report", "Row", "Tolerances", "check_parity_sizes", "format_table",
           "run_parity", "write_json"]
