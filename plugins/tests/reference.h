/*
 * CPU references (double precision) of the two ops, host dtype conversion and the closeness measure
 * used by pluginHostTest. Same formulas as naive.py beside each op in gdn_export/ops.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gdn
{
namespace test
{

enum class DType
{
    kF32,
    kF16,
    kBF16
};

char const* dtypeName(DType t);
size_t dtypeSize(DType t);
//! Round `x` to dtype `t` and write its bytes to `dst` (element i).
void storeAs(DType t, std::vector<float> const& x, std::vector<uint8_t>& dst);
//! Read n elements of dtype `t` as float.
std::vector<float> loadAs(DType t, void const* src, size_t n);
//! The values `x` would have after a round trip through dtype `t`.
std::vector<float> roundTo(DType t, std::vector<float> const& x);

//! sqrt(sum (a - b)^2 / sum b^2); +inf if `a` holds a NaN or an Inf.
double relativeRms(std::vector<float> const& a, std::vector<double> const& b);

struct GdrShape
{
    int32_t B, T, Hk, Hv, Dk, Dv;
};

//! o [B, T, Hv, Dv] and state [B, Hv, Dk, Dv] from q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv],
//! s0 [B, Hv, Dk, Dv]. Work is split over `threads` threads by (b, h).
void gatedDeltaRuleReference(GdrShape const& s, std::vector<float> const& q, std::vector<float> const& k,
    std::vector<float> const& v, std::vector<float> const& g, std::vector<float> const& beta,
    std::vector<float> const& s0, float scale, bool l2norm, std::vector<double>& o, std::vector<double>& state,
    int32_t threads);

//! y [B, T, C] and new state [B, C, K-1] from x [B, T, C], w [C, K], bias [C], s0 [B, C, K-1] and the
//! row lengths lens [B] (right padding; empty = all T): the state ends after x[b, lens[b] - 1]; y is the
//! plain causal conv everywhere (padded positions included).
void causalConv1dReference(int32_t B, int32_t T, int32_t C, int32_t K, std::vector<float> const& x,
    std::vector<float> const& w, std::vector<float> const& bias, std::vector<float> const& s0,
    std::vector<int32_t> const& lens, bool silu, std::vector<double>& y, std::vector<double>& state);

} // namespace test
} // namespace gdn
