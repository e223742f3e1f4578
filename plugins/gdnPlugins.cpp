/*
 * Entry points of libgdn_plugins.so for IPluginRegistry::loadLibrary() (Python:
 * trt.get_plugin_registry().load_library(path); trtexec: --staticPlugins / --dynamicPlugins).
 *
 * TensorRT dlopens the library, calls setLoggerFinder() so that plugin messages reach the
 * application's logger, then getCreators() and registers every creator under its own namespace
 * ("gdn"). Nothing registers itself at load time: loading the library with ctypes alone does nothing.
 */
#include "causalConv1dPlugin/causalConv1dPlugin.h"
#include "common/logging.h"
#include "gatedDeltaRulePlugin/gatedDeltaRulePlugin.h"
#include "moePlugin/moePlugin.h"

#include <NvInferRuntime.h>

#define GDN_PLUGINS_API extern "C" __attribute__((visibility("default")))

namespace
{
// Creators live as long as the library: TensorRT keeps pointers to them after getCreators().
gdn::plugin::GatedDeltaRulePluginCreator gGatedDeltaRuleCreator;
gdn::plugin::GatedDeltaRuleStepsPluginCreator gGatedDeltaRuleStepsCreator;
gdn::plugin::CausalConv1dPluginCreator gCausalConv1dCreator;
gdn::plugin::MoEPluginCreator gMoECreator;
nvinfer1::IPluginCreatorInterface* const gCreators[]
    = {&gGatedDeltaRuleCreator, &gGatedDeltaRuleStepsCreator, &gCausalConv1dCreator, &gMoECreator};
} // namespace

GDN_PLUGINS_API void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    gdn::plugin::setLoggerFinder(finder);
}

GDN_PLUGINS_API nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) noexcept
{
    nbCreators = static_cast<int32_t>(sizeof(gCreators) / sizeof(gCreators[0]));
    return gCreators;
}
