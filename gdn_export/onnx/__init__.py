"""ONNX export of hybrid GDN models: one graph for prefill and decode with `gdn` custom nodes.

    export.py     export_onnx(model, path): torch dynamo exporter -> checked, atomic .onnx file
    schemas.py    register the gdn.* OpSchemas with the `onnx` package (checker, shape inference)
    functions.py  attach standard-ONNX bodies of the gdn.* ops in memory, for ONNX Runtime
    metadata.py   the metadata_props that let a runtime read the state layout from the file
    checks.py     the exported file is exactly what TensorRT's parser maps to plugins
"""

from gdn_export.onnx.export import ONNX_OPSET, export_onnx
from gdn_export.onnx.functions import attach_reference_functions
from gdn_export.onnx.schemas import register_schemas

__all__ = ["ONNX_OPSET", "attach_reference_functions", "export_onnx", "register_schemas"]
