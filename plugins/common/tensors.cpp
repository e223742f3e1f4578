#include "tensors.h"

#include "checks.h"

#include <limits>
#include <sstream>

namespace gdn
{
namespace plugin
{

using nvinfer1::DataType;

char const* dataTypeName(DataType type) noexcept
{
    switch (type)
    {
    case DataType::kFLOAT: return "kFLOAT";
    case DataType::kHALF: return "kHALF";
    case DataType::kINT8: return "kINT8";
    case DataType::kINT32: return "kINT32";
    case DataType::kBOOL: return "kBOOL";
    case DataType::kUINT8: return "kUINT8";
    case DataType::kFP8: return "kFP8";
    case DataType::kBF16: return "kBF16";
    case DataType::kINT64: return "kINT64";
    default: return "k(other)";
    }
}

bool isKernelFloat(DataType type) noexcept
{
    return type == DataType::kFLOAT || type == DataType::kHALF || type == DataType::kBF16;
}

gdn::DataType toKernelDataType(DataType type, char const* what)
{
    switch (type)
    {
    case DataType::kFLOAT: return gdn::DataType::kFLOAT32;
    case DataType::kHALF: return gdn::DataType::kFLOAT16;
    case DataType::kBF16: return gdn::DataType::kBFLOAT16;
    default: break;
    }
    GDN_PLUGIN_FAIL(what << " has dtype " << dataTypeName(type) << "; only kFLOAT, kHALF and kBF16 are supported");
}

std::string dimsToString(nvinfer1::Dims const& dims)
{
    std::ostringstream os;
    os << "[";
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        os << (i ? ", " : "") << dims.d[i];
    }
    os << "]";
    return os.str();
}

int64_t volume(nvinfer1::Dims const& dims) noexcept
{
    int64_t n = 1;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        if (dims.d[i] <= 0)
        {
            return 0;
        }
        n *= dims.d[i];
    }
    return n;
}

size_t elementSize(DataType type) noexcept
{
    switch (type)
    {
    case DataType::kFLOAT: return 4;
    case DataType::kHALF:
    case DataType::kBF16: return 2;
    default: return 0;
    }
}

int32_t dimAsInt32(nvinfer1::Dims const& dims, int32_t i, char const* what)
{
    GDN_PLUGIN_CHECK(i < dims.nbDims, what << " " << dimsToString(dims) << " has no dim " << i);
    int64_t const d = dims.d[i];
    GDN_PLUGIN_CHECK(d >= 0 && d <= std::numeric_limits<int32_t>::max(),
        what << " " << dimsToString(dims) << ": dim " << i << " = " << d << " is out of range");
    return static_cast<int32_t>(d);
}

} // namespace plugin
} // namespace gdn
