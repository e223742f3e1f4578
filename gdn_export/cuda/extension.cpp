// PyTorch binding of the gdn CUDA kernels (kernels/<op>/cuda/*.cu). Validation happens here so that a
// bad tensor fails with a message naming it instead of a kernel fault; each op's wrapper
// (gdn_export/ops/<op>/cuda.py) casts and lays out the tensors first (its checked entries) or calls
// straight in (the public op's fast entry, which relies on these checks: gated_delta_rule returns
// its problem instead of raising).
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "causal_conv1d/cuda/causalConv1dKernels.h"
#include "gated_delta_rule/cuda/gatedDeltaRuleKernels.h"
#include "gated_delta_rule/cuda/gatedDeltaRuleKernelsDetail.h"
#include "moe/cuda/moeKernels.h"

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace
{

// The checks come in two forms: a function that returns the problem as one line ("" when there is
// none), and a TORCH_CHECK around it (causal_conv1d and moe, whose Python checks come first). gated_delta_rule uses the first and returns the problem to
// Python instead of throwing (the public op's fast entry calls it with no Python checks in front).
// The messages are built by `cat` below, not c10::str: on the H200 image (torch 2.11+cu130)
// formatting a shape with c10's operator<< ended the process with a segmentation fault, thrown or
// not.

void append(std::string& s, char const* x)
{
    s += x;
}

void append(std::string& s, std::string const& x)
{
    s += x;
}

void append(std::string& s, int64_t x)
{
    s += std::to_string(x);
}

void append(std::string& s, at::IntArrayRef dims)
{
    s += '[';
    for (size_t i = 0; i < dims.size(); ++i)
    {
        s += i == 0 ? "" : ", ";
        s += std::to_string(dims[i]);
    }
    s += ']';
}

void append(std::string& s, at::Device d)
{
    s += d.str();
}

void append(std::string& s, at::ScalarType t)
{
    s += c10::toString(t);
}

template <typename... Parts>
std::string cat(Parts const&... parts)
{
    std::string s;
    (append(s, parts), ...);
    return s;
}

bool floatType(at::ScalarType t)
{
    return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

gdn::DataType toDataType(at::ScalarType t)
{
    return t == at::kHalf ? gdn::DataType::kFLOAT16
        : t == at::kBFloat16 ? gdn::DataType::kBFLOAT16
                             : gdn::DataType::kFLOAT32;
}

std::string dtypeProblem(at::ScalarType t, char const* name)
{
    return floatType(t) ? std::string() : cat(name, " must be float32, float16 or bfloat16, got ", t);
}

std::string tensorProblem(at::Tensor const& t, char const* name, at::Device device, at::ScalarType dtype)
{
    if (t.device() != device)
    {
        return cat(name, " must be on ", device, ", got ", t.device());
    }
    if (t.scalar_type() != dtype)
    {
        return cat(name, " must be ", dtype, ", got ", t.scalar_type());
    }
    return t.is_contiguous() ? std::string() : cat(name, " must be contiguous");
}

std::string shapeProblem(at::Tensor const& t, char const* name, std::vector<int64_t> const& shape)
{
    return t.sizes().vec() == shape ? std::string()
                                    : cat(name, " must have shape ", at::IntArrayRef(shape), ", got ", t.sizes());
}

std::string int32Problem(int64_t x, char const* what)
{
    return x >= 0 && x <= INT32_MAX ? std::string() : cat(what, " = ", x, " does not fit in int32");
}

gdn::DataType toDataType(at::ScalarType t, char const* name)
{
    std::string const problem = dtypeProblem(t, name);
    TORCH_CHECK(problem.empty(), problem);
    return toDataType(t);
}

void checkTensor(at::Tensor const& t, char const* name, at::Device device, at::ScalarType dtype)
{
    std::string const problem = tensorProblem(t, name, device, dtype);
    TORCH_CHECK(problem.empty(), problem);
}

void checkShape(at::Tensor const& t, char const* name, std::vector<int64_t> const& shape)
{
    std::string const problem = shapeProblem(t, name, shape);
    TORCH_CHECK(problem.empty(), problem);
}

void checkInt32(int64_t x, char const* what)
{
    std::string const problem = int32Problem(x, what);
    TORCH_CHECK(problem.empty(), problem);
}

using Tensors = std::vector<at::Tensor>;
using TensorsOrProblem = std::tuple<Tensors, std::string>;

// Returns ({}, the problem) from the enclosing function when `problem` (an expression) is not empty.
#define GDN_RETURN_PROBLEM(problem)                                                                                    \
    do                                                                                                                 \
    {                                                                                                                  \
        std::string gdnProblem = (problem);                                                                            \
        if (!gdnProblem.empty())                                                                                       \
        {                                                                                                              \
            return TensorsOrProblem{Tensors{}, std::move(gdnProblem)};                                                 \
        }                                                                                                              \
    } while (0)
#define GDN_REQUIRE(cond, ...) GDN_RETURN_PROBLEM((cond) ? std::string() : cat(__VA_ARGS__))

// ((o, final_state), "") or ({}, the problem in one line); steps: ((o, states [B, T, Hv, Dk, Dv]), "")
// with the state after every token (the recurrent kernel, any T). o_out / final_state_out, when given,
// receive the results (final_state_out may be initial_state itself: in-place decode). path: 0 auto,
// 1 recurrent, 2 chunked, 3-6 chunked with its sequential pass pinned (gdn::GatedDeltaRulePath: 3 wmma
// walk, 4 / 5 / 6 mma.sync walk on 1 / 2 / 4 warps). smem_limit > 0: shared memory a block may use,
// below the device's (the kernel choices of a smaller GPU).
TensorsOrProblem gatedDeltaRule(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& g,
    at::Tensor const& beta, std::optional<at::Tensor> const& initialState, double scale, bool useQkL2norm,
    std::optional<at::Tensor> const& cuSeqlens, std::optional<at::Tensor> const& oOut,
    std::optional<at::Tensor> const& finalStateOut, int64_t path, int64_t smemLimit, bool steps)
{
    GDN_REQUIRE(q.dim() == 4, "q must be [B, T, Hk, Dk], got ", q.sizes());
    GDN_REQUIRE(v.dim() == 4, "v must be [B, T, Hv, Dv], got ", v.sizes());
    GDN_REQUIRE(q.is_cuda(), "q must be a CUDA tensor, got ", q.device());
    at::Device const device = q.device();
    at::ScalarType const dtype = v.scalar_type();
    GDN_RETURN_PROBLEM(dtypeProblem(dtype, "v"));
    int64_t const B = q.size(0), T = q.size(1), Hk = q.size(2), Dk = q.size(3);
    int64_t const Hv = v.size(2), Dv = v.size(3);
    GDN_RETURN_PROBLEM(shapeProblem(k, "k", {B, T, Hk, Dk}));
    GDN_RETURN_PROBLEM(shapeProblem(v, "v", {B, T, Hv, Dv}));
    GDN_RETURN_PROBLEM(shapeProblem(g, "g", {B, T, Hv}));
    GDN_RETURN_PROBLEM(shapeProblem(beta, "beta", {B, T, Hv}));
    GDN_REQUIRE(Hk > 0 && Hv % Hk == 0, "value heads (", Hv, ") must be a multiple of key heads (", Hk, ")");
    GDN_RETURN_PROBLEM(tensorProblem(q, "q", device, dtype));
    GDN_RETURN_PROBLEM(tensorProblem(k, "k", device, dtype));
    GDN_RETURN_PROBLEM(tensorProblem(v, "v", device, dtype));
    GDN_RETURN_PROBLEM(tensorProblem(g, "g", device, at::kFloat));
    GDN_RETURN_PROBLEM(tensorProblem(beta, "beta", device, dtype));
    int64_t N = B;
    if (cuSeqlens.has_value())
    {
        GDN_REQUIRE(B == 1, "cu_seqlens needs B = 1, got B = ", B);
        GDN_REQUIRE(cuSeqlens->dim() == 1 && cuSeqlens->size(0) >= 2, "cu_seqlens must be [N + 1] with N >= 1, got ",
            cuSeqlens->sizes());
        GDN_RETURN_PROBLEM(tensorProblem(*cuSeqlens, "cu_seqlens", device, at::kInt));
        N = cuSeqlens->size(0) - 1;
    }
    for (int64_t x : {B, T, Hk, Dk, Hv, Dv, N, B * T * Hv * Dv})
    {
        GDN_RETURN_PROBLEM(int32Problem(x, "a dimension of gated_delta_rule"));
    }
    // The state's storage dtype: initial_state's, else final_state_out's, else fp32.
    at::ScalarType const stateDtype = initialState.has_value() ? initialState->scalar_type()
        : finalStateOut.has_value()                            ? finalStateOut->scalar_type()
                                                               : at::kFloat;
    GDN_RETURN_PROBLEM(dtypeProblem(stateDtype, "the recurrent state"));
    if (initialState.has_value())
    {
        GDN_RETURN_PROBLEM(shapeProblem(*initialState, "initial_state", {N, Hv, Dk, Dv}));
        GDN_RETURN_PROBLEM(tensorProblem(*initialState, "initial_state", device, stateDtype));
    }
    if (oOut.has_value())
    {
        GDN_RETURN_PROBLEM(shapeProblem(*oOut, "o", {B, T, Hv, Dv}));
        GDN_RETURN_PROBLEM(tensorProblem(*oOut, "o", device, dtype));
    }
    if (finalStateOut.has_value())
    {
        GDN_RETURN_PROBLEM(shapeProblem(*finalStateOut, "final_state", {N, Hv, Dk, Dv}));
        GDN_RETURN_PROBLEM(tensorProblem(*finalStateOut, "final_state", device, stateDtype));
    }
    GDN_REQUIRE(path >= 0 && path <= 6,
        "path must be 0 (auto), 1 (recurrent), 2 (chunked) or 3-6 (chunked, walk pinned), got ", path);
    GDN_RETURN_PROBLEM(int32Problem(smemLimit, "smem_limit"));
    GDN_REQUIRE(!steps || ((path == 0 || path == 1) && !finalStateOut.has_value()),
        "every token's state (steps) runs the recurrent kernel (path 0 or 1) and has no final_state_out");

    c10::cuda::CUDAGuard const guard(device);
    at::Tensor const o = oOut.has_value() ? *oOut : at::empty({B, T, Hv, Dv}, v.options());
    // steps: the state after every token [B, T, Hv, Dk, Dv] in place of the final state
    at::Tensor const finalState = finalStateOut.has_value() ? *finalStateOut
        : steps ? at::empty({B, T, Hv, Dk, Dv}, v.options().dtype(stateDtype))
                : at::empty({N, Hv, Dk, Dv}, v.options().dtype(stateDtype));
    gdn::GatedDeltaRuleParams p;
    p.dtype = toDataType(dtype);
    p.batch = static_cast<int32_t>(B);
    p.seqLen = static_cast<int32_t>(T);
    p.numKeyHeads = static_cast<int32_t>(Hk);
    p.numValueHeads = static_cast<int32_t>(Hv);
    p.keyDim = static_cast<int32_t>(Dk);
    p.valueDim = static_cast<int32_t>(Dv);
    p.numSeqs = cuSeqlens.has_value() ? static_cast<int32_t>(N) : 0;
    p.cuSeqlens = cuSeqlens.has_value() ? cuSeqlens->data_ptr<int32_t>() : nullptr;
    p.scale = static_cast<float>(scale);
    p.useQkL2norm = useQkL2norm;
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.g = g.data_ptr<float>();
    p.beta = beta.data_ptr();
    p.initialState = initialState.has_value() ? initialState->data_ptr() : nullptr;
    p.o = o.data_ptr();
    p.finalState = steps ? nullptr : finalState.data_ptr();
    p.stepStates = steps ? finalState.data_ptr() : nullptr;
    p.stateType = toDataType(stateDtype);

    auto const which = static_cast<gdn::GatedDeltaRulePath>(path);
    size_t const bytes = which == gdn::GatedDeltaRulePath::kAUTO ? gdn::gatedDeltaRuleWorkspaceSize(p)
        : which == gdn::GatedDeltaRulePath::kRECURRENT          ? 0
                                                                : gdn::gatedDeltaRuleChunkedWorkspaceSize(p);
    // no allocation for a decode step (no workspace): each costs host time a small kernel cannot hide
    at::Tensor workspace;
    if (bytes > 0)
    {
        workspace = at::empty({static_cast<int64_t>(bytes)}, v.options().dtype(at::kByte));
    }
    cudaError_t const err = gdn::launchGatedDeltaRuleWithPath(p, bytes > 0 ? workspace.data_ptr() : nullptr, which,
        c10::cuda::getCurrentCUDAStream().stream(), static_cast<int32_t>(smemLimit));
    GDN_REQUIRE(err == cudaSuccess, "gated_delta_rule CUDA kernels failed: ", cudaGetErrorString(err), " (B=", B,
        " T=", T, " Hk=", Hk, " Hv=", Hv, " Dk=", Dk, " Dv=", Dv, " path=", path, ")");
    return TensorsOrProblem{Tensors{o, finalState}, std::string()};
}

#undef GDN_REQUIRE
#undef GDN_RETURN_PROBLEM

// (y, new_conv_state). new_conv_state_out may be conv_state itself (in-place decode). seq_lens [B] int32
// (right-padded rows; none = all T) is clamped to [0, T] by the kernel.
std::vector<at::Tensor> causalConv1d(at::Tensor const& x, at::Tensor const& weight,
    std::optional<at::Tensor> const& bias, std::optional<at::Tensor> const& convState, bool silu,
    std::optional<at::Tensor> const& yOut, std::optional<at::Tensor> const& newConvStateOut,
    std::optional<at::Tensor> const& seqLens)
{
    TORCH_CHECK(x.dim() == 3, cat("x must be [B, T, C], got ", x.sizes()));
    TORCH_CHECK(x.is_cuda(), cat("x must be a CUDA tensor, got ", x.device()));
    TORCH_CHECK(weight.dim() == 2, cat("weight must be [C, K], got ", weight.sizes()));
    at::Device const device = x.device();
    at::ScalarType const dtype = x.scalar_type();
    gdn::DataType const dt = toDataType(dtype, "x");
    int64_t const B = x.size(0), T = x.size(1), C = x.size(2), K = weight.size(1);
    checkShape(weight, "weight", {C, K});
    TORCH_CHECK(K >= 1 && K <= 8, "weight's kernel size must be 1..8, got ", K);
    for (int64_t d : {B, T, C, B * T * C})
    {
        checkInt32(d, "a dimension of causal_conv1d");
    }
    checkTensor(x, "x", device, dtype);
    checkTensor(weight, "weight", device, dtype);
    if (bias.has_value())
    {
        checkShape(*bias, "bias", {C});
        checkTensor(*bias, "bias", device, dtype);
    }
    if (convState.has_value())
    {
        checkShape(*convState, "conv_state", {B, C, K - 1});
        checkTensor(*convState, "conv_state", device, dtype);
    }
    if (seqLens.has_value())
    {
        checkShape(*seqLens, "seq_lens", {B});
        checkTensor(*seqLens, "seq_lens", device, at::kInt);
    }
    at::Tensor y = yOut.has_value() ? *yOut : at::empty({B, T, C}, x.options());
    at::Tensor newState = newConvStateOut.has_value() ? *newConvStateOut : at::empty({B, C, K - 1}, x.options());
    checkShape(y, "y", {B, T, C});
    checkTensor(y, "y", device, dtype);
    checkShape(newState, "new_conv_state", {B, C, K - 1});
    checkTensor(newState, "new_conv_state", device, dtype);

    gdn::CausalConv1dParams p;
    p.dtype = dt;
    p.batch = static_cast<int32_t>(B);
    p.seqLen = static_cast<int32_t>(T);
    p.channels = static_cast<int32_t>(C);
    p.kernelSize = static_cast<int32_t>(K);
    p.silu = silu;
    p.x = x.data_ptr();
    p.weight = weight.data_ptr();
    p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
    p.convState = convState.has_value() ? convState->data_ptr() : nullptr;
    p.seqLens = seqLens.has_value() ? seqLens->data_ptr<int32_t>() : nullptr;
    p.y = y.data_ptr();
    p.newConvState = newState.data_ptr();
    c10::cuda::CUDAGuard const guard(device);
    cudaError_t const err = gdn::launchCausalConv1d(p, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "causal_conv1d CUDA kernel failed: ", cudaGetErrorString(err), " (B=", B, " T=",
        T, " C=", C, " K=", K, ")");
    return {y, newState};
}

// out [N, H]: routed experts (all four tensors in one dtype; see kernels/moe/cuda/moeKernels.h).
at::Tensor moe(at::Tensor const& hidden, at::Tensor const& routerLogits, at::Tensor const& gateUp,
    at::Tensor const& down, int64_t topK, bool normTopkProb)
{
    TORCH_CHECK(hidden.dim() == 2, cat("hidden must be [N, H], got ", hidden.sizes()));
    TORCH_CHECK(hidden.is_cuda(), cat("hidden must be a CUDA tensor, got ", hidden.device()));
    TORCH_CHECK(routerLogits.dim() == 2, cat("router_logits must be [N, E], got ", routerLogits.sizes()));
    TORCH_CHECK(down.dim() == 3, cat("down must be [E, H, I], got ", down.sizes()));
    at::Device const device = hidden.device();
    at::ScalarType const dtype = hidden.scalar_type();
    gdn::DataType const dt = toDataType(dtype, "hidden");
    int64_t const N = hidden.size(0), H = hidden.size(1), E = routerLogits.size(1), I = down.size(2);
    checkShape(routerLogits, "router_logits", {N, E});
    checkShape(gateUp, "gate_up", {E, 2 * I, H});
    checkShape(down, "down", {E, H, I});
    checkTensor(hidden, "hidden", device, dtype);
    checkTensor(routerLogits, "router_logits", device, dtype);
    checkTensor(gateUp, "gate_up", device, dtype);
    checkTensor(down, "down", device, dtype);
    TORCH_CHECK(E >= 1 && E <= gdn::kMOE_MAX_EXPERTS, "experts must be 1..", gdn::kMOE_MAX_EXPERTS, ", got ", E);
    TORCH_CHECK(topK >= 1 && topK <= E && topK <= gdn::kMOE_MAX_TOP_K, "top_k must be 1..min(E, ",
        gdn::kMOE_MAX_TOP_K, "), got ", topK);
    for (int64_t d : {N, H, I, N * topK, E * 2 * I * H})
    {
        checkInt32(d, "a dimension of moe");
    }
    at::Tensor out = at::empty({N, H}, hidden.options());
    gdn::MoEParams p;
    p.dtype = dt;
    p.numTokens = static_cast<int32_t>(N);
    p.hiddenSize = static_cast<int32_t>(H);
    p.numExperts = static_cast<int32_t>(E);
    p.interSize = static_cast<int32_t>(I);
    p.topK = static_cast<int32_t>(topK);
    p.normTopkProb = normTopkProb;
    p.hidden = hidden.data_ptr();
    p.routerLogits = routerLogits.data_ptr();
    p.gateUp = gateUp.data_ptr();
    p.down = down.data_ptr();
    p.out = out.data_ptr();
    c10::cuda::CUDAGuard const guard(device);
    at::Tensor workspace
        = at::empty({static_cast<int64_t>(gdn::moeWorkspaceSize(p))}, hidden.options().dtype(at::kByte));
    cudaError_t const err = gdn::launchMoE(p, workspace.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "moe CUDA kernels failed: ", cudaGetErrorString(err), " (N=", N, " H=", H,
        " E=", E, " I=", I, " top_k=", topK, ")");
    return out;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("gated_delta_rule", &gatedDeltaRule, "gated delta rule ((o, final_state), \"\") or ([], problem)",
        py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("initial_state"), py::arg("scale"),
        py::arg("use_qk_l2norm"), py::arg("cu_seqlens"), py::arg("o_out") = py::none(),
        py::arg("final_state_out") = py::none(), py::arg("path") = 0, py::arg("smem_limit") = 0,
        py::arg("steps") = false);
    m.def("causal_conv1d", &causalConv1d, "causal depthwise conv1d (y, new_conv_state)", py::arg("x"),
        py::arg("weight"), py::arg("bias"), py::arg("conv_state"), py::arg("silu"), py::arg("y_out") = py::none(),
        py::arg("new_conv_state_out") = py::none(), py::arg("seq_lens") = py::none());
    m.def("moe", &moe, "routed experts (out)", py::arg("hidden"), py::arg("router_logits"), py::arg("gate_up"),
        py::arg("down"), py::arg("top_k"), py::arg("norm_topk_prob"));
}
