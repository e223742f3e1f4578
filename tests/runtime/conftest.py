import pytest


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture
def scalar_cpp_kernels():
    """Inductor's CPU kernels without SIMD variants (config.cpp.simdlen = 1): the tiny model's compile
    takes ~20% less time (37 against 45 s on a 2-core CPU). What the compile tests check (one graph,
    custom ops' fakes, caches written in place, eager's tokens) does not depend on vectorization."""
    import torch._inductor.config

    with torch._inductor.config.patch({"cpp.simdlen": 1}):
        yield
