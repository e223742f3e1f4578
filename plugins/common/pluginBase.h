/*
 * PluginBase<Derived> and PluginCreator<Plugin>: what every gdn plugin repeats, written once.
 *
 * PluginBase is a CRTP base implementing IPluginV3 + IPluginV3OneCore + IPluginV3OneBuildV2 +
 * IPluginV3OneRuntime: capability interfaces, clone, name / version / namespace, input and output
 * counts, the aliased-I/O query from a table, the dtype checks from one per-position rule, field
 * serialization by name, the timing-cache id, and the noexcept catch-and-report around every call.
 * PluginCreator is the matching IPluginCreatorV3One: field table, createPlugin reading every field by
 * name and type (a missing or mistyped field fails with a message naming it).
 *
 * A plugin supplies only what is its own (see plugins/README.md, "Writing a plugin"):
 *
 *   class Plugin : public PluginBase<Plugin, PluginIO, PluginFields>
 *   static constexpr char const* kNAME, kVERSION, kNAMESPACE;
 *   PluginIO = struct with kNB_INPUTS, kNB_OUTPUTS, kALIASED_INPUTS[kNB_OUTPUTS] (-1 = none),
 *              kFREE_TYPES[]: the inputs that take any of fp32 / fp16 / bf16 by themselves (0 first),
 *              static char const* inputName(int32_t), outputName(int32_t);
 *   PluginFields = aggregate of float / int32_t members with
 *              template <typename S, typename F> static void visit(S& self, F&& f)
 *              calling f("field_name", self.member) for each field, in the creator's order;
 *   explicit Plugin(Fields const&)            validates the fields (throws PluginError)
 *   static void checkInputDims(Dims const*)   ranks and shared dims; a dim < 0 is unknown
 *                                             (checkRanks / checkSameDim help); may instead be a
 *                                             const member where a field enters a dim rule (MoE's top_k <= E)
 *   nvinfer1::DataType typeAt(int32_t pos, nvinfer1::DataType const* types) const
 *                                             dtype at position pos (inputs, then outputs), given
 *                                             the dtypes of every position before it (types[0] is
 *                                             input 0's: fp32 / fp16 / bf16); never asked about a
 *                                             position of IO::kFREE_TYPES
 *   void inferOutputShapes(DimsExprs const* in, DimsExprs* out, IExprBuilder&) const
 *   void launch(PluginTensorDesc const* inDesc, PluginTensorDesc const* outDesc, void const* const* in,
 *               void* const* out, void* workspace, cudaStream_t) const
 *   optional: size_t workspaceBytes(DynamicPluginTensorDesc const* in, DynamicPluginTensorDesc const* out) const
 *
 * The hooks are public (the base calls them). Hooks throw PluginError (GDN_PLUGIN_CHECK); the base turns that into a logged message and
 * TensorRT's failure value. Every tensor must be linear (row-major, contiguous).
 */
#pragma once

#include "checks.h"
#include "fields.h"
#include "tensors.h"

#include <NvInferRuntime.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace gdn
{
namespace plugin
{

//! The PluginFieldType of a field member: float -> kFLOAT32, int32_t (bools, enums) -> kINT32.
template <typename T>
constexpr nvinfer1::PluginFieldType fieldTypeOf();
template <>
constexpr nvinfer1::PluginFieldType fieldTypeOf<float>()
{
    return nvinfer1::PluginFieldType::kFLOAT32;
}
template <>
constexpr nvinfer1::PluginFieldType fieldTypeOf<int32_t>()
{
    return nvinfer1::PluginFieldType::kINT32;
}

inline void readField(FieldReader const& reader, char const* name, float& value)
{
    value = reader.getFloat32(name);
}
inline void readField(FieldReader const& reader, char const* name, int32_t& value)
{
    value = reader.getInt32(name);
}

//! "scale=0.125,use_qk_l2norm=1": the fields by name, for the timing cache id and metadata.
template <typename Fields>
std::string describeFields(Fields const& fields)
{
    std::ostringstream os;
    os.precision(9);
    char const* sep = "";
    Fields::visit(fields, [&](char const* name, auto const& value) {
        os << sep << name << "=" << value;
        sep = ",";
    });
    return os.str();
}

//! Copies a state through unchanged (T = 0); nothing when it is updated in place.
inline void copyThrough(void* dst, void const* src, size_t bytes, cudaStream_t stream, char const* who)
{
    if (bytes == 0 || dst == src)
    {
        return;
    }
    cudaError_t const err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
    GDN_PLUGIN_CHECK(err == cudaSuccess, who << ": copying the state for T = 0 failed: " << cudaGetErrorString(err));
}

template <typename Derived, typename IOTable, typename FieldsT>
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuildV2,
                   public nvinfer1::IPluginV3OneRuntime
{
protected:
    // Shorthands, shared with the plugin (the same types as in nvinfer1).
    using DataType = nvinfer1::DataType;
    using Dims = nvinfer1::Dims;
    using DimsExprs = nvinfer1::DimsExprs;
    using DynDesc = nvinfer1::DynamicPluginTensorDesc;
    using Desc = nvinfer1::PluginTensorDesc;

public:
    // Template arguments rather than Derived:: names: Derived is incomplete where the base is instantiated.
    using IO = IOTable;
    using Fields = FieldsT;

    // ---------------------------------------------------------------- IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override
    {
        switch (type)
        {
        case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
        case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuildV2*>(this);
        case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
        }
        logError(std::string(Derived::kNAME) + ": unknown capability type "
            + std::to_string(static_cast<int32_t>(type)));
        return nullptr;
    }

    //! A new plugin from the same fields (override in a plugin with state beyond its fields).
    nvinfer1::IPluginV3* clone() noexcept override
    {
        GDN_PLUGIN_TRY
        {
            return new Derived(mFields);
        }
        GDN_PLUGIN_CATCH(where("clone").c_str())
        return nullptr;
    }

    // ---------------------------------------------------------------- IPluginV3OneCore
    char const* getPluginName() const noexcept override { return Derived::kNAME; }
    char const* getPluginVersion() const noexcept override { return Derived::kVERSION; }
    char const* getPluginNamespace() const noexcept override { return Derived::kNAMESPACE; }

    // ---------------------------------------------------------------- IPluginV3OneBuild(V2)
    int32_t getNbOutputs() const noexcept override { return IO::kNB_OUTPUTS; }

    int32_t getOutputDataTypes(
        DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept override
    {
        GDN_PLUGIN_TRY
        {
            checkCounts(nbInputs, nbOutputs);
            DataType types[IO::kNB_INPUTS + IO::kNB_OUTPUTS];
            for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
            {
                types[i] = inputTypes[i];
                if (isFreeType(i))
                {
                    GDN_PLUGIN_CHECK(isKernelFloat(types[i]), Derived::kNAME << ": " << IO::inputName(i) << " has dtype "
                                                                             << dataTypeName(types[i])
                                                                             << "; only kFLOAT, kHALF and kBF16 are supported");
                    continue;
                }
                DataType const want = derived().typeAt(i, types);
                GDN_PLUGIN_CHECK(types[i] == want, Derived::kNAME << ": " << IO::inputName(i) << " is "
                                                                  << dataTypeName(types[i]) << " but must be "
                                                                  << dataTypeName(want) << " (" << IO::inputName(0)
                                                                  << " is " << dataTypeName(types[0]) << ")");
            }
            for (int32_t i = 0; i < IO::kNB_OUTPUTS; ++i)
            {
                outputTypes[i] = types[IO::kNB_INPUTS + i] = derived().typeAt(IO::kNB_INPUTS + i, types);
            }
            return 0;
        }
        GDN_PLUGIN_CATCH(where("getOutputDataTypes").c_str())
        return -1;
    }

    int32_t getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /* shapeInputs */,
        int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override
    {
        GDN_PLUGIN_TRY
        {
            checkCounts(nbInputs, nbOutputs);
            // Check what is known at build time: constants compare, symbolic dims pass as -1.
            Dims known[IO::kNB_INPUTS];
            for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
            {
                known[i].nbDims = inputs[i].nbDims;
                for (int32_t d = 0; d < inputs[i].nbDims; ++d)
                {
                    known[i].d[d] = inputs[i].d[d]->isConstant() ? inputs[i].d[d]->getConstantValue() : -1;
                }
            }
            derived().checkInputDims(known);
            derived().inferOutputShapes(inputs, outputs, exprBuilder);
            return 0;
        }
        GDN_PLUGIN_CATCH(where("getOutputShapes").c_str())
        return -1;
    }

    //! Linear only; the free-type inputs fp32 / fp16 / bf16, every other position typeAt(pos, the types before it).
    bool supportsFormatCombination(
        int32_t pos, DynDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept override
    {
        GDN_PLUGIN_TRY
        {
            checkCounts(nbInputs, nbOutputs);
            GDN_PLUGIN_CHECK(pos >= 0 && pos < nbInputs + nbOutputs,
                Derived::kNAME << ": supportsFormatCombination asked about position " << pos);
            nvinfer1::PluginTensorDesc const& desc = inOut[pos].desc;
            if (desc.format != nvinfer1::TensorFormat::kLINEAR)
            {
                return false;
            }
            if (isFreeType(pos))
            {
                return isKernelFloat(desc.type);
            }
            // TensorRT asks in order, so the types of every earlier position are fixed by now.
            DataType types[IO::kNB_INPUTS + IO::kNB_OUTPUTS];
            for (int32_t i = 0; i < pos; ++i)
            {
                types[i] = inOut[i].desc.type;
            }
            return desc.type == derived().typeAt(pos, types);
        }
        GDN_PLUGIN_CATCH(where("supportsFormatCombination").c_str())
        return false;
    }

    int32_t configurePlugin(DynDesc const* in, int32_t nbInputs, DynDesc const* /* out */, int32_t nbOutputs) noexcept override
    {
        GDN_PLUGIN_TRY
        {
            checkCounts(nbInputs, nbOutputs);
            Dims dims[IO::kNB_INPUTS];
            for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
            {
                dims[i] = in[i].desc.dims;
            }
            derived().checkInputDims(dims);
            return 0;
        }
        GDN_PLUGIN_CATCH(where("configurePlugin").c_str())
        return -1;
    }

    size_t getWorkspaceSize(DynDesc const* inputs, int32_t nbInputs, DynDesc const* outputs, int32_t nbOutputs) const
        noexcept override
    {
        GDN_PLUGIN_TRY
        {
            checkCounts(nbInputs, nbOutputs);
            return derived().workspaceBytes(inputs, outputs);
        }
        GDN_PLUGIN_CATCH(where("getWorkspaceSize").c_str())
        return 0;
    }

    char const* getTimingCacheID() noexcept override { return mDescription.c_str(); }
    char const* getMetadataString() noexcept override { return mDescription.c_str(); }

    int32_t getAliasedInput(int32_t outputIndex) noexcept override
    {
        return outputIndex >= 0 && outputIndex < IO::kNB_OUTPUTS ? IO::kALIASED_INPUTS[outputIndex] : -1;
    }

    //! An input whose dtype is its own choice among fp32 / fp16 / bf16 (IO::kFREE_TYPES).
    static bool isFreeType(int32_t pos) noexcept
    {
        for (int32_t p : IO::kFREE_TYPES)
        {
            if (p == pos)
            {
                return true;
            }
        }
        return false;
    }

    // ---------------------------------------------------------------- IPluginV3OneRuntime
    int32_t onShapeChange(Desc const* in, int32_t nbInputs, Desc const* /* out */, int32_t nbOutputs) noexcept override
    {
        GDN_PLUGIN_TRY
        {
            checkCounts(nbInputs, nbOutputs);
            Dims dims[IO::kNB_INPUTS];
            for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
            {
                dims[i] = in[i].dims;
            }
            derived().checkInputDims(dims);
            return 0;
        }
        GDN_PLUGIN_CATCH(where("onShapeChange").c_str())
        return -1;
    }

    int32_t enqueue(Desc const* inputDesc, Desc const* outputDesc, void const* const* inputs, void* const* outputs,
        void* workspace, cudaStream_t stream) noexcept override
    {
        GDN_PLUGIN_TRY
        {
            derived().launch(inputDesc, outputDesc, inputs, outputs, workspace, stream);
            return 0;
        }
        GDN_PLUGIN_CATCH(where("enqueue").c_str())
        return -1;
    }

    //! No per-context resources by default: the workspace comes from TensorRT.
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept override
    {
        return clone();
    }

    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override
    {
        // Rebuilt on every call: the entries point into mFields, which a copy would not share.
        mSerialized.clear();
        Fields::visit(mFields, [&](char const* name, auto& value) {
            using T = std::remove_reference_t<decltype(value)>;
            mSerialized.emplace_back(name, &value, fieldTypeOf<T>(), 1);
        });
        mSerializedCollection.nbFields = static_cast<int32_t>(mSerialized.size());
        mSerializedCollection.fields = mSerialized.data();
        return &mSerializedCollection;
    }

    // ---------------------------------------------------------------- defaults a plugin may shadow
    size_t workspaceBytes(DynDesc const* /* in */, DynDesc const* /* out */) const { return 0; }

protected:
    explicit PluginBase(Fields const& fields)
        : mFields(fields)
        , mDescription(describeFields(fields))
    {
    }

    Fields const& fields() const noexcept { return mFields; }

    //! "<Name>Plugin::<method>" for messages of the catch-and-report boundary.
    static std::string where(char const* method)
    {
        return std::string(Derived::kNAME) + "Plugin::" + method;
    }

    //! For checkInputDims: PluginError unless input i has rank ranks[i].
    static void checkRanks(Dims const* in, int32_t const (&ranks)[IOTable::kNB_INPUTS])
    {
        for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
        {
            GDN_PLUGIN_CHECK(in[i].nbDims == ranks[i], Derived::kNAME << ": " << IO::inputName(i) << " must have rank "
                                                                      << ranks[i] << ", got " << dimsToString(in[i]));
        }
    }

    //! For checkInputDims: PluginError unless dim da of input a equals dim db of input b (a dim < 0,
    //! unknown at build time, matches anything); `what` names the dim ("batch B").
    static void checkSameDim(Dims const* in, int32_t a, int32_t da, int32_t b, int32_t db, char const* what)
    {
        int64_t const x = in[a].d[da];
        int64_t const y = in[b].d[db];
        GDN_PLUGIN_CHECK(x < 0 || y < 0 || x == y,
            Derived::kNAME << ": " << what << " differs: " << IO::inputName(a) << " " << dimsToString(in[a]) << " vs "
                           << IO::inputName(b) << " " << dimsToString(in[b]));
    }

    //! PluginError unless TensorRT passes the table's input and output counts.
    static void checkCounts(int32_t nbInputs, int32_t nbOutputs)
    {
        if (nbInputs == IO::kNB_INPUTS && nbOutputs == IO::kNB_OUTPUTS)
        {
            return;
        }
        std::ostringstream os;
        os << Derived::kNAME << " takes " << IO::kNB_INPUTS << " inputs (";
        for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
        {
            os << (i ? ", " : "") << IO::inputName(i);
        }
        os << ") and gives " << IO::kNB_OUTPUTS << " outputs (";
        for (int32_t i = 0; i < IO::kNB_OUTPUTS; ++i)
        {
            os << (i ? ", " : "") << IO::outputName(i);
        }
        os << "), got " << nbInputs << " and " << nbOutputs;
        throw PluginError(os.str());
    }

private:
    Derived const& derived() const noexcept { return static_cast<Derived const&>(*this); }

    Fields mFields;
    std::string mDescription; // describeFields(mFields): timing cache id and metadata
    std::vector<nvinfer1::PluginField> mSerialized;
    nvinfer1::PluginFieldCollection mSerializedCollection{};
};

//! IPluginCreatorV3One of `Plugin` (a PluginBase): field table from Plugin::Fields, createPlugin
//! reads each field by name and type, then constructs Plugin(fields), which validates the values.
template <typename Plugin>
class PluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    PluginCreator()
    {
        typename Plugin::Fields defaults{};
        Plugin::Fields::visit(defaults, [&](char const* name, auto& value) {
            using T = std::remove_reference_t<decltype(value)>;
            mFieldNames.emplace_back(name, nullptr, fieldTypeOf<T>(), 1);
        });
        mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
        mFieldCollection.fields = mFieldNames.data();
    }

    char const* getPluginName() const noexcept override { return Plugin::kNAME; }
    char const* getPluginVersion() const noexcept override { return Plugin::kVERSION; }
    char const* getPluginNamespace() const noexcept override { return Plugin::kNAMESPACE; }
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override { return &mFieldCollection; }

    //! Both phases get the same fields: the ONNX attributes at build time, getFieldsToSerialize() at run time.
    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
        nvinfer1::TensorRTPhase /* phase */) noexcept override
    {
        GDN_PLUGIN_TRY
        {
            std::string const who = std::string(Plugin::kNAME) + " '" + (name != nullptr ? name : "") + "'";
            FieldReader const reader(who.c_str(), fc);
            typename Plugin::Fields fields{};
            Plugin::Fields::visit(fields, [&](char const* field, auto& value) { readField(reader, field, value); });
            return new Plugin(fields);
        }
        GDN_PLUGIN_CATCH((std::string(Plugin::kNAME) + "PluginCreator::createPlugin").c_str())
        return nullptr;
    }

private:
    std::vector<nvinfer1::PluginField> mFieldNames;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace gdn
