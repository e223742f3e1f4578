/*
 * Checks and the exception boundary of the gdn plugins.
 *
 * Plugin code below the TensorRT interface throws PluginError with a message that names the plugin,
 * the tensor or field and the actual values; every noexcept TensorRT entry point wraps its body in
 * GDN_PLUGIN_TRY / GDN_PLUGIN_CATCH(where), which logs the message and falls through to the
 * method's failure value (nullptr, -1, false).
 */
#pragma once

#include "logging.h"

#include <sstream>
#include <stdexcept>
#include <string>

namespace gdn
{
namespace plugin
{

class PluginError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

} // namespace plugin
} // namespace gdn

//! Throw PluginError("<streamed message>") unless `cond` holds. `msg` may use operator<<.
#define GDN_PLUGIN_CHECK(cond, msg)                                                                                    \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(cond))                                                                                                   \
        {                                                                                                              \
            std::ostringstream gdnCheckStream_;                                                                        \
            gdnCheckStream_ << msg;                                                                                    \
            throw ::gdn::plugin::PluginError(gdnCheckStream_.str());                                                   \
        }                                                                                                              \
    } while (0)

//! Throw PluginError("<streamed message>") unconditionally.
#define GDN_PLUGIN_FAIL(msg)                                                                                           \
    do                                                                                                                 \
    {                                                                                                                  \
        std::ostringstream gdnFailStream_;                                                                             \
        gdnFailStream_ << msg;                                                                                         \
        throw ::gdn::plugin::PluginError(gdnFailStream_.str());                                                        \
    } while (0)

#define GDN_PLUGIN_TRY try

#define GDN_PLUGIN_CATCH(where)                                                                                        \
    catch (std::exception const& e)                                                                                    \
    {                                                                                                                  \
        ::gdn::plugin::reportException(where, e);                                                                      \
    }                                                                                                                  \
    catch (...)                                                                                                        \
    {                                                                                                                  \
        ::gdn::plugin::reportUnknownException(where);                                                                  \
    }
