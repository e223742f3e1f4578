"""The kernels package stands on its own: every module of kernels/ imports without gdn_export (a
fresh interpreter, gdn_export absent from sys.modules afterwards), and the CUDA sources it ships are
the ones the plugin library and the `cuda` backend compile."""

import os
import subprocess
import sys
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _modules():
    for path in sorted(KERNELS.rglob("*.py")):
        parts = path.relative_to(KERNELS.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_kernel_module_imports_without_gdn_export():
    modules = list(_modules())
    assert len(modules) > 15 and "kernels.gated_delta_rule.triton.chunk" in modules
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m == 'gdn_export' or m.startswith('gdn_export.'))\n"
            "assert not bad, bad\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", code], cwd=KERNELS.parent, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_cuda_sources_are_the_builds_sources():
    from gdn_export.cuda import extension

    ours = {p.resolve() for p in KERNELS.glob("*/cuda/*.cu")}
    assert ours == {p.resolve() for p in extension.SOURCES if p.suffix == ".cu"}
    assert all(p.is_relative_to(KERNELS) for p in extension.HEADERS) and len(extension.HEADERS) >= 10


def test_packaging_ships_every_kernel_source():
    """pyproject's package data names every C++ / CUDA file under kernels/, so an installed copy
    (a wheel) builds the `cuda` backend as a checkout does."""
    import fnmatch
    import tomllib

    config = tomllib.loads((KERNELS.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert any(p.startswith("kernels") for p in config["packages"]["find"]["include"])
    patterns = config["package-data"]["kernels"]
    sources = [p.relative_to(KERNELS).as_posix() for p in KERNELS.rglob("*") if p.suffix in (".cu", ".cuh", ".h")]
    assert len(sources) >= 15
    unshipped = [s for s in sources if not any(fnmatch.fnmatch(s, pat) for pat in patterns)]
    assert not unshipped, f"not in [tool.setuptools.package-data] kernels: {unshipped}"
