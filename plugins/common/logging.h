/*
 * Logging and error reporting for the gdn plugins.
 *
 * Messages go to the logger TensorRT hands us through setLoggerFinder() (see gdnPlugins.cpp);
 * without one (a host program that never called it), errors and warnings go to stderr so that a
 * failure is never silent.
 */
#pragma once

#include <NvInferRuntime.h>

#include <exception>
#include <string>

namespace gdn
{
namespace plugin
{

using Severity = nvinfer1::ILogger::Severity;

//! Install the finder TensorRT passes to setLoggerFinder (nullptr: back to stderr).
void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

//! Log one message, prefixed "[gdn plugins] ".
void log(Severity severity, std::string const& message) noexcept;

inline void logError(std::string const& message) noexcept
{
    log(Severity::kERROR, message);
}

inline void logVerbose(std::string const& message) noexcept
{
    log(Severity::kVERBOSE, message);
}

//! Report an exception caught at a noexcept boundary: "<where>: <what>".
void reportException(char const* where, std::exception const& e) noexcept;

//! Report an unknown exception caught at a noexcept boundary.
void reportUnknownException(char const* where) noexcept;

} // namespace plugin
} // namespace gdn
