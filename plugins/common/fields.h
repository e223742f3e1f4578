/*
 * Reading plugin fields by name.
 *
 * createPlugin() receives either the ONNX node's attributes (build phase; the parser turns a
 * float attribute into kFLOAT32 and an int attribute into kINT32) or what getFieldsToSerialize()
 * wrote (runtime phase). Every field is looked up by name, its presence, type and length checked,
 * and a missing or mistyped field raises PluginError naming the plugin, the field and the type.
 */
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>

namespace gdn
{
namespace plugin
{

//! "kFLOAT32", "kINT32", ... for messages.
char const* fieldTypeName(nvinfer1::PluginFieldType type) noexcept;

class FieldReader
{
public:
    //! `pluginName` prefixes every message; `fc` may be nullptr (then every field is missing).
    FieldReader(char const* pluginName, nvinfer1::PluginFieldCollection const* fc);

    //! A scalar float field. kFLOAT32 expected; kFLOAT64 and kFLOAT16 are converted.
    float getFloat32(char const* name) const;

    //! A scalar int32 field (bools and enums too). kINT32 expected; kINT64, kINT16 and kINT8 are
    //! converted when the value fits.
    int32_t getInt32(char const* name) const;

private:
    nvinfer1::PluginField const& find(char const* name, char const* expected) const;

    std::string mPluginName;
    nvinfer1::PluginFieldCollection const* mFields;
};

} // namespace plugin
} // namespace gdn
