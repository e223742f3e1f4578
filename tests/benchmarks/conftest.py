"""The trained-checkpoint scripts (benchmarks/train_small.py, quant_accuracy.py and their modules) are
imported from benchmarks/, as they import each other; one tiny trained checkpoint per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

TINY_STEPS = 3


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory) -> Path:
    """train_small.py --preset tiny --steps 3 --mtp --mtp-distill 0.5 on the CPU (~5 s): 4 layers (3 GDN
    + attention), hidden 128, vocab 300, with its MTP head; steps 0 and 1 joint, step 2 the head alone."""
    import train_small

    out = tmp_path_factory.mktemp("trained") / "tiny"
    assert train_small.main([str(out), "--preset", "tiny", "--steps", str(TINY_STEPS), "--mtp", "--mtp-distill", "0.5",
                             "--device", "cpu"]) == 0
    return out
