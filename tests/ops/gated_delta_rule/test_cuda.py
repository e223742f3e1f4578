"""The CUDA gated delta rule extension's own input checks, on a GPU. Its numerics (every path, head
size, pack, state dtype and entry) are held to the op's contract in tests/ops/gated_delta_rule."""

import torch

from tests.conftest import GPU_ONLY, gdn_inputs

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.cuda import extension


def test_extension_names_problems_without_raising():
    """The extension names each bad input's problem and returns it rather than raising (the op's fast
    entries rely on these checks; a failing check formatted through c10's operator<< ended the
    process with a segmentation fault on the H200 image)."""
    x = gdn_inputs(1, 4, 2, 2, 64, 64, device="cuda")
    bad = {"initial_state": x["initial_state"][:, :1].contiguous(), "g": x["g"].half(),
           "q": x["q"].transpose(1, 2).contiguous().transpose(1, 2), "beta": x["beta"].cpu(),
           "k": x["k"][:, :3].contiguous()}
    for name, t in bad.items():
        args = dict(x, **{name: t})
        out, problem = extension.load().gated_delta_rule(
            args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"], 0.125, True, None
        )
        assert out == [] and problem.startswith(f"{name} must"), (name, problem)
    out, problem = extension.load().gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], 0.125, True, None, path=9)
    assert out == [] and problem.startswith("path must be"), problem
