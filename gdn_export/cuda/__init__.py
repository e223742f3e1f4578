"""The `cuda` backend of the gdn ops: our CUDA kernels (plugins/*/…Kernels.cu) as a PyTorch extension.

    extension.cpp   torch binding; checks every tensor and names the one that is wrong
    backend.py      gated_delta_rule / causal_conv1d with the backend contract, in-place decode
                    variants, and the lazy build (torch.utils.cpp_extension.load)

The same kernel sources serve the TensorRT plugins, so testing this backend tests the plugin kernels.
The extension is compiled on first use for the running GPU's architecture into
~/.cache/gdn_export/cuda_ext (override with GDN_EXPORT_CUDA_BUILD_DIR); nothing is built at import.
"""
