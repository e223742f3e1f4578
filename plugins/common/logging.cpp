#include "logging.h"

#include <atomic>
#include <cstdio>

namespace gdn
{
namespace plugin
{
namespace
{
// Set once by TensorRT when it loads the library; read from any thread.
std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder{nullptr};

char const* severityName(Severity severity) noexcept
{
    switch (severity)
    {
    case Severity::kINTERNAL_ERROR: return "INTERNAL_ERROR";
    case Severity::kERROR: return "ERROR";
    case Severity::kWARNING: return "WARNING";
    case Severity::kINFO: return "INFO";
    case Severity::kVERBOSE: return "VERBOSE";
    }
    return "?";
}
} // namespace

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    gLoggerFinder.store(finder);
}

void log(Severity severity, std::string const& message) noexcept
{
    try
    {
        std::string const text = "[gdn plugins] " + message;
        nvinfer1::ILoggerFinder* finder = gLoggerFinder.load();
        // findLogger() must run on the thread of the plugin call, so look it up every time.
        nvinfer1::ILogger* logger = finder != nullptr ? finder->findLogger() : nullptr;
        if (logger != nullptr)
        {
            logger->log(severity, text.c_str());
        }
        else if (severity <= Severity::kWARNING)
        {
            std::fprintf(stderr, "%s: %s\n", severityName(severity), text.c_str());
        }
    }
    catch (...)
    {
        // Logging must never throw out of a noexcept plugin method.
        std::fprintf(stderr, "[gdn plugins] (failed to log a message)\n");
    }
}

void reportException(char const* where, std::exception const& e) noexcept
{
    try
    {
        log(Severity::kERROR, std::string(where) + ": " + e.what());
    }
    catch (...)
    {
        std::fprintf(stderr, "[gdn plugins] %s: (exception while reporting an exception)\n", where);
    }
}

void reportUnknownException(char const* where) noexcept
{
    log(Severity::kERROR, std::string(where) + ": unknown exception");
}

} // namespace plugin
} // namespace gdn
