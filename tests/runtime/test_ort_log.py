"""ONNX Runtime's warnings folded into one summary line (gdn_export.runtime.ort_log): what its C++
logger writes to descriptor 2 during a capture is counted by message, anything else passes
through (a bf16 export's validate: tests/cli/test_validate.py)."""

from __future__ import annotations

import os

from gdn_export.runtime.ort_log import OrtLog

WARNING = ("\x1b[0;93m2026-12-06 20:28:18.454309649 [W:onnxruntime:, tensorscatter.cc:99 Compute] TensorScatter: "
           "in-place optimization not activated, copying past_cache to present_cache ({} bytes)\x1b[m\n")


def test_warnings_are_counted_and_other_lines_pass_through(capfd):
    log = OrtLog()
    for size in (1048576, 2048):
        with log.capture():
            os.write(2, WARNING.format(size).encode())
            os.write(2, b"2026-12-06 20:28:18.5 [E:onnxruntime:, session.cc:1 Run] a real error\n")
    with log.capture():
        os.write(2, b"[W:onnxruntime:Default, env.cc:2 Init] another kind\n".replace(b"[W", b"2026-12-06 1:2:3 [W"))
    err = capfd.readouterr().err
    assert "[W:onnxruntime" not in err and err.count("a real error") == 2
    assert log.summary() == ("ONNX Runtime warned 3 times: TensorScatter: in-place optimization not activated, "
                             "copying past_cache to present_cache (N bytes) (2x); another kind (1x)")
    log.close()


def test_nothing_said_is_no_summary(capfd):
    log = OrtLog()
    with log.capture():
        pass
    assert log.summary() is None and capfd.readouterr().err == ""

