"""GPU only: the CUDA MoE entry's own limits (its numerics: tests/ops/moe)."""

from __future__ import annotations

import pytest

from gdn_export.ops.moe import cuda as cuda_backend
from gdn_export.errors import GdnExportError
from tests.conftest import GPU_ONLY
from tests.ops.moe.inputs import moe_inputs

pytestmark = GPU_ONLY


def test_cuda_moe_too_many_experts_is_one_line():
    with pytest.raises(GdnExportError, match="E <= 1024"):
        cuda_backend.moe(*(t.cuda() for t in moe_inputs(2, 16, 1025, 8)), 2, True)
