"""Where a benchmark writes its records (logs, JSON, tables): outside the repository unless told.

    out_dir(given, name)  the folder given (--out / --out-dir), else $OUT, else a new folder
                          gdn-<name>.XXXXXX in the temp dir (said on stderr); created if missing

The scripts run as `python3 benchmarks/<script>.py`, which puts this folder on sys.path; the
investigations put it there themselves. The current results, with their commands, live in docs/perf/.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def out_dir(given: str | os.PathLike | None, name: str) -> Path:
    """The folder `given`, else $OUT, else a fresh temp folder named after `name`; created."""
    if given:
        path = Path(given)
    elif os.environ.get("OUT"):
        path = Path(os.environ["OUT"])
    else:
        path = Path(tempfile.mkdtemp(prefix=f"gdn-{name}."))
        print(f"{name}: records go to {path}", file=sys.stderr)
    path.mkdir(parents=True, exist_ok=True)
    return path
