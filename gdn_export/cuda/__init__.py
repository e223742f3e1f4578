"""The shared build of our CUDA kernels (kernels/<op>/cuda/*.cu) as one PyTorch extension.

    extension.cpp   torch binding; checks every tensor and names the one that is wrong
    extension.py    the lazy build and load (torch.utils.cpp_extension.load), and the checks every
                    op's wrapper makes before calling it

Each op's wrappers live beside the op (gdn_export/ops/<op>/cuda.py); the `cuda` backend
(gdn_export.ops.cuda_backend) gathers them. The same kernel sources serve the TensorRT plugins, so
testing this backend tests the plugin kernels. The extension is compiled on first use for the running
GPU's architecture into ~/.cache/gdn_export/cuda_ext (override with GDN_EXPORT_CUDA_BUILD_DIR);
nothing is built at import. This package imports nothing from gdn_export.ops.
"""
