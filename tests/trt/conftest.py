import pytest

from gdn_export.errors import GdnExportError
from tests.plugins.cmake_build import plugin_build  # noqa: F401  (session fixture)


@pytest.fixture(scope="session")
def trt_flavour():
    """The TensorRT module gdn_export.trt will use (skips when none imports)."""
    from gdn_export.trt import loader

    try:
        return loader.flavour()
    except GdnExportError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def plugins_lib(plugin_build, trt_flavour):
    return plugin_build.library


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")
