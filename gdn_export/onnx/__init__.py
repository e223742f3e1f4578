"""ONNX export of hybrid GDN models: one graph for prefill and decode with `gdn` custom nodes.

    export.py     export_onnx(model, path): torch dynamo exporter -> checked, atomic .onnx file
    schemas.py    register the gdn.* OpSchemas with the `onnx` package (checker, shape inference)
    functions.py  attach standard-ONNX bodies of the gdn.* ops in memory, for ONNX Runtime
    metadata.py   the metadata_props that let a runtime read the state layout from the file
    checks.py     the exported file is exactly what TensorRT's parser maps to plugins
    forms.py      the three forms of the GDN layers (--onnx-ops gdn | standard | ort), which a file is
    standard_ops.py / ort_form/   the rewrites of a gdn-form file to the standard / ort form
    ort_native.py what ONNX Runtime loads for a file of any form (kernels or function bodies)
"""

import importlib

# Imported on first use: export.py pulls in torch (~2.5 s), while metadata.py and the files-only
# modules serve processes that need no torch (the TensorRT build's child process).
_EXPORTS = {"ONNX_OPSET": "export", "export_onnx": "export", "attach_reference_functions": "functions",
            "register_schemas": "schemas"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"gdn_export.onnx.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'gdn_export.onnx' has no attribute {name!r}")
