"""TrtVLRunner on CPU against the recording stand-in of TensorRT (tests/trt/fake_trt.py): what a
prefill with images and a decode step bind as rope_positions / visual_embeds / visual_index."""

from __future__ import annotations

import numpy as np

from gdn_export.vlm.positions import VisualTokens, build_prompt, decode_positions, visual_call
from gdn_export.vlm.trt_runner import TrtVLRunner
from tests.trt.fake_trt import FakeCuda, FakeTrt, _array, write_engine

TOKENS = VisualTokens(7, 8, 9, 10, 2)  # inside the fake's vocab of 11
HIDDEN = 4


def _bound(trt, name, shape, dtype):
    context = trt.contexts[-1]
    return _array(context.addresses[name], shape, dtype).copy()


def test_prefill_with_images_then_decode_binds_the_visual_inputs(tmp_path):
    path = write_engine(tmp_path / "fake.engine", visual_hidden=HIDDEN)
    trt = FakeTrt()
    runner = TrtVLRunner(path, trt=trt, cuda=FakeCuda())
    rows = [build_prompt([1, 2], [[1, 4, 4]], [], TOKENS), np.array([3, 4, 5])]  # 2 + 4 + 2 + 2 tokens, and 3
    width = max(len(r) for r in rows)
    call = visual_call(rows, width, [[1, 4, 4]], [], TOKENS)
    embeds = np.random.default_rng(0).standard_normal((4, HIDDEN)).astype(np.float32)
    runner.set_visual(call, embeds)
    ids = np.zeros((2, width), np.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
    lens = np.array([len(r) for r in rows])
    _, states = runner.forward(ids, 0, runner.empty_states(2), lens)
    np.testing.assert_array_equal(_bound(trt, "rope_positions", (3, 2, width), np.int64), call.rope_positions)
    np.testing.assert_array_equal(_bound(trt, "visual_index", (4,), np.int64), call.visual_index)
    np.testing.assert_array_equal(_bound(trt, "visual_embeds", (4, HIDDEN), np.float16), embeds.astype(np.float16))
    assert ("set_input_shape", "visual_embeds", (4, HIDDEN)) in trt.calls
    # decode: positions continue after the image (rope_delta), no visual rows
    _, states = runner.forward(np.array([[1], [2]]), lens, states)
    want = decode_positions(lens, 1, call.rope_delta)
    np.testing.assert_array_equal(_bound(trt, "rope_positions", (3, 2, 1), np.int64), want)
    assert trt.calls.count(("set_input_shape", "visual_embeds", (0, HIDDEN))) == 1
    assert call.rope_delta[0] < 0 and call.rope_delta[1] == 0  # an image row's positions run behind its tokens
