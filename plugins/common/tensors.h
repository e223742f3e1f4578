/*
 * TensorRT tensor descriptions -> kernel parameters: data types and dims, for messages and checks.
 */
#pragma once

#include "gated_delta_rule/cuda/gatedDeltaRuleKernels.h" // gdn::DataType

#include <NvInferRuntime.h>

#include <string>

namespace gdn
{
namespace plugin
{

//! "kFLOAT", "kHALF", "kBF16", ... for messages.
char const* dataTypeName(nvinfer1::DataType type) noexcept;

//! True for the activation dtypes the kernels take: fp32, fp16, bf16.
bool isKernelFloat(nvinfer1::DataType type) noexcept;

//! The kernels' dtype; throws PluginError naming `what` for anything but fp32 / fp16 / bf16.
gdn::DataType toKernelDataType(nvinfer1::DataType type, char const* what);

//! "[2, -1, 16, 128]".
std::string dimsToString(nvinfer1::Dims const& dims);

//! Number of elements (0 if a dim is <= 0).
int64_t volume(nvinfer1::Dims const& dims) noexcept;

//! Bytes of one element of fp32 / fp16 / bf16 (0 for others).
size_t elementSize(nvinfer1::DataType type) noexcept;

//! dims.d[i] as int32, throwing PluginError naming `what` if it is negative or too large.
int32_t dimAsInt32(nvinfer1::Dims const& dims, int32_t i, char const* what);

} // namespace plugin
} // namespace gdn
