import pytest


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


def pytest_collection_modifyitems(config, items):
    """test_export.py's tests on an export other than qwen3_5's in-place one belong to the slow tier:
    each such export takes most of a minute on a 2-core CPU."""
    for item in items:
        if item.module.__name__.endswith("tests.onnx.test_export"):
            param = getattr(getattr(item, "callspec", None), "params", {}).get("exported")
            if param is not None and tuple(param) != ("qwen3_5", "inplace"):
                item.add_marker(pytest.mark.slow)
