#include "fields.h"

#include "checks.h"

#include <cstring>
#include <limits>

namespace gdn
{
namespace plugin
{

using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

char const* fieldTypeName(PluginFieldType type) noexcept
{
    switch (type)
    {
    case PluginFieldType::kFLOAT16: return "kFLOAT16";
    case PluginFieldType::kFLOAT32: return "kFLOAT32";
    case PluginFieldType::kFLOAT64: return "kFLOAT64";
    case PluginFieldType::kINT8: return "kINT8";
    case PluginFieldType::kINT16: return "kINT16";
    case PluginFieldType::kINT32: return "kINT32";
    case PluginFieldType::kCHAR: return "kCHAR";
    case PluginFieldType::kDIMS: return "kDIMS";
    case PluginFieldType::kUNKNOWN: return "kUNKNOWN";
    case PluginFieldType::kBF16: return "kBF16";
    case PluginFieldType::kINT64: return "kINT64";
    case PluginFieldType::kFP8: return "kFP8";
    case PluginFieldType::kINT4: return "kINT4";
    case PluginFieldType::kFP4: return "kFP4";
    }
    return "k?";
}

FieldReader::FieldReader(char const* pluginName, nvinfer1::PluginFieldCollection const* fc)
    : mPluginName(pluginName)
    , mFields(fc)
{
    GDN_PLUGIN_CHECK(fc == nullptr || fc->nbFields == 0 || fc->fields != nullptr,
        mPluginName << ": PluginFieldCollection has " << fc->nbFields << " fields but no field array");
}

PluginField const& FieldReader::find(char const* name, char const* expected) const
{
    if (mFields != nullptr)
    {
        for (int32_t i = 0; i < mFields->nbFields; ++i)
        {
            PluginField const& field = mFields->fields[i];
            if (field.name != nullptr && std::strcmp(field.name, name) == 0)
            {
                GDN_PLUGIN_CHECK(field.data != nullptr && field.length == 1,
                    mPluginName << ": field '" << name << "' must hold one " << expected << " value, got length "
                                << field.length << (field.data == nullptr ? " and no data" : ""));
                return field;
            }
        }
    }
    GDN_PLUGIN_FAIL(mPluginName << ": field '" << name << "' (" << expected << ") is missing");
}

float FieldReader::getFloat32(char const* name) const
{
    PluginField const& field = find(name, "kFLOAT32");
    switch (field.type)
    {
    case PluginFieldType::kFLOAT32: return *static_cast<float const*>(field.data);
    case PluginFieldType::kFLOAT64: return static_cast<float>(*static_cast<double const*>(field.data));
    default: break;
    }
    GDN_PLUGIN_FAIL(mPluginName << ": field '" << name << "' must be kFLOAT32, got " << fieldTypeName(field.type));
}

int32_t FieldReader::getInt32(char const* name) const
{
    PluginField const& field = find(name, "kINT32");
    int64_t value = 0;
    switch (field.type)
    {
    case PluginFieldType::kINT32: return *static_cast<int32_t const*>(field.data);
    case PluginFieldType::kINT64: value = *static_cast<int64_t const*>(field.data); break;
    case PluginFieldType::kINT16: value = *static_cast<int16_t const*>(field.data); break;
    case PluginFieldType::kINT8: value = *static_cast<int8_t const*>(field.data); break;
    default:
        GDN_PLUGIN_FAIL(mPluginName << ": field '" << name << "' must be kINT32, got " << fieldTypeName(field.type));
    }
    GDN_PLUGIN_CHECK(value >= std::numeric_limits<int32_t>::min() && value <= std::numeric_limits<int32_t>::max(),
        mPluginName << ": field '" << name << "' = " << value << " does not fit in int32");
    return static_cast<int32_t>(value);
}

} // namespace plugin
} // namespace gdn
