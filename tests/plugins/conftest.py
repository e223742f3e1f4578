from tests.plugins.cmake_build import plugin_build  # noqa: F401  (session fixture)
