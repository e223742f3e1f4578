/*
 * Stand-ins for what TensorRT hands a plugin at run time, so that pluginHostTest can drive the
 * plugins without linking TensorRT:
 *   CapturingLoggerFinder   ILoggerFinder + ILogger that keeps every message (checked by the error tests)
 *   FakeExprBuilder         IExprBuilder whose IDimensionExpr are constants or opaque symbols
 *   FakeResourceContext     IPluginResourceContext with no allocator and no error recorder
 * The expression classes reach into TensorRT's apiv:: implementation interfaces, which the headers
 * declare; that is fine for a test and never done by the plugins themselves.
 */
#pragma once

#include <NvInferRuntime.h>

#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace gdn
{
namespace test
{

class CapturingLogger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, char const* msg) noexcept override
    {
        mMessages.emplace_back(msg);
        if (mEcho && severity <= Severity::kWARNING)
        {
            std::fprintf(stderr, "  [logged] %s\n", msg);
        }
    }
    //! Forget the messages so far.
    void clear() { mMessages.clear(); }
    //! True if any message since clear() contains `needle`.
    bool contains(std::string const& needle) const
    {
        for (auto const& m : mMessages)
        {
            if (m.find(needle) != std::string::npos)
            {
                return true;
            }
        }
        return false;
    }
    std::string last() const { return mMessages.empty() ? std::string() : mMessages.back(); }
    bool mEcho{true};

private:
    std::vector<std::string> mMessages;
};

class CapturingLoggerFinder : public nvinfer1::ILoggerFinder
{
public:
    nvinfer1::ILogger* findLogger() override { return &mLogger; }
    CapturingLogger mLogger;
};

class FakeDimImpl : public nvinfer1::apiv::VDimensionExpr
{
public:
    explicit FakeDimImpl(int64_t value, bool constant)
        : mValue(value)
        , mConstant(constant)
    {
    }
    bool isConstant() const override { return mConstant; }
    int64_t getConstantValue() const override
    {
        return mConstant ? mValue : std::numeric_limits<int64_t>::min();
    }
    bool isSizeTensor() const override { return false; }
    int64_t mValue;
    bool mConstant;
};

class FakeDimExpr : public nvinfer1::IDimensionExpr
{
public:
    FakeDimExpr(int64_t value, bool constant)
        : mOwned(value, constant)
    {
        mImpl = &mOwned;
    }
    ~FakeDimExpr() noexcept override = default;
    //! The value a symbolic dim stands for (for checks), whether or not it is constant.
    int64_t value() const { return mOwned.mValue; }

private:
    FakeDimImpl mOwned;
};

class FakeExprBuilderImpl : public nvinfer1::apiv::VExprBuilder
{
public:
    nvinfer1::IDimensionExpr const* constant(int64_t value) override { return make(value, true); }
    nvinfer1::IDimensionExpr const* operation(nvinfer1::DimensionOperation op, nvinfer1::IDimensionExpr const& a,
        nvinfer1::IDimensionExpr const& b) override
    {
        auto const& x = static_cast<FakeDimExpr const&>(a);
        auto const& y = static_cast<FakeDimExpr const&>(b);
        int64_t v = 0;
        switch (op)
        {
        case nvinfer1::DimensionOperation::kSUM: v = x.value() + y.value(); break;
        case nvinfer1::DimensionOperation::kPROD: v = x.value() * y.value(); break;
        case nvinfer1::DimensionOperation::kMAX: v = std::max(x.value(), y.value()); break;
        case nvinfer1::DimensionOperation::kMIN: v = std::min(x.value(), y.value()); break;
        case nvinfer1::DimensionOperation::kSUB: v = x.value() - y.value(); break;
        case nvinfer1::DimensionOperation::kEQUAL: v = x.value() == y.value(); break;
        case nvinfer1::DimensionOperation::kLESS: v = x.value() < y.value(); break;
        case nvinfer1::DimensionOperation::kFLOOR_DIV: v = x.value() / y.value(); break;
        case nvinfer1::DimensionOperation::kCEIL_DIV: v = (x.value() + y.value() - 1) / y.value(); break;
        }
        return make(v, a.isConstant() && b.isConstant());
    }
    nvinfer1::IDimensionExpr const* declareSizeTensor(
        int32_t, nvinfer1::IDimensionExpr const&, nvinfer1::IDimensionExpr const&) override
    {
        return nullptr;
    }
    //! A new expression owned by this builder.
    FakeDimExpr const* make(int64_t value, bool constant)
    {
        mExprs.emplace_back(std::make_unique<FakeDimExpr>(value, constant));
        return mExprs.back().get();
    }

private:
    std::deque<std::unique_ptr<FakeDimExpr>> mExprs;
};

class FakeExprBuilder : public nvinfer1::IExprBuilder
{
public:
    FakeExprBuilder() { mImpl = &mOwned; }
    ~FakeExprBuilder() noexcept override = default;
    //! An opaque (non-constant) dim standing for `value`, like a dynamic batch or sequence length.
    FakeDimExpr const* symbol(int64_t value) { return mOwned.make(value, false); }
    FakeDimExpr const* fixed(int64_t value) { return mOwned.make(value, true); }

private:
    FakeExprBuilderImpl mOwned;
};

class FakeResourceContext : public nvinfer1::IPluginResourceContext
{
public:
    nvinfer1::IGpuAllocator* getGpuAllocator() const noexcept override { return nullptr; }
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
};

} // namespace test
} // namespace gdn
