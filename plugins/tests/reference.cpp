#include "reference.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

namespace gdn
{
namespace test
{

char const* dtypeName(DType t)
{
    switch (t)
    {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    }
    return "?";
}

size_t dtypeSize(DType t)
{
    return t == DType::kF32 ? 4 : 2;
}

void storeAs(DType t, std::vector<float> const& x, std::vector<uint8_t>& dst)
{
    dst.resize(x.size() * dtypeSize(t));
    for (size_t i = 0; i < x.size(); ++i)
    {
        if (t == DType::kF32)
        {
            std::memcpy(dst.data() + 4 * i, &x[i], 4);
        }
        else if (t == DType::kF16)
        {
            __half const h = __float2half_rn(x[i]);
            std::memcpy(dst.data() + 2 * i, &h, 2);
        }
        else
        {
            __nv_bfloat16 const h = __float2bfloat16_rn(x[i]);
            std::memcpy(dst.data() + 2 * i, &h, 2);
        }
    }
}

std::vector<float> loadAs(DType t, void const* src, size_t n)
{
    std::vector<float> out(n);
    auto const* bytes = static_cast<uint8_t const*>(src);
    for (size_t i = 0; i < n; ++i)
    {
        if (t == DType::kF32)
        {
            std::memcpy(&out[i], bytes + 4 * i, 4);
        }
        else if (t == DType::kF16)
        {
            __half h;
            std::memcpy(&h, bytes + 2 * i, 2);
            out[i] = __half2float(h);
        }
        else
        {
            __nv_bfloat16 h;
            std::memcpy(&h, bytes + 2 * i, 2);
            out[i] = __bfloat162float(h);
        }
    }
    return out;
}

std::vector<float> roundTo(DType t, std::vector<float> const& x)
{
    std::vector<uint8_t> bytes;
    storeAs(t, x, bytes);
    return loadAs(t, bytes.data(), x.size());
}

double relativeRms(std::vector<float> const& a, std::vector<double> const& b)
{
    if (a.size() != b.size())
    {
        return std::numeric_limits<double>::infinity();
    }
    double num = 0.0;
    double den = 0.0;
    for (size_t i = 0; i < a.size(); ++i)
    {
        if (!std::isfinite(a[i]))
        {
            return std::numeric_limits<double>::infinity();
        }
        double const d = static_cast<double>(a[i]) - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

void gatedDeltaRuleReference(GdrShape const& s, std::vector<float> const& q, std::vector<float> const& k,
    std::vector<float> const& v, std::vector<float> const& g, std::vector<float> const& beta,
    std::vector<float> const& s0, float scale, bool l2norm, std::vector<double>& o, std::vector<double>& state,
    int32_t threads)
{
    int32_t const group = s.Hv / s.Hk;
    size_t const stateSize = static_cast<size_t>(s.Dk) * s.Dv;
    o.assign(static_cast<size_t>(s.B) * s.T * s.Hv * s.Dv, 0.0);
    state.assign(static_cast<size_t>(s.B) * s.Hv * stateSize, 0.0);
    std::atomic<int32_t> next{0};
    auto worker = [&]() {
        std::vector<double> qt(s.Dk), kt(s.Dk), u(s.Dv);
        for (int32_t job = next++; job < s.B * s.Hv; job = next++)
        {
            int32_t const b = job / s.Hv;
            int32_t const h = job % s.Hv;
            int32_t const hk = h / group;
            double* S = state.data() + static_cast<size_t>(job) * stateSize; // [Dk, Dv]
            for (size_t i = 0; i < stateSize; ++i)
            {
                S[i] = s0[static_cast<size_t>(job) * stateSize + i];
            }
            for (int32_t t = 0; t < s.T; ++t)
            {
                size_t const qkBase = ((static_cast<size_t>(b) * s.T + t) * s.Hk + hk) * s.Dk;
                size_t const vBase = ((static_cast<size_t>(b) * s.T + t) * s.Hv + h) * s.Dv;
                size_t const gIdx = (static_cast<size_t>(b) * s.T + t) * s.Hv + h;
                double qn = 0.0, kn = 0.0;
                for (int32_t i = 0; i < s.Dk; ++i)
                {
                    qt[i] = q[qkBase + i];
                    kt[i] = k[qkBase + i];
                    qn += qt[i] * qt[i];
                    kn += kt[i] * kt[i];
                }
                // l2norm convention of the reference models: x / sqrt(sum x^2 + 1e-6).
                double const qs = (l2norm ? 1.0 / std::sqrt(qn + 1e-6) : 1.0) * scale;
                double const ks = l2norm ? 1.0 / std::sqrt(kn + 1e-6) : 1.0;
                for (int32_t i = 0; i < s.Dk; ++i)
                {
                    qt[i] *= qs;
                    kt[i] *= ks;
                }
                double const a = std::exp(static_cast<double>(g[gIdx]));
                double const bt = beta[gIdx];
                for (int32_t j = 0; j < s.Dv; ++j)
                {
                    u[j] = 0.0;
                }
                for (int32_t i = 0; i < s.Dk; ++i)
                {
                    double* row = S + static_cast<size_t>(i) * s.Dv;
                    for (int32_t j = 0; j < s.Dv; ++j)
                    {
                        row[j] *= a;
                        u[j] += row[j] * kt[i];
                    }
                }
                for (int32_t j = 0; j < s.Dv; ++j)
                {
                    u[j] = bt * (v[vBase + j] - u[j]);
                }
                double* out = o.data() + vBase;
                for (int32_t i = 0; i < s.Dk; ++i)
                {
                    double* row = S + static_cast<size_t>(i) * s.Dv;
                    for (int32_t j = 0; j < s.Dv; ++j)
                    {
                        row[j] += kt[i] * u[j];
                        out[j] += row[j] * qt[i];
                    }
                }
            }
        }
    };
    std::vector<std::thread> pool;
    for (int32_t i = 1; i < threads; ++i)
    {
        pool.emplace_back(worker);
    }
    worker();
    for (auto& th : pool)
    {
        th.join();
    }
}

void causalConv1dReference(int32_t B, int32_t T, int32_t C, int32_t K, std::vector<float> const& x,
    std::vector<float> const& w, std::vector<float> const& bias, std::vector<float> const& s0,
    std::vector<int32_t> const& lens, bool silu, std::vector<double>& y, std::vector<double>& state)
{
    int32_t const W = K - 1;
    y.assign(static_cast<size_t>(B) * T * C, 0.0);
    state.assign(static_cast<size_t>(B) * C * W, 0.0);
    std::vector<double> xs(static_cast<size_t>(W + T));
    for (int32_t b = 0; b < B; ++b)
    {
        for (int32_t c = 0; c < C; ++c)
        {
            // xs = [state | x] along time for this channel.
            for (int32_t j = 0; j < W; ++j)
            {
                xs[j] = s0[(static_cast<size_t>(b) * C + c) * W + j];
            }
            for (int32_t t = 0; t < T; ++t)
            {
                xs[W + t] = x[(static_cast<size_t>(b) * T + t) * C + c];
            }
            for (int32_t t = 0; t < T; ++t)
            {
                double acc = bias[c];
                for (int32_t j = 0; j < K; ++j)
                {
                    acc += static_cast<double>(w[static_cast<size_t>(c) * K + j]) * xs[t + j];
                }
                y[(static_cast<size_t>(b) * T + t) * C + c] = silu ? acc / (1.0 + std::exp(-acc)) : acc;
            }
            int32_t const len = lens.empty() ? T : lens[b];
            for (int32_t j = 0; j < W; ++j)
            {
                state[(static_cast<size_t>(b) * C + c) * W + j] = xs[len + j];
            }
        }
    }
}

} // namespace test
} // namespace gdn
