import pytest


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")
