// Tiles of the 16-bit-state decode kernel (gatedDeltaRuleDecode16Kernel), side by side on one GPU:
// kBV = 64 / 32 / 16 state columns per block on 2, 4 or 8 warps, some with registers capped for a
// number of resident blocks (bvCOLSwWARPSmBLOCKS), the public launcher (launchGatedDeltaRule, what
// the op and the plugin call, which picks a tile by grid size), and two floors for the bytes a step
// moves: the decode grid staging its tiles and writing them back with no arithmetic (copytile), and a
// device copy (memcpy). Results and what else was tried: docs/perf/LOG.md ("Recurrent state dtype").
// Hk 16, Hv 32, Dk = Dv = 128, bf16 activations and state, L2-normalised q / k, in place, as the
// model's decode step runs it.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I plugins -o decode16_tiles benchmarks/investigations/cuda/decode16_tiles.cu \
//        kernels/gated_delta_rule/cuda/gatedDeltaRuleKernels.cu
//   ./decode16_tiles [--no-rotate] [--only launcher,bv64,copytile]
//
// Each configuration is captured in a CUDA graph of `steps` launches and the replay timed (median of
// 30 replays, cudaEvent); the launches rotate over enough state sets that the states read in one
// replay exceed 256 MB (H200 L2: 50 MB), as a model's layers do, unless --no-rotate. Before timing,
// every decode variant's output and new state are checked against a float64 host reference at B = 3
// (fresh random inputs, outputs poisoned with NaN first). Prints one markdown table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "gated_delta_rule/cuda/gatedDeltaRuleRecurrent.cuh"

using bf16 = __nv_bfloat16;
using gdn::GatedDeltaRuleParams;

#define CK(x)                                                                                                  \
    do                                                                                                         \
    {                                                                                                          \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess)                                                                                 \
        {                                                                                                      \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
            std::exit(2);                                                                                      \
        }                                                                                                      \
    } while (0)

constexpr int kHK = 16, kHV = 32, kD = 128;

template <int kBV, int kNW = 4, int kMINB = 1>
void launchTile(GatedDeltaRuleParams const& p, cudaStream_t s)
{
    using Tile = gdn::kernels::DecodeTile16<kD, kBV, kNW, kMINB>;
    auto kernel = gdn::kernels::gatedDeltaRuleDecode16Kernel<bf16, bf16, kD, Tile>;
    static bool once = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    (void) once;
    kernel<<<dim3((p.valueDim + kBV - 1) / kBV, p.numValueHeads, p.batch), Tile::kTHREADS, 0, s>>>(p);
}

void launchPublic(GatedDeltaRuleParams const& p, cudaStream_t s)
{
    CK(gdn::launchGatedDeltaRule(p, nullptr, s));
}

// Floors for the bytes a step moves (no arithmetic; not checked against the reference): the state
// tile staged through shared memory and written back in place with the decode kernel's grid and
// accesses (2 warps x 64 columns, cp.async rows in, 16-byte stores out), and a plain device copy of
// the same bytes (cudaMemcpyAsync into a scratch buffer).
__global__ void __launch_bounds__(64) copyTileKernel(GatedDeltaRuleParams const p)
{
    constexpr int kBV = 64, kLPR = 8, kGROUPS = 64 / kLPR;
    __shared__ alignas(16) bf16 sS[kD][kBV];
    int const c0 = (threadIdx.x % kLPR) * 8, kg = threadIdx.x / kLPR;
    size_t const base = (size_t(blockIdx.z) * p.numValueHeads + blockIdx.y) * kD * kD + blockIdx.x * kBV + c0;
    bf16* state = static_cast<bf16*>(p.finalState);
    for (int r = kg; r < kD; r += kGROUPS)
        gdn::kernels::cpAsync16(&sS[r][c0], state + base + size_t(r) * kD, 16);
    gdn::kernels::cpAsyncCommit();
    gdn::kernels::cpAsyncWaitAll();
    __syncthreads();
    for (int r = kg; r < kD; r += kGROUPS)
        *reinterpret_cast<uint4*>(state + base + size_t(r) * kD) = *reinterpret_cast<uint4 const*>(&sS[r][c0]);
}

void launchCopyTile(GatedDeltaRuleParams const& p, cudaStream_t s)
{
    copyTileKernel<<<dim3(kD / 64, p.numValueHeads, p.batch), 64, 0, s>>>(p);
}

void launchMemcpy(GatedDeltaRuleParams const& p, cudaStream_t s)
{
    static void* scratch = nullptr;
    size_t const bytes = size_t(p.batch) * p.numValueHeads * kD * kD * sizeof(bf16);
    if (scratch == nullptr)
        CK(cudaMalloc(&scratch, size_t(512) * kHV * kD * kD * sizeof(bf16)));
    CK(cudaMemcpyAsync(scratch, p.initialState, bytes, cudaMemcpyDeviceToDevice, s));
}

struct Variant
{
    char const* name;
    void (*launch)(GatedDeltaRuleParams const&, cudaStream_t);
};

Variant const kVariants[] = {
    {"launcher", launchPublic}, // what the op and the plugin call
    {"bv64", launchTile<64>},
    {"bv32", launchTile<32>},
    {"bv16", launchTile<16>},
    {"bv64w2", launchTile<64, 2>},
    {"bv32w2", launchTile<32, 2>},
    // registers capped for m blocks a multiprocessor (__launch_bounds__)
    {"bv64w4m8", launchTile<64, 4, 8>},
    {"bv64w4m10", launchTile<64, 4, 10>},
    {"bv64w2m11", launchTile<64, 2, 11>},
    {"bv64w8m5", launchTile<64, 8, 5>},
    {"bv32w4m12", launchTile<32, 4, 12>},
    {"copytile", launchCopyTile}, // floors: not decode steps, not checked
    {"memcpy", launchMemcpy},
};

static bool isFloor(Variant const& var)
{
    return var.launch == launchCopyTile || var.launch == launchMemcpy;
}

static float bf(bf16 x) { return __bfloat162float(x); }

struct Token
{
    std::vector<bf16> q, k, v, beta;
    std::vector<float> g;
};

static Token randomToken(int B, std::mt19937& rng)
{
    std::normal_distribution<float> n01;
    Token t;
    for (int i = 0; i < B * kHK * kD; ++i)
    {
        t.q.push_back(__float2bfloat16(n01(rng)));
        // correlated SiLU keys, as a model's: a shared offset per channel
        float const x = n01(rng) + 2.F * std::sin(0.37F * (i % kD));
        t.k.push_back(__float2bfloat16(x / (1.F + std::exp(-x))));
    }
    for (int i = 0; i < B * kHV * kD; ++i)
        t.v.push_back(__float2bfloat16(n01(rng)));
    for (int i = 0; i < B * kHV; ++i)
    {
        t.g.push_back(-0.1F * std::log1p(std::exp(n01(rng))));
        t.beta.push_back(__float2bfloat16(1.F / (1.F + std::exp(-n01(rng)))));
    }
    return t;
}

// float64 reference of one decode step (l2-normalised q, k; scale D^-0.5); state stays unrounded.
static void reference(int B, Token const& t, std::vector<bf16> const& s0, std::vector<double>& o, std::vector<double>& s)
{
    double const scale = 1.0 / std::sqrt(double(kD));
    o.assign(size_t(B) * kHV * kD, 0.0);
    s.assign(s0.size(), 0.0);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < kHV; ++h)
        {
            int const kh = h / (kHV / kHK);
            double q[kD], k[kD], nq = 0, nk = 0;
            for (int d = 0; d < kD; ++d)
            {
                q[d] = bf(t.q[(b * kHK + kh) * kD + d]);
                k[d] = bf(t.k[(b * kHK + kh) * kD + d]);
                nq += q[d] * q[d];
                nk += k[d] * k[d];
            }
            for (int d = 0; d < kD; ++d)
            {
                q[d] *= scale / std::sqrt(nq + 1e-6);
                k[d] /= std::sqrt(nk + 1e-6);
            }
            double const a = std::exp(double(t.g[b * kHV + h]));
            double const beta = bf(t.beta[b * kHV + h]);
            size_t const base = (size_t(b) * kHV + h) * kD * kD;
            for (int c = 0; c < kD; ++c)
            {
                double sk = 0, sq = 0;
                for (int r = 0; r < kD; ++r)
                {
                    double const x = a * bf(s0[base + size_t(r) * kD + c]);
                    sk += x * k[r];
                    sq += x * q[r];
                }
                double qk = 0;
                for (int r = 0; r < kD; ++r)
                    qk += k[r] * q[r];
                double const u = beta * (bf(t.v[(b * kHV + h) * kD + c]) - sk);
                o[(size_t(b) * kHV + h) * kD + c] = sq + u * qk;
                for (int r = 0; r < kD; ++r)
                    s[base + size_t(r) * kD + c] = a * bf(s0[base + size_t(r) * kD + c]) + k[r] * u;
            }
        }
}

template <typename A, typename B>
static double relRms(std::vector<A> const& x, std::vector<B> const& ref, bool& finite)
{
    double num = 0, den = 0;
    finite = true;
    for (size_t i = 0; i < ref.size(); ++i)
    {
        double const xi = double(bf(x[i]));
        finite = finite && std::isfinite(xi);
        num += (xi - ref[i]) * (xi - ref[i]);
        den += double(ref[i]) * ref[i];
    }
    return std::sqrt(num / den);
}

template <typename T>
static T* upload(std::vector<T> const& h)
{
    T* d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static GatedDeltaRuleParams params(int B, bf16 const* q, bf16 const* k, bf16 const* v, float const* g,
    bf16 const* beta, bf16* state, bf16* o)
{
    GatedDeltaRuleParams p;
    p.dtype = gdn::DataType::kBFLOAT16;
    p.stateType = gdn::DataType::kBFLOAT16;
    p.batch = B;
    p.seqLen = 1;
    p.numKeyHeads = kHK;
    p.numValueHeads = kHV;
    p.keyDim = kD;
    p.valueDim = kD;
    p.scale = 1.F / std::sqrt(float(kD));
    p.useQkL2norm = true;
    p.q = q;
    p.k = k;
    p.v = v;
    p.g = g;
    p.beta = beta;
    p.initialState = state;
    p.finalState = state;
    p.o = o;
    return p;
}

static bool check(Variant const& var, std::mt19937& rng)
{
    int const B = 3;
    Token t = randomToken(B, rng);
    std::normal_distribution<float> n01;
    std::vector<bf16> s0(size_t(B) * kHV * kD * kD);
    for (auto& x : s0)
        x = __float2bfloat16(0.3F * n01(rng));
    std::vector<double> oRef, sRef;
    reference(B, t, s0, oRef, sRef);
    bf16 *q = upload(t.q), *k = upload(t.k), *v = upload(t.v), *beta = upload(t.beta), *state = upload(s0);
    float* g = upload(t.g);
    std::vector<bf16> poison(oRef.size(), __float2bfloat16(NAN));
    bf16* o = upload(poison);
    var.launch(params(B, q, k, v, g, beta, state, o), nullptr);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<bf16> oh(oRef.size()), sh(sRef.size());
    CK(cudaMemcpy(oh.data(), o, oh.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sh.data(), state, sh.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    bool fo = false, fs = false;
    double const eo = relRms(oh, oRef, fo), es = relRms(sh, sRef, fs);
    // bf16 storage of o and of the state: one rounding each (2^-9 relative), far under 1e-2.
    bool const ok = fo && fs && eo < 1e-2 && es < 1e-2;
    std::printf("check %-8s o %.2e state %.2e %s\n", var.name, eo, es, ok ? "ok" : "FAIL");
    for (void* ptr : {(void*) q, (void*) k, (void*) v, (void*) beta, (void*) state, (void*) g, (void*) o})
        CK(cudaFree(ptr));
    return ok;
}

static float copyTbps()
{
    size_t const bytes = size_t(1) << 31;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 25; ++i)
    {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaFree(a));
    CK(cudaFree(b));
    return float(2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e12);
}

int main(int argc, char** argv)
{
    bool rotate = true;
    std::vector<Variant> vars; // --only a,b,c: those variants, in that order; default: all
    for (int i = 1; i < argc; ++i)
    {
        if (std::strcmp(argv[i], "--no-rotate") == 0)
            rotate = false;
        else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            for (char* name = std::strtok(argv[++i], ","); name != nullptr; name = std::strtok(nullptr, ","))
                for (auto const& var : kVariants)
                    if (std::strcmp(var.name, name) == 0)
                        vars.push_back(var);
    }
    if (vars.empty())
        vars.assign(std::begin(kVariants), std::end(kVariants));
    std::mt19937 rng(1234);
    bool ok = true;
    for (auto const& var : vars)
        ok = (isFloor(var) || check(var, rng)) && ok;
    if (!ok)
    {
        std::printf("correctness check failed\n");
        return 1;
    }
    float const bw = copyTbps();
    int const batches[] = {1, 2, 4, 8, 16, 32, 64, 96, 128, 256, 512};
    int const nVar = int(vars.size());
    std::vector<std::vector<float>> us(sizeof(batches) / sizeof(int), std::vector<float>(nVar));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (size_t bi = 0; bi < sizeof(batches) / sizeof(int); ++bi)
    {
        int const B = batches[bi];
        size_t const stateElems = size_t(B) * kHV * kD * kD;
        int const sets = rotate ? int(std::min<size_t>(256, std::max<size_t>(1, (size_t(256) << 20) / (stateElems * 2) + 1))) : 1;
        int const steps = std::max(20, sets);
        Token t = randomToken(B, rng);
        bf16 *q = upload(t.q), *k = upload(t.k), *v = upload(t.v), *beta = upload(t.beta);
        float* g = upload(t.g);
        std::vector<bf16> s0(stateElems);
        std::normal_distribution<float> n01;
        for (auto& x : s0)
            x = __float2bfloat16(0.1F * n01(rng));
        std::vector<bf16*> states;
        for (int i = 0; i < sets; ++i)
            states.push_back(upload(s0));
        bf16* o = nullptr;
        CK(cudaMalloc(&o, t.v.size() * sizeof(bf16)));
        for (int vi = 0; vi < nVar; ++vi)
        {
            for (int w = 0; w < 3; ++w)
                vars[vi].launch(params(B, q, k, v, g, beta, states[0], o), stream);
            CK(cudaStreamSynchronize(stream));
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < steps; ++i)
                vars[vi].launch(params(B, q, k, v, g, beta, states[i % sets], o), stream);
            CK(cudaStreamEndCapture(stream, &graph));
            CK(cudaGraphInstantiate(&exec, graph, 0));
            std::vector<float> ms;
            for (int r = 0; r < 33; ++r)
            {
                CK(cudaEventRecord(e0, stream));
                CK(cudaGraphLaunch(exec, stream));
                CK(cudaEventRecord(e1, stream));
                CK(cudaEventSynchronize(e1));
                float tms = 0;
                CK(cudaEventElapsedTime(&tms, e0, e1));
                if (r >= 3)
                    ms.push_back(tms);
            }
            CK(cudaGetLastError());
            std::sort(ms.begin(), ms.end());
            us[bi][vi] = ms[ms.size() / 2] * 1e3F / steps;
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
        }
        for (auto* s : states)
            CK(cudaFree(s));
        for (void* ptr : {(void*) q, (void*) k, (void*) v, (void*) beta, (void*) g, (void*) o})
            CK(cudaFree(ptr));
    }
    std::printf("\n%s, copy bandwidth %.2f TB/s; us per decode step (%% of copy bandwidth), states %s\n\n",
        "decode16 tiles", bw, rotate ? "rotated past L2" : "not rotated");
    std::printf("| B |");
    for (auto const& var : vars)
        std::printf(" %s |", var.name);
    std::printf("\n|---|");
    for (int vi = 0; vi < nVar; ++vi)
        std::printf("---|");
    std::printf("\n");
    for (size_t bi = 0; bi < sizeof(batches) / sizeof(int); ++bi)
    {
        int const B = batches[bi];
        double const moved = 2.0 * B * kHV * kD * kD * 2 + 2.0 * (2 * B * kHK * kD + 2 * B * kHV * kD) + B * kHV * 6;
        std::printf("| %d |", B);
        for (int vi = 0; vi < nVar; ++vi)
            std::printf(" %.2f (%.0f%%) |", us[bi][vi], 100.0 * moved / (us[bi][vi] * 1e-6) / 1e12 / bw);
        std::printf("\n");
    }
    return 0;
}
