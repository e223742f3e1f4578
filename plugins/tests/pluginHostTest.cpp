/*
 * pluginHostTest: drives the GatedDeltaRule(Steps), CausalConv1d and MoE plugins of libgdn_plugins.so through
 * the calls TensorRT makes, without TensorRT (headers only), and checks the outputs against CPU
 * references in double precision.
 *
 * Per case: getCreators -> creator->createPlugin(fields, kBUILD) -> getOutputDataTypes ->
 * getOutputShapes (FakeExprBuilder, B and T symbolic) -> supportsFormatCombination ->
 * configurePlugin -> getWorkspaceSize -> getAliasedInput -> getFieldsToSerialize ->
 * createPlugin(serialized fields, kRUNTIME) -> attachToContext -> onShapeChange -> enqueue on a
 * stream. Outputs are NaN-poisoned first; relative RMS must be <= 2e-3 (fp32) or 1e-2 (fp16/bf16).
 * In-place cases pass the same buffer as state input and output (what ALIASED_PLUGIN_IO does).
 * Then error cases: missing / mistyped fields and mismatched dtypes must fail with a message.
 *
 *   pluginHostTest [--quick] [--no-gpu] [--threads N] [--markdown FILE]
 *     --quick     a handful of small cases, for compute-sanitizer memcheck / racecheck runs
 *     --no-gpu    only the calls before enqueue (and the error cases): runs without a GPU
 *     --markdown  also write the result table to FILE
 * Exit status 0 only if every case and check passed.
 */
#include "../causalConv1dPlugin/causalConv1dPlugin.h"
#include "../gatedDeltaRulePlugin/gatedDeltaRulePlugin.h"
#include "../moePlugin/moePlugin.h"
#include "hostStandIns.h"
#include "reference.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) noexcept;
extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

using namespace nvinfer1;
using gdn::test::DType;

namespace
{

#define HOST_CHECK(cond, msg)                                                                                          \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(cond))                                                                                                   \
        {                                                                                                              \
            std::ostringstream os_;                                                                                    \
            os_ << msg;                                                                                                \
            throw std::runtime_error(os_.str());                                                                       \
        }                                                                                                              \
    } while (0)

#define CUDA_CHECK(call)                                                                                               \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const e_ = (call);                                                                                 \
        HOST_CHECK(e_ == cudaSuccess, #call << ": " << cudaGetErrorString(e_));                                         \
    } while (0)

gdn::test::CapturingLoggerFinder gLoggerFinder;
// --no-gpu: drive every interface call up to onShapeChange, skip buffers, enqueue and references.
bool gNoGpu = false;

class DeviceBuffer
{
public:
    explicit DeviceBuffer(size_t bytes)
        : mBytes(bytes)
    {
        CUDA_CHECK(cudaMalloc(&mPtr, std::max<size_t>(bytes, 1)));
    }
    ~DeviceBuffer() { cudaFree(mPtr); }
    DeviceBuffer(DeviceBuffer const&) = delete;
    DeviceBuffer& operator=(DeviceBuffer const&) = delete;
    void* get() const { return mPtr; }
    void upload(void const* src) { CUDA_CHECK(cudaMemcpy(mPtr, src, mBytes, cudaMemcpyHostToDevice)); }
    //! 0xFF bytes: NaN in fp32, fp16 and bf16, so any element the plugin leaves unwritten fails.
    void poison() { CUDA_CHECK(cudaMemset(mPtr, 0xFF, mBytes)); }
    std::vector<uint8_t> download() const
    {
        std::vector<uint8_t> out(mBytes);
        CUDA_CHECK(cudaMemcpy(out.data(), mPtr, mBytes, cudaMemcpyDeviceToHost));
        return out;
    }

private:
    void* mPtr{nullptr};
    size_t mBytes;
};

DataType trtType(DType t)
{
    return t == DType::kF32 ? DataType::kFLOAT : t == DType::kF16 ? DataType::kHALF : DataType::kBF16;
}

double boundFor(DType t)
{
    return t == DType::kF32 ? 2e-3 : 1e-2;
}

Dims makeDims(std::vector<int64_t> const& d)
{
    Dims out{};
    out.nbDims = static_cast<int32_t>(d.size());
    for (size_t i = 0; i < d.size(); ++i)
    {
        out.d[i] = d[i];
    }
    return out;
}

IPluginCreatorV3One* findCreator(char const* name)
{
    int32_t n = 0;
    IPluginCreatorInterface* const* creators = getCreators(n);
    for (int32_t i = 0; i < n; ++i)
    {
        HOST_CHECK(std::strcmp(creators[i]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0,
            "creator " << i << " is a " << creators[i]->getInterfaceInfo().kind << ", not an IPluginCreatorV3One");
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        if (std::strcmp(c->getPluginName(), name) == 0)
        {
            HOST_CHECK(std::strcmp(c->getPluginVersion(), "1") == 0 && std::strcmp(c->getPluginNamespace(), "gdn") == 0,
                name << " has version " << c->getPluginVersion() << " namespace " << c->getPluginNamespace());
            return c;
        }
    }
    HOST_CHECK(false, "getCreators() has no creator named " << name);
    return nullptr;
}

//! The plugin's three capability interfaces, checked.
struct Caps
{
    IPluginV3OneCore* core;
    IPluginV3OneBuildV2* build;
    IPluginV3OneRuntime* runtime;
};

Caps capabilities(IPluginV3* plugin, char const* name)
{
    Caps c{};
    c.core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    c.build = static_cast<IPluginV3OneBuildV2*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    c.runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    HOST_CHECK(c.core && c.build && c.runtime, name << ": a capability interface is missing");
    HOST_CHECK(std::strcmp(c.core->getPluginName(), name) == 0, "core name " << c.core->getPluginName());
    HOST_CHECK(c.build->getInterfaceInfo().major == 2, name << ": build capability is not IPluginV3OneBuildV2");
    return c;
}

//! Serialize with getFieldsToSerialize, recreate through the creator in the runtime phase, attach.
IPluginV3* roundTrip(IPluginCreatorV3One* creator, IPluginV3OneRuntime* runtime, char const* layerName)
{
    PluginFieldCollection const* fc = runtime->getFieldsToSerialize();
    HOST_CHECK(fc != nullptr && fc->nbFields > 0, "getFieldsToSerialize returned nothing");
    // Copy the values, as TensorRT does when it writes the engine, before the source plugin goes away.
    std::vector<std::vector<uint8_t>> storage;
    std::vector<PluginField> fields;
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        PluginField const& f = fc->fields[i];
        size_t const bytes = f.type == PluginFieldType::kFLOAT32 || f.type == PluginFieldType::kINT32 ? 4 : 0;
        HOST_CHECK(bytes > 0 && f.length == 1, "field " << f.name << " has an unexpected type or length");
        storage.emplace_back(static_cast<uint8_t const*>(f.data), static_cast<uint8_t const*>(f.data) + bytes);
    }
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        fields.emplace_back(fc->fields[i].name, storage[i].data(), fc->fields[i].type, 1);
    }
    PluginFieldCollection copy{static_cast<int32_t>(fields.size()), fields.data()};
    std::unique_ptr<IPluginV3> deserialized(creator->createPlugin(layerName, &copy, TensorRTPhase::kRUNTIME));
    HOST_CHECK(deserialized != nullptr, "createPlugin(kRUNTIME) from the serialized fields failed: "
                                            << gLoggerFinder.mLogger.last());
    auto* rt = static_cast<IPluginV3OneRuntime*>(deserialized->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    gdn::test::FakeResourceContext context;
    IPluginV3* attached = rt->attachToContext(&context);
    HOST_CHECK(attached != nullptr, "attachToContext returned nullptr");
    return attached;
}

struct Row
{
    std::string op, dtype, shape, flags;
    double errOut{NAN}, errState{NAN}, bound{NAN}, ms{NAN};
    bool pass{false};
    std::string note;
};

std::vector<float> randomVector(std::mt19937& rng, size_t n, std::function<float(float)> const& f)
{
    std::normal_distribution<float> nd(0.F, 1.F);
    std::vector<float> out(n);
    for (auto& x : out)
    {
        x = f(nd(rng));
    }
    return out;
}

// ==================================================================== GatedDeltaRule

struct GdrCase
{
    gdn::test::GdrShape s;
    DType dtype;
    bool inPlace;
    bool l2norm;
    DType state{DType::kF32}; //!< the recurrent state's storage dtype (free of the activations')
    bool steps{false};        //!< GatedDeltaRuleSteps: every token's state [B, T, Hv, Dk, Dv], nothing in place
};

//! GatedDeltaRuleSteps' reference: T one-token calls of the double reference, each token's state
//! rounded to the storage dtype before the next (the op's rounding rule, token by token).
void stepsReference(gdn::test::GdrShape const& s, std::vector<float> const& q, std::vector<float> const& k,
    std::vector<float> const& v, std::vector<float> const& g, std::vector<float> const& beta,
    std::vector<float> const& s0, float scale, bool l2norm, DType state, std::vector<double>& o,
    std::vector<double>& states, int32_t threads)
{
    gdn::test::GdrShape one = s;
    one.T = 1;
    size_t const nS = static_cast<size_t>(s.B) * s.Hv * s.Dk * s.Dv;
    o.assign(static_cast<size_t>(s.B) * s.T * s.Hv * s.Dv, 0.0);
    states.assign(nS * s.T, 0.0);
    // token t of a [B, T, ...] tensor with `inner` elements a token
    auto token = [&](std::vector<float> const& x, int32_t t, size_t inner) {
        std::vector<float> out(static_cast<size_t>(s.B) * inner);
        for (int32_t b = 0; b < s.B; ++b)
        {
            std::copy_n(x.begin() + (static_cast<size_t>(b) * s.T + t) * inner, inner, out.begin() + b * inner);
        }
        return out;
    };
    size_t const qk = static_cast<size_t>(s.Hk) * s.Dk, vv = static_cast<size_t>(s.Hv) * s.Dv, gg = s.Hv;
    size_t const perRow = static_cast<size_t>(s.Hv) * s.Dk * s.Dv;
    std::vector<float> current = s0;
    for (int32_t t = 0; t < s.T; ++t)
    {
        std::vector<double> ot, st;
        gdn::test::gatedDeltaRuleReference(one, token(q, t, qk), token(k, t, qk), token(v, t, vv), token(g, t, gg),
            token(beta, t, gg), current, scale, l2norm, ot, st, threads);
        std::vector<float> rounded(st.begin(), st.end());
        current = gdn::test::roundTo(state, rounded);
        for (int32_t b = 0; b < s.B; ++b)
        {
            std::copy_n(ot.begin() + b * vv, vv, o.begin() + (static_cast<size_t>(b) * s.T + t) * vv);
            std::copy_n(current.begin() + b * perRow, perRow, states.begin() + (static_cast<size_t>(b) * s.T + t) * perRow);
        }
    }
}

//! Relative RMS allowed for the final state: a 16-bit state is rounded once where it is stored,
//! which alone costs ~1e-3 (bf16) / ~1.5e-4 (fp16) against the float64 reference.
double stateBoundFor(DType activations, DType state)
{
    double const stored = state == DType::kBF16 ? 6e-3 : state == DType::kF16 ? 1e-3 : 0.0;
    return std::max(boundFor(activations), stored);
}

//! enqueue on a fresh non-blocking stream, as TensorRT would; returns the GPU time in ms.
float timedEnqueue(IPluginV3OneRuntime* rt, PluginTensorDesc const* inDesc, PluginTensorDesc const* outDesc,
    void const* const* inputs, void* const* outputs, void* workspace)
{
    // Pageable uploads and memsets may still be in flight; the plugin's stream does not wait for them.
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start, stream));
    int32_t const rc = rt->enqueue(inDesc, outDesc, inputs, outputs, workspace, stream);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    float ms = 0.F;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
    HOST_CHECK(rc == 0, "enqueue returned " << rc << ": " << gLoggerFinder.mLogger.last());
    CUDA_CHECK(cudaGetLastError());
    return ms;
}

Row runGdr(GdrCase const& c, int32_t threads)
{
    using IO = gdn::plugin::GatedDeltaRuleIO;
    auto const& s = c.s;
    Row row;
    row.op = c.steps ? "GatedDeltaRuleSteps" : "GatedDeltaRule";
    row.dtype = gdn::test::dtypeName(c.dtype);
    std::ostringstream sh;
    sh << "B=" << s.B << " T=" << s.T << " Hk=" << s.Hk << " Hv=" << s.Hv << " Dk=" << s.Dk << " Dv=" << s.Dv;
    row.shape = sh.str();
    row.flags = std::string(c.inPlace ? "in-place" : "separate") + (c.l2norm ? ",l2norm" : "")
        + (c.state == DType::kF32 ? "" : std::string(",") + gdn::test::dtypeName(c.state) + " state");
    row.bound = stateBoundFor(c.dtype, c.state);
    try
    {
        float const scale = 1.F / std::sqrt(static_cast<float>(s.Dk));
        // ---- build phase
        char const* const pluginName = c.steps ? gdn::plugin::kGDRS_PLUGIN_NAME : gdn::plugin::kGDR_PLUGIN_NAME;
        IPluginCreatorV3One* creator = findCreator(pluginName);
        int32_t const useL2 = c.l2norm ? 1 : 0;
        PluginField fieldArr[] = {PluginField("scale", &scale, PluginFieldType::kFLOAT32, 1),
            PluginField("use_qk_l2norm", &useL2, PluginFieldType::kINT32, 1)};
        PluginFieldCollection fc{2, fieldArr};
        std::unique_ptr<IPluginV3> plugin(creator->createPlugin("gdr_test", &fc, TensorRTPhase::kBUILD));
        HOST_CHECK(plugin != nullptr, "createPlugin(kBUILD) failed: " << gLoggerFinder.mLogger.last());
        Caps caps = capabilities(plugin.get(), pluginName);
        HOST_CHECK(caps.build->getNbOutputs() == 2, "getNbOutputs " << caps.build->getNbOutputs());

        DataType const t = trtType(c.dtype);
        DataType const st = trtType(c.state);
        DataType inTypes[IO::kNB_INPUTS] = {t, t, t, DataType::kFLOAT, t, st};
        DataType outTypes[IO::kNB_OUTPUTS] = {DataType::kINT8, DataType::kINT8};
        HOST_CHECK(caps.build->getOutputDataTypes(outTypes, 2, inTypes, 6) == 0, "getOutputDataTypes failed");
        HOST_CHECK(outTypes[IO::kO] == t && outTypes[IO::kFINAL_STATE] == st,
            "getOutputDataTypes gave o " << int(outTypes[0]) << " state " << int(outTypes[1]));

        std::vector<Dims> inDims = {makeDims({s.B, s.T, s.Hk, s.Dk}), makeDims({s.B, s.T, s.Hk, s.Dk}),
            makeDims({s.B, s.T, s.Hv, s.Dv}), makeDims({s.B, s.T, s.Hv}), makeDims({s.B, s.T, s.Hv}),
            makeDims({s.B, s.Hv, s.Dk, s.Dv})};
        // output 1: the final state [B, Hv, Dk, Dv], or every token's [B, T, Hv, Dk, Dv]
        Dims const stateOutDims = c.steps ? makeDims({s.B, s.T, s.Hv, s.Dk, s.Dv}) : inDims[IO::kINITIAL_STATE];
        {
            // B and T symbolic, as in a dynamic-shape network.
            gdn::test::FakeExprBuilder eb;
            auto const* symB = eb.symbol(s.B);
            auto const* symT = eb.symbol(s.T);
            DimsExprs in[IO::kNB_INPUTS];
            for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
            {
                in[i].nbDims = inDims[i].nbDims;
                for (int32_t d = 0; d < inDims[i].nbDims; ++d)
                {
                    bool const isB = d == 0;
                    bool const isT = d == 1 && i != IO::kINITIAL_STATE;
                    in[i].d[d] = isB ? symB : isT ? symT : eb.fixed(inDims[i].d[d]);
                }
            }
            DimsExprs out[IO::kNB_OUTPUTS]{};
            HOST_CHECK(caps.build->getOutputShapes(in, 6, nullptr, 0, out, 2, eb) == 0, "getOutputShapes failed");
            HOST_CHECK(out[IO::kO].nbDims == 4 && out[IO::kO].d[0] == symB && out[IO::kO].d[1] == symT
                    && out[IO::kO].d[2] == in[IO::kV].d[2] && out[IO::kO].d[3] == in[IO::kV].d[3],
                "getOutputShapes: o is not [B, T, Hv, Dv]");
            if (c.steps)
            {
                HOST_CHECK(out[1].nbDims == 5 && out[1].d[0] == symB && out[1].d[1] == symT
                        && std::equal(out[1].d + 2, out[1].d + 5, in[IO::kINITIAL_STATE].d + 1),
                    "getOutputShapes: states are not [B, T, Hv, Dk, Dv]");
            }
            else
            {
                HOST_CHECK(out[IO::kFINAL_STATE].nbDims == 4
                        && std::equal(out[1].d, out[1].d + 4, in[IO::kINITIAL_STATE].d),
                    "getOutputShapes: final_state is not initial_state's shape");
            }
        }

        DynamicPluginTensorDesc io[8]{};
        for (int32_t i = 0; i < 8; ++i)
        {
            bool const isIn = i < IO::kNB_INPUTS;
            Dims const d = isIn ? inDims[i] : (i == 6 ? inDims[IO::kV] : stateOutDims);
            io[i].desc.dims = d;
            io[i].desc.dims.d[0] = -1; // B dynamic at build time
            if ((isIn && i != IO::kINITIAL_STATE) || i == 6 || (i == 7 && c.steps))
            {
                io[i].desc.dims.d[1] = -1;
            }
            io[i].desc.type = isIn ? inTypes[i] : outTypes[i - 6];
            io[i].desc.format = TensorFormat::kLINEAR;
            io[i].min = io[i].opt = io[i].max = d;
        }
        for (int32_t pos = 0; pos < 8; ++pos)
        {
            HOST_CHECK(caps.build->supportsFormatCombination(pos, io, 6, 2),
                "supportsFormatCombination rejected position " << pos);
        }
        {
            DynamicPluginTensorDesc bad[8];
            std::copy(io, io + 8, bad);
            bad[IO::kK].desc.type = t == DataType::kFLOAT ? DataType::kHALF : DataType::kFLOAT;
            HOST_CHECK(!caps.build->supportsFormatCombination(IO::kK, bad, 6, 2), "k with another dtype accepted");
            bad[IO::kG].desc.type = DataType::kHALF;
            HOST_CHECK(!caps.build->supportsFormatCombination(IO::kG, bad, 6, 2), "fp16 g accepted");
            bad[IO::kQ].desc.format = TensorFormat::kHWC8;
            HOST_CHECK(!caps.build->supportsFormatCombination(IO::kQ, bad, 6, 2), "non-linear format accepted");
        }
        HOST_CHECK(caps.build->configurePlugin(io, 6, io + 6, 2) == 0, "configurePlugin failed");
        size_t const workspaceBytes = caps.build->getWorkspaceSize(io, 6, io + 6, 2);
        // Long prefills take the chunked kernels, which need scratch memory (gatedDeltaRuleKernels.cu):
        // a zero here would make enqueue fail on the GPU.
        // (Head dims off the multiples of 8 take the recurrent kernel, which needs none.)
        bool const chunked = !c.steps && s.T >= 64 && s.Dk % 8 == 0 && s.Dv % 8 == 0;
        HOST_CHECK(!chunked || workspaceBytes > 0, "getWorkspaceSize is 0 for a T = " << s.T << " prefill");
        HOST_CHECK(caps.build->getAliasedInput(1) == (c.steps ? -1 : IO::kINITIAL_STATE)
                && caps.build->getAliasedInput(IO::kO) == -1,
            "getAliasedInput");
        // every token's state: the recurrent kernel, which needs no scratch memory
        HOST_CHECK(!c.steps || workspaceBytes == 0, "GatedDeltaRuleSteps asks for " << workspaceBytes << " bytes");

        // ---- runtime phase
        std::unique_ptr<IPluginV3> attached(roundTrip(creator, caps.runtime, "gdr_test"));
        auto* rt = static_cast<IPluginV3OneRuntime*>(attached->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        PluginTensorDesc inDesc[IO::kNB_INPUTS]{}, outDesc[IO::kNB_OUTPUTS]{};
        for (int32_t i = 0; i < IO::kNB_INPUTS; ++i)
        {
            inDesc[i] = {inDims[i], inTypes[i], TensorFormat::kLINEAR, -1.F};
        }
        outDesc[IO::kO] = {inDims[IO::kV], t, TensorFormat::kLINEAR, -1.F};
        outDesc[IO::kFINAL_STATE] = {stateOutDims, st, TensorFormat::kLINEAR, -1.F};
        HOST_CHECK(rt->onShapeChange(inDesc, 6, outDesc, 2) == 0, "onShapeChange failed");
        if (gNoGpu)
        {
            row.pass = true;
            row.note = "interface only (--no-gpu)";
            return row;
        }

        size_t const nQK = static_cast<size_t>(s.B) * s.T * s.Hk * s.Dk;
        size_t const nV = static_cast<size_t>(s.B) * s.T * s.Hv * s.Dv;
        size_t const nG = static_cast<size_t>(s.B) * s.T * s.Hv;
        size_t const nS = static_cast<size_t>(s.B) * s.Hv * s.Dk * s.Dv;
        std::mt19937 rng(1234u + s.T * 7u + s.Dk * 13u + s.Hv * 17u + s.B * 19u + static_cast<uint32_t>(c.dtype));
        auto q = randomVector(rng, nQK, [](float x) { return x; });
        auto k = randomVector(rng, nQK, [](float x) { return x; });
        if (!c.l2norm)
        {
            // Without the in-kernel normalisation, keep |k| = 1 so the recurrence stays stable.
            for (size_t i = 0; i < nQK; i += s.Dk)
            {
                double n2 = 0;
                for (int32_t j = 0; j < s.Dk; ++j)
                {
                    n2 += double(k[i + j]) * k[i + j];
                }
                for (int32_t j = 0; j < s.Dk; ++j)
                {
                    k[i + j] = static_cast<float>(k[i + j] / std::sqrt(n2));
                }
            }
        }
        auto v = randomVector(rng, nV, [](float x) { return x; });
        // g = log(decay) in about [-0.3, -0.003]; beta = sigmoid(x) in (0, 1).
        auto g = randomVector(rng, nG, [](float x) { return -0.003F - 0.3F / (1.F + std::exp(-x)); });
        auto beta = randomVector(rng, nG, [](float x) { return 1.F / (1.F + std::exp(-x)); });
        auto s0 = randomVector(rng, nS, [](float x) { return 0.1F * x; });
        q = gdn::test::roundTo(c.dtype, q);
        k = gdn::test::roundTo(c.dtype, k);
        v = gdn::test::roundTo(c.dtype, v);
        beta = gdn::test::roundTo(c.dtype, beta);
        s0 = gdn::test::roundTo(c.state, s0);


        std::vector<uint8_t> hq, hk, hv, hbeta;
        gdn::test::storeAs(c.dtype, q, hq);
        gdn::test::storeAs(c.dtype, k, hk);
        gdn::test::storeAs(c.dtype, v, hv);
        gdn::test::storeAs(c.dtype, beta, hbeta);
        std::vector<uint8_t> hs0;
        gdn::test::storeAs(c.state, s0, hs0);
        size_t const es = gdn::test::dtypeSize(c.dtype);
        size_t const ss = gdn::test::dtypeSize(c.state);
        size_t const nSOut = c.steps ? nS * s.T : nS;
        DeviceBuffer dq(nQK * es), dk(nQK * es), dv(nV * es), dg(nG * 4), dbeta(nG * es), ds0(nS * ss), dO(nV * es),
            dS(c.inPlace ? 4 : nSOut * ss), dws(workspaceBytes);
        dq.upload(hq.data());
        dk.upload(hk.data());
        dv.upload(hv.data());
        dg.upload(g.data());
        dbeta.upload(hbeta.data());
        ds0.upload(hs0.data());
        dO.poison();
        dS.poison();
        dws.poison();
        void* stateOut = c.inPlace ? ds0.get() : dS.get();
        void const* inputs[] = {dq.get(), dk.get(), dv.get(), dg.get(), dbeta.get(), ds0.get()};
        void* outputs[] = {dO.get(), stateOut};
        row.ms = timedEnqueue(rt, inDesc, outDesc, inputs, outputs, workspaceBytes ? dws.get() : nullptr);

        auto oBytes = dO.download();
        auto sBytes = c.inPlace ? ds0.download() : dS.download();
        auto oGot = gdn::test::loadAs(c.dtype, oBytes.data(), nV);
        auto sGot = gdn::test::loadAs(c.state, sBytes.data(), nSOut);
        std::vector<double> oRef, sRef;
        if (c.steps)
        {
            stepsReference(s, q, k, v, g, beta, s0, scale, c.l2norm, c.state, oRef, sRef, threads);
        }
        else
        {
            gdn::test::gatedDeltaRuleReference(s, q, k, v, g, beta, s0, scale, c.l2norm, oRef, sRef, threads);
        }
        row.errOut = gdn::test::relativeRms(oGot, oRef);
        row.errState = gdn::test::relativeRms(sGot, sRef);
        row.pass = row.errOut <= boundFor(c.dtype) && row.errState <= row.bound;
        if (!row.pass)
        {
            row.note = "outside the bound";
        }
    }
    catch (std::exception const& e)
    {
        row.pass = false;
        row.note = e.what();
    }
    return row;
}

// ==================================================================== CausalConv1d

struct ConvCase
{
    int32_t B, T, C, K;
    DType dtype;
    bool inPlace;
    bool silu;
    bool ragged; // rows of lengths T, T / 2, 0, T, ... (right padding) instead of all T
};

//! seq_lens of a case: all T, or T, T / 2, 0 repeating (T = 1: 1, 0, 0), so some rows keep their state.
std::vector<int32_t> convLengths(ConvCase const& c)
{
    std::vector<int32_t> lens(static_cast<size_t>(c.B), c.T);
    for (int32_t b = 0; c.ragged && b < c.B; ++b)
    {
        lens[b] = b % 3 == 0 ? c.T : b % 3 == 1 ? c.T / 2 : 0;
    }
    return lens;
}

Row runConv(ConvCase const& c)
{
    using IO = gdn::plugin::CausalConv1dIO;
    Row row;
    row.op = "CausalConv1d";
    row.dtype = gdn::test::dtypeName(c.dtype);
    std::ostringstream sh;
    sh << "B=" << c.B << " T=" << c.T << " C=" << c.C << " K=" << c.K;
    row.shape = sh.str();
    row.flags = std::string(c.inPlace ? "in-place" : "separate") + (c.silu ? ",silu" : "") + (c.ragged ? ",ragged" : "");
    row.bound = boundFor(c.dtype);
    try
    {
        int32_t const W = c.K - 1;
        int32_t const nIn = IO::kNB_INPUTS;
        int32_t const nIO = IO::kNB_INPUTS + IO::kNB_OUTPUTS;
        IPluginCreatorV3One* creator = findCreator(gdn::plugin::kCONV_PLUGIN_NAME);
        int32_t const act = c.silu ? 1 : 0;
        PluginField fieldArr[] = {PluginField("activation", &act, PluginFieldType::kINT32, 1)};
        PluginFieldCollection fc{1, fieldArr};
        std::unique_ptr<IPluginV3> plugin(creator->createPlugin("conv_test", &fc, TensorRTPhase::kBUILD));
        HOST_CHECK(plugin != nullptr, "createPlugin(kBUILD) failed: " << gLoggerFinder.mLogger.last());
        Caps caps = capabilities(plugin.get(), gdn::plugin::kCONV_PLUGIN_NAME);
        DataType const t = trtType(c.dtype);
        DataType inTypes[IO::kNB_INPUTS] = {t, t, t, t, DataType::kINT32};
        DataType outTypes[2] = {DataType::kINT8, DataType::kINT8};
        HOST_CHECK(caps.build->getOutputDataTypes(outTypes, 2, inTypes, nIn) == 0 && outTypes[0] == t && outTypes[1] == t,
            "getOutputDataTypes");
        std::vector<Dims> inDims = {makeDims({c.B, c.T, c.C}), makeDims({c.C, c.K}), makeDims({c.C}),
            makeDims({c.B, c.C, W}), makeDims({c.B})};
        {
            gdn::test::FakeExprBuilder eb;
            auto const* symB = eb.symbol(c.B);
            auto const* symT = eb.symbol(c.T);
            DimsExprs in[IO::kNB_INPUTS];
            for (int32_t i = 0; i < nIn; ++i)
            {
                in[i].nbDims = inDims[i].nbDims;
                for (int32_t d = 0; d < inDims[i].nbDims; ++d)
                {
                    bool const isB = d == 0 && (i == IO::kX || i == IO::kCONV_STATE || i == IO::kSEQ_LENS);
                    bool const isT = d == 1 && i == IO::kX;
                    in[i].d[d] = isB ? symB : isT ? symT : eb.fixed(inDims[i].d[d]);
                }
            }
            DimsExprs out[2]{};
            HOST_CHECK(caps.build->getOutputShapes(in, nIn, nullptr, 0, out, 2, eb) == 0, "getOutputShapes failed");
            HOST_CHECK(out[IO::kY].nbDims == 3 && std::equal(out[0].d, out[0].d + 3, in[IO::kX].d),
                "getOutputShapes: y is not x's shape");
            HOST_CHECK(out[IO::kNEW_CONV_STATE].nbDims == 3 && std::equal(out[1].d, out[1].d + 3, in[IO::kCONV_STATE].d),
                "getOutputShapes: new_conv_state is not conv_state's shape");
        }
        DynamicPluginTensorDesc io[IO::kNB_INPUTS + IO::kNB_OUTPUTS]{};
        for (int32_t i = 0; i < nIO; ++i)
        {
            Dims const d = i < nIn ? inDims[i] : (i == nIn + IO::kY ? inDims[IO::kX] : inDims[IO::kCONV_STATE]);
            io[i].desc.dims = d;
            io[i].desc.type = i == IO::kSEQ_LENS ? DataType::kINT32 : t;
            io[i].desc.format = TensorFormat::kLINEAR;
            io[i].min = io[i].opt = io[i].max = d;
        }
        for (int32_t pos = 0; pos < nIO; ++pos)
        {
            HOST_CHECK(caps.build->supportsFormatCombination(pos, io, nIn, 2), "supportsFormatCombination rejected " << pos);
        }
        {
            DynamicPluginTensorDesc bad[IO::kNB_INPUTS + IO::kNB_OUTPUTS];
            std::copy(io, io + nIO, bad);
            bad[IO::kCONV_STATE].desc.type = t == DataType::kFLOAT ? DataType::kHALF : DataType::kFLOAT;
            HOST_CHECK(!caps.build->supportsFormatCombination(IO::kCONV_STATE, bad, nIn, 2), "mixed dtypes accepted");
            bad[IO::kSEQ_LENS].desc.type = t;
            HOST_CHECK(!caps.build->supportsFormatCombination(IO::kSEQ_LENS, bad, nIn, 2), "float seq_lens accepted");
        }
        HOST_CHECK(caps.build->configurePlugin(io, nIn, io + nIn, 2) == 0, "configurePlugin failed");
        size_t const workspaceBytes = caps.build->getWorkspaceSize(io, nIn, io + nIn, 2);
        HOST_CHECK(caps.build->getAliasedInput(IO::kNEW_CONV_STATE) == IO::kCONV_STATE
                && caps.build->getAliasedInput(IO::kY) == -1,
            "getAliasedInput");

        std::unique_ptr<IPluginV3> attached(roundTrip(creator, caps.runtime, "conv_test"));
        auto* rt = static_cast<IPluginV3OneRuntime*>(attached->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        PluginTensorDesc inDesc[IO::kNB_INPUTS]{}, outDesc[2]{};
        for (int32_t i = 0; i < nIn; ++i)
        {
            inDesc[i] = {inDims[i], inTypes[i], TensorFormat::kLINEAR, -1.F};
        }
        outDesc[0] = {inDims[IO::kX], t, TensorFormat::kLINEAR, -1.F};
        outDesc[1] = {inDims[IO::kCONV_STATE], t, TensorFormat::kLINEAR, -1.F};
        HOST_CHECK(rt->onShapeChange(inDesc, nIn, outDesc, 2) == 0, "onShapeChange failed");
        if (gNoGpu)
        {
            row.pass = true;
            row.note = "interface only (--no-gpu)";
            return row;
        }

        size_t const nX = static_cast<size_t>(c.B) * c.T * c.C;
        size_t const nS = static_cast<size_t>(c.B) * c.C * W;
        std::mt19937 rng(99u + c.T * 7u + c.C * 3u + c.B + static_cast<uint32_t>(c.dtype));
        auto id = [](float x) { return x; };
        auto x = gdn::test::roundTo(c.dtype, randomVector(rng, nX, id));
        auto w = gdn::test::roundTo(c.dtype, randomVector(rng, static_cast<size_t>(c.C) * c.K, [](float v) { return 0.5F * v; }));
        auto bias = gdn::test::roundTo(c.dtype, randomVector(rng, c.C, [](float v) { return 0.1F * v; }));
        auto s0 = gdn::test::roundTo(c.dtype, randomVector(rng, nS, id));


        size_t const es = gdn::test::dtypeSize(c.dtype);
        std::vector<uint8_t> hx, hw, hb, hs;
        gdn::test::storeAs(c.dtype, x, hx);
        gdn::test::storeAs(c.dtype, w, hw);
        gdn::test::storeAs(c.dtype, bias, hb);
        gdn::test::storeAs(c.dtype, s0, hs);
        std::vector<int32_t> const lens = convLengths(c);
        DeviceBuffer dx(nX * es), dw(hw.size()), db(hb.size()), ds0(nS * es), dlens(lens.size() * 4), dy(nX * es),
            dS(nS * es), dws(workspaceBytes);
        dx.upload(hx.data());
        dlens.upload(lens.data());
        dw.upload(hw.data());
        db.upload(hb.data());
        ds0.upload(hs.data());
        dy.poison();
        dS.poison();
        void* stateOut = c.inPlace ? ds0.get() : dS.get();
        void const* inputs[] = {dx.get(), dw.get(), db.get(), ds0.get(), dlens.get()};
        void* outputs[] = {dy.get(), stateOut};
        row.ms = timedEnqueue(rt, inDesc, outDesc, inputs, outputs, workspaceBytes ? dws.get() : nullptr);

        auto yGot = gdn::test::loadAs(c.dtype, dy.download().data(), nX);
        auto sGot = gdn::test::loadAs(c.dtype, (c.inPlace ? ds0.download() : dS.download()).data(), nS);
        std::vector<double> yRef, sRef;
        gdn::test::causalConv1dReference(c.B, c.T, c.C, c.K, x, w, bias, s0, lens, c.silu, yRef, sRef);
        // y at padded positions is unspecified but must be finite: checked, then left out of the comparison.
        for (int32_t b = 0; b < c.B; ++b)
        {
            for (size_t i = static_cast<size_t>(b * c.T + lens[b]) * c.C; i < static_cast<size_t>(b + 1) * c.T * c.C; ++i)
            {
                HOST_CHECK(std::isfinite(yGot[i]), "y is not finite at a padded position of row " << b);
                yGot[i] = 0.F;
                yRef[i] = 0.0;
            }
        }
        row.errOut = gdn::test::relativeRms(yGot, yRef);
        row.errState = nS ? gdn::test::relativeRms(sGot, sRef) : 0.0;
        row.pass = row.errOut <= row.bound && row.errState <= row.bound;
        if (!row.pass)
        {
            row.note = "outside the bound";
        }
    }
    catch (std::exception const& e)
    {
        row.pass = false;
        row.note = e.what();
    }
    return row;
}

// ==================================================================== error cases

//! The MoE plugin's build-time calls on hidden [N, 64], router_logits [N, 4], gate_up [4, 32, 64],
//! down [4, 64, 16]: "" when they behave, else what went wrong.
std::string checkMoEInterface(IPluginCreatorV3One* moe)
{
    auto& logger = gLoggerFinder.mLogger;
    int32_t const topK = 2;
    int32_t const tooMany = 7;
    int32_t const one = 1;
    auto make = [&](int32_t const* k) {
        PluginField f[] = {PluginField("top_k", k, PluginFieldType::kINT32, 1),
            PluginField("norm_topk_prob", &one, PluginFieldType::kINT32, 1)};
        PluginFieldCollection fc{2, f};
        return std::unique_ptr<IPluginV3>(moe->createPlugin("moe", &fc, TensorRTPhase::kBUILD));
    };
    std::unique_ptr<IPluginV3> good = make(&topK);
    std::unique_ptr<IPluginV3> bad = make(&tooMany);
    if (good == nullptr || bad == nullptr)
    {
        return "createPlugin failed";
    }
    auto build = [](IPluginV3* p) {
        return static_cast<IPluginV3OneBuildV2*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
    };
    DynamicPluginTensorDesc io[5]{};
    std::vector<int64_t> const shapes[5] = {{-1, 64}, {-1, 4}, {4, 32, 64}, {4, 64, 16}, {-1, 64}};
    for (int32_t i = 0; i < 5; ++i)
    {
        io[i].desc.type = DataType::kHALF;
        io[i].desc.format = TensorFormat::kLINEAR;
        io[i].desc.dims = makeDims(shapes[i]);
        std::vector<int64_t> lo = shapes[i], hi = shapes[i];
        if (lo[0] < 0)
        {
            lo[0] = 1;
            hi[0] = 256;
        }
        io[i].min = io[i].opt = makeDims(lo);
        io[i].max = makeDims(hi);
    }
    logger.clear();
    logger.mEcho = false;
    DataType in[4] = {DataType::kHALF, DataType::kHALF, DataType::kHALF, DataType::kBF16};
    DataType out[1];
    int32_t const rcType = build(good.get())->getOutputDataTypes(out, 1, in, 4);
    bool const typeNamed = logger.contains("down is kBF16");
    in[3] = DataType::kHALF;
    int32_t const rcTypeOk = build(good.get())->getOutputDataTypes(out, 1, in, 4);
    int32_t const rcGood = build(good.get())->configurePlugin(io, 4, io + 4, 1);
    size_t const ws = build(good.get())->getWorkspaceSize(io, 4, io + 4, 1);
    int32_t const aliased = build(good.get())->getAliasedInput(0);
    logger.clear();
    int32_t const rcBad = build(bad.get())->configurePlugin(io, 4, io + 4, 1);
    bool const badNamed = logger.contains("top_k = 7 exceeds the 4 experts");
    logger.mEcho = true;
    if (rcType == 0 || !typeNamed)
    {
        return "bf16 down with fp16 hidden: rc " + std::to_string(rcType) + ", message " + logger.last();
    }
    if (rcTypeOk != 0 || out[0] != DataType::kHALF)
    {
        return "getOutputDataTypes refused four fp16 inputs or gave another dtype";
    }
    if (rcGood != 0 || ws == 0 || aliased != -1)
    {
        return "top_k = 2: configurePlugin rc " + std::to_string(rcGood) + ", workspace " + std::to_string(ws)
            + ", aliased input " + std::to_string(aliased);
    }
    if (rcBad == 0 || !badNamed)
    {
        return "top_k = 7 with E = 4: configurePlugin rc " + std::to_string(rcBad) + ", message " + logger.last();
    }
    return "";
}

//! Each check returns "" on success or what went wrong.
std::vector<std::pair<std::string, std::string>> runErrorChecks()
{
    std::vector<std::pair<std::string, std::string>> results;
    auto& logger = gLoggerFinder.mLogger;
    auto expectFailure = [&](std::string const& name, IPluginCreatorV3One* creator, PluginFieldCollection const& fc,
                             std::string const& needle) {
        logger.clear();
        logger.mEcho = false;
        std::unique_ptr<IPluginV3> p(creator->createPlugin("bad", &fc, TensorRTPhase::kBUILD));
        logger.mEcho = true;
        std::string err;
        if (p != nullptr)
        {
            err = "createPlugin succeeded";
        }
        else if (!logger.contains(needle))
        {
            err = "no message containing '" + needle + "' (last: " + logger.last() + ")";
        }
        results.emplace_back(name, err);
    };
    IPluginCreatorV3One* gdr = findCreator(gdn::plugin::kGDR_PLUGIN_NAME);
    IPluginCreatorV3One* conv = findCreator(gdn::plugin::kCONV_PLUGIN_NAME);
    IPluginCreatorV3One* moe = findCreator(gdn::plugin::kMOE_PLUGIN_NAME);
    auto expectFieldNames = [&](IPluginCreatorV3One* creator, std::vector<std::pair<std::string, PluginFieldType>> want) {
        PluginFieldCollection const* fc = creator->getFieldNames();
        std::string err;
        if (fc == nullptr || fc->nbFields != static_cast<int32_t>(want.size()))
        {
            err = "getFieldNames lists " + std::to_string(fc ? fc->nbFields : -1) + " fields";
        }
        else
        {
            for (size_t i = 0; i < want.size(); ++i)
            {
                if (want[i].first != fc->fields[i].name || want[i].second != fc->fields[i].type)
                {
                    err = std::string("unexpected field ") + fc->fields[i].name;
                }
            }
        }
        results.emplace_back(std::string(creator->getPluginName()) + " getFieldNames", err);
    };
    expectFieldNames(gdr, {{"scale", PluginFieldType::kFLOAT32}, {"use_qk_l2norm", PluginFieldType::kINT32}});
    expectFieldNames(conv, {{"activation", PluginFieldType::kINT32}});
    expectFieldNames(moe, {{"top_k", PluginFieldType::kINT32}, {"norm_topk_prob", PluginFieldType::kINT32}});
    float const scale = 0.125F;
    int32_t const one = 1;
    int32_t const seven = 7;
    {
        PluginField f[] = {PluginField("scale", &scale, PluginFieldType::kFLOAT32, 1)};
        expectFailure("GatedDeltaRule without use_qk_l2norm", gdr, PluginFieldCollection{1, f},
            "field 'use_qk_l2norm' (kINT32) is missing");
    }
    {
        PluginField f[] = {PluginField("scale", &one, PluginFieldType::kINT32, 1),
            PluginField("use_qk_l2norm", &one, PluginFieldType::kINT32, 1)};
        expectFailure("GatedDeltaRule with an int32 scale", gdr, PluginFieldCollection{2, f},
            "field 'scale' must be kFLOAT32, got kINT32");
    }
    {
        PluginField f[] = {PluginField("scale", &scale, PluginFieldType::kFLOAT32, 1),
            PluginField("use_qk_l2norm", &seven, PluginFieldType::kINT32, 1)};
        expectFailure("GatedDeltaRule with use_qk_l2norm = 7", gdr, PluginFieldCollection{2, f}, "must be 0 or 1, got 7");
    }
    expectFailure("CausalConv1d without fields", conv, PluginFieldCollection{0, nullptr},
        "field 'activation' (kINT32) is missing");
    {
        PluginField f[] = {PluginField("activation", &seven, PluginFieldType::kINT32, 1)};
        expectFailure("CausalConv1d with activation = 7", conv, PluginFieldCollection{1, f}, "got 7");
    }
    int32_t const zero = 0;
    int32_t const big = 33;
    expectFailure("MoE without fields", moe, PluginFieldCollection{0, nullptr}, "field 'top_k' (kINT32) is missing");
    for (int32_t const* topK : {&zero, &big})
    {
        PluginField f[] = {PluginField("top_k", topK, PluginFieldType::kINT32, 1),
            PluginField("norm_topk_prob", &one, PluginFieldType::kINT32, 1)};
        expectFailure("MoE with top_k = " + std::to_string(*topK), moe, PluginFieldCollection{2, f},
            "field 'top_k' must be 1..32, got " + std::to_string(*topK));
    }
    {
        PluginField f[] = {PluginField("top_k", &one, PluginFieldType::kINT32, 1),
            PluginField("norm_topk_prob", &seven, PluginFieldType::kINT32, 1)};
        expectFailure("MoE with norm_topk_prob = 7", moe, PluginFieldCollection{2, f}, "must be 0 or 1, got 7");
    }
    results.emplace_back("MoE interface (top_k = 7 > E = 4, bf16 down, workspace)", checkMoEInterface(moe));
    {
        // Mismatched input dtypes must be refused by getOutputDataTypes with a message naming the tensor.
        PluginField f[] = {PluginField("scale", &scale, PluginFieldType::kFLOAT32, 1),
            PluginField("use_qk_l2norm", &one, PluginFieldType::kINT32, 1)};
        PluginFieldCollection fc{2, f};
        std::unique_ptr<IPluginV3> p(gdr->createPlugin("dtype", &fc, TensorRTPhase::kBUILD));
        auto* build = static_cast<IPluginV3OneBuildV2*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
        DataType in[6] = {DataType::kHALF, DataType::kHALF, DataType::kFLOAT, DataType::kFLOAT, DataType::kHALF,
            DataType::kFLOAT};
        DataType out[2];
        logger.clear();
        logger.mEcho = false;
        int32_t const rc = build->getOutputDataTypes(out, 2, in, 6);
        logger.mEcho = true;
        std::string err;
        if (rc == 0)
        {
            err = "accepted fp16 q with fp32 v";
        }
        else if (!logger.contains("v is kFLOAT"))
        {
            err = "message does not name v: " + logger.last();
        }
        results.emplace_back("GatedDeltaRule with fp16 q and fp32 v", err);
    }
    return results;
}

// ==================================================================== driver

std::string fmt(double x, char const* f = "%.2e")
{
    if (std::isnan(x))
    {
        return "-";
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, f, x);
    return buf;
}

} // namespace

int main(int argc, char** argv)
{
    bool quick = false;
    std::string markdownPath;
    int32_t threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < argc; ++i)
    {
        std::string const a = argv[i];
        if (a == "--quick")
        {
            quick = true;
        }
        else if (a == "--no-gpu")
        {
            gNoGpu = true;
        }
        else if (a == "--markdown" && i + 1 < argc)
        {
            markdownPath = argv[++i];
        }
        else if (a == "--threads" && i + 1 < argc)
        {
            threads = std::max(1, std::atoi(argv[++i]));
        }
        else
        {
            std::fprintf(stderr, "usage: %s [--quick] [--no-gpu] [--threads N] [--markdown FILE]\n", argv[0]);
            return 2;
        }
    }
    setLoggerFinder(&gLoggerFinder);
    int device = 0;
    cudaDeviceProp prop{};
    std::string deviceName = "none (--no-gpu: interface calls only)";
    if (!gNoGpu)
    {
        if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess)
        {
            std::fprintf(stderr, "pluginHostTest: no CUDA device (use --no-gpu to check the interface calls only)\n");
            return 1;
        }
        deviceName = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    }

    std::vector<GdrCase> gdrCases;
    std::vector<ConvCase> convCases;
    std::vector<DType> const dtypes = {DType::kF32, DType::kF16, DType::kBF16};
    if (quick)
    {
        for (int32_t T : {1, 65})
        {
            for (DType dt : {DType::kF32, DType::kBF16})
            {
                gdrCases.push_back({{3, T, 1, 2, 64, 64}, dt, true, true});
                gdrCases.push_back({{1, T, 2, 2, 64, 64}, dt, false, false});
            }
            // 16-bit states: the decode kernel of its own at T = 1, the chunked one at T = 65.
            gdrCases.push_back({{3, T, 2, 4, 128, 128}, DType::kBF16, true, true, DType::kBF16});
            gdrCases.push_back({{2, T, 1, 2, 64, 40}, DType::kF32, false, true, DType::kF16});
            gdrCases.push_back({{2, T == 1 ? 4 : 17, 2, 4, 128, 128}, DType::kBF16, false, true, DType::kBF16, true});
            convCases.push_back({3, T, 64, 4, DType::kF16, true, true, true});
            convCases.push_back({1, T, 64, 4, DType::kF32, false, false, false});
        }
    }
    else
    {
        int32_t const hk = 2;
        for (int32_t T : {1, 63, 64, 65, 1000, 4097})
        {
            for (int32_t D : {64, 128})
            {
                for (int32_t hv : {hk, 2 * hk})
                {
                    for (int32_t B : {1, 3})
                    {
                        for (DType dt : dtypes)
                        {
                            // In-place state for B = 3, in-kernel l2norm for Hv = 2 Hk: all four combinations.
                            gdrCases.push_back({{B, T, hk, hv, D, D}, dt, B == 3, hv != hk});
                        }
                    }
                }
            }
            for (DType dt : dtypes)
            {
                gdrCases.push_back({{2, T, 2, 4, 128, 64}, dt, true, true}); // Dk != Dv
                gdrCases.push_back({{2, T, 2, 6, 64, 128}, dt, false, true});
                // 16-bit states, in place and not, with an odd Dv (scalar columns in the decode kernel).
                gdrCases.push_back({{3, T, 2, 4, 128, 128}, dt, true, true, DType::kBF16});
                gdrCases.push_back({{2, T, 1, 3, 64, 100}, dt, false, true, DType::kF16});
            }
            for (int32_t C : {64, 200})
            {
                for (int32_t B : {1, 3})
                {
                    for (DType dt : dtypes)
                    {
                        // Ragged rows with B = 3 and C = 200 (a partial channel block), in place.
                        convCases.push_back({B, T, C, 4, dt, B == 3, C == 64, B == 3 && C == 200});
                    }
                }
            }
            convCases.push_back({2, T, 96, 2, DType::kF32, true, true, true});
            convCases.push_back({3, T, 95, 3, DType::kBF16, false, true, true});
        }
    }
    // GatedDeltaRuleSteps: verify calls of K + 1 = 1..5 tokens, a longer one, every state dtype,
    // grouped heads, Dk != Dv and an odd Dv (scalar columns).
    for (int32_t T : {1, 3, 5, 40})
    {
        for (DType st : dtypes)
        {
            gdrCases.push_back({{3, T, 2, 4, 128, 128}, DType::kBF16, false, true, st, true});
        }
        gdrCases.push_back({{2, T, 1, 3, 64, 100}, DType::kF32, false, true, DType::kF32, true});
        gdrCases.push_back({{1, T, 2, 2, 64, 32}, DType::kF16, false, false, DType::kF16, true});
    }
    // A prefill whose walk grid needs more than one wave of double-buffered 4-warp blocks on any GPU
    // (2 x 48 x 4 = 384 blocks): the launcher runs the single-buffered walk, two blocks a
    // multiprocessor (in the --quick set too, for the sanitizers).
    gdrCases.push_back({{4, 130, 2, 48, 128, 128}, DType::kBF16, false, true});
    gdrCases.push_back({{4, 130, 2, 48, 128, 128}, DType::kF16, true, true, DType::kBF16});

    auto const t0 = std::chrono::steady_clock::now();
    std::vector<Row> rows;
    for (auto const& c : gdrCases)
    {
        rows.push_back(runGdr(c, threads));
    }
    for (auto const& c : convCases)
    {
        rows.push_back(runConv(c));
    }
    auto errors = runErrorChecks();
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::ostringstream md;
    md << "# pluginHostTest" << (quick ? " --quick" : "") << "\n\n";
    md << "Device: " << deviceName << ", " << rows.size() << " cases, "
       << fmt(seconds, "%.1f") << " s. Bound: relative RMS <= 2e-3 (fp32), 1e-2 (fp16/bf16); outputs NaN-poisoned.\n\n";
    md << "| op | dtype | shape | state | rel RMS out | rel RMS state | bound | ms (1st call) | result |\n";
    md << "|---|---|---|---|---|---|---|---|---|\n";
    int32_t failures = 0;
    for (auto const& r : rows)
    {
        failures += r.pass ? 0 : 1;
        md << "| " << r.op << " | " << r.dtype << " | " << r.shape << " | " << r.flags << " | " << fmt(r.errOut) << " | "
           << fmt(r.errState) << " | " << fmt(r.bound, "%.0e") << " | " << fmt(r.ms, "%.3f") << " | "
           << (r.pass ? (r.note.empty() ? "PASS" : "PASS, " + r.note) : "FAIL " + r.note) << " |\n";
    }
    md << "\n| error case | result |\n|---|---|\n";
    for (auto const& e : errors)
    {
        failures += e.second.empty() ? 0 : 1;
        md << "| " << e.first << " | " << (e.second.empty() ? "PASS" : "FAIL " + e.second) << " |\n";
    }
    md << "\n" << (failures ? std::to_string(failures) + " FAILED" : std::string("ALL PASSED")) << "\n";
    std::fputs(md.str().c_str(), stdout);
    if (!markdownPath.empty())
    {
        std::ofstream(markdownPath) << md.str();
    }
    return failures ? 1 : 0;
}
