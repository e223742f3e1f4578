"""ONNX Runtime's own log lines, gathered into one summary line instead of one coloured line per
call (`gdn-export validate` of a bf16 export printed ten).

    log = OrtLog()
    with log.capture():            # around InferenceSession(...) and every run
        session.run_with_iobinding(binding)
    log.summary()  -> "ONNX Runtime warned 10 times: TensorScatter: in-place optimization not
                       activated, copying past_cache to present_cache (10x)"   (None: it said nothing)

ORT's C++ logger writes to the process's stderr (file descriptor 2), below Python's sys.stderr, so
`capture` points descriptor 2 at a private file for the duration of the call and reads it back. A
warning is counted by its message (the timestamp, colour codes and byte counts dropped, so that
one cause is one entry); a line that is not an ORT warning (an error, anything else) is written
back to stderr as it came. The session's own severity setting is left as it is: what ORT says is
never lost, only folded.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections import Counter

# "\x1b[0;93m2026-12-06 20:28:18.454 [W:onnxruntime:, tensorscatter.cc:99 Compute] MESSAGE\x1b[m"
_WARNING = re.compile(r"^(?:\x1b\[[0-9;]*m)?\S+ \S+ \[W:onnxruntime:[^\]]*\] (?P<message>.*?)(?:\x1b\[m)?$")
_NUMBERS = re.compile(r"\(\d+ bytes\)")


class OrtLog:
    """Counts ONNX Runtime's warnings seen during `capture` blocks (module docstring)."""

    def __init__(self) -> None:
        self.warnings: Counter[str] = Counter()
        self._file = None

    @contextlib.contextmanager
    def capture(self):
        """Descriptor 2 to a private file during the block; ORT's warnings counted, the rest
        written back to stderr."""
        if self._file is None:
            self._file = tempfile.TemporaryFile()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            self._take()

    def _take(self) -> None:
        f = self._file
        if os.fstat(f.fileno()).st_size == 0:
            return
        f.seek(0)
        text = f.read().decode("utf-8", errors="replace")
        f.seek(0)
        f.truncate()
        other = []
        for line in text.splitlines():
            m = _WARNING.match(line.strip())
            if m:
                self.warnings[_NUMBERS.sub("(N bytes)", m["message"].strip())] += 1
            elif line.strip():
                other.append(line)
        if other:
            sys.stderr.write("\n".join(other) + "\n")
            sys.stderr.flush()

    def summary(self) -> str | None:
        """One line naming every distinct warning with its count, most frequent first; None when ORT
        warned of nothing."""
        total = sum(self.warnings.values())
        if not total:
            return None
        kinds = "; ".join(f"{message} ({n}x)" for message, n in self.warnings.most_common())
        return f"ONNX Runtime warned {total} time{'s' if total != 1 else ''}: {kinds}"

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
