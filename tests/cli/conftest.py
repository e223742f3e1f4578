"""One tiny checkpoint and its exports, made through the CLI once per session, and a `cli`
fixture that runs `gdn_export.cli.main.main` in-process and captures what it prints."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from gdn_export.cli.main import main


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def error_line(self, command: str) -> str:
        """The single stderr line of a user mistake (exit 2, no traceback), without its prefix."""
        lines = self.err.strip().splitlines()
        assert self.code == 2, (self.code, self.err)
        assert len(lines) == 1 and "Traceback" not in self.err, self.err
        prefix = f"gdn-export {command}: error: "
        assert lines[0].startswith(prefix), lines[0]
        return lines[0][len(prefix):]


@pytest.fixture
def cli(capsys):
    def run(*argv) -> CliResult:
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def _main_ok(*argv) -> None:
    code = main([str(a) for a in argv])
    assert code == 0, f"gdn-export {' '.join(map(str, argv))} exited {code}"


@pytest.fixture(scope="session")
def cli_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="session")
def tiny_ckpt(cli_root) -> Path:
    """A qwen3_5 tiny checkpoint as `gdn-export make-tiny --seed 3` writes it, with two layers (a GDN
    layer, then attention: tests/onnx/_tiny.py TWO_LAYERS) instead of four; vocab 256."""
    from gdn_export.weights.tiny import make_tiny_checkpoint
    from tests.onnx._tiny import TWO_LAYERS

    return make_tiny_checkpoint(cli_root / "ckpt", family="qwen3_5", seed=3, **TWO_LAYERS)


@pytest.fixture(scope="session")
def exported(cli_root, tiny_ckpt):
    """exported(dtype, *flags) -> the .onnx `gdn-export export --dtype dtype *flags` wrote, alone in
    its folder (once per dtype and flags; under pytest-xdist once for every worker and later session
    on the same sources, as tests/onnx/_tiny.py shares its exports: make-tiny writes the same
    checkpoint in every worker)."""
    import hashlib

    from tests.onnx._tiny import _shared

    cache: dict[tuple, Path] = {}

    def get(dtype: str = "fp32", *flags: str) -> Path:
        key = (dtype, *flags)
        if key not in cache:
            name = f"cli-export-{dtype}" + (f"-{hashlib.sha1(repr(flags).encode()).hexdigest()[:10]}" if flags else "")
            root, lock = _shared(cli_root, name)
            path = root / name / "tiny.onnx"
            with lock:
                if not path.is_file():
                    path.parent.mkdir(exist_ok=True)
                    umask = os.umask(0o022)  # the usual umask: the file's mode is checked (test_export.py)
                    try:
                        _main_ok("export", tiny_ckpt, "-o", path, "--dtype", dtype, *flags, "-q")
                    finally:
                        os.umask(umask)
            cache[key] = path
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_onnx(exported) -> Path:
    return exported("fp32")
