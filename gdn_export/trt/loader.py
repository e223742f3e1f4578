"""Find TensorRT, the gdn plugin library, and the environment a TensorRT build process needs.

    flavour()        "tensorrt" (TensorRT 10.x / 11.x) if it imports, else "tensorrt_rtx"
    import_trt()     that module (GdnExportError when neither is installed)
    find_plugins(p)  libgdn_plugins.so: `p` (--plugins), else $GDN_EXPORT_PLUGINS, else
                     plugins/build/libgdn_plugins.so in the source tree; missing: how to build it
                     here (gdn_export.trt.plugin_build)
    check_loads(lib) that it loads (dlopen) and exports getCreators, before any work or output
    build_env()      os.environ plus what a subprocess that parses ONNX needs (see below)

TensorRT-RTX 1.7 wheels ship `libtensorrt_rtx.so.1` only, but the RTX ONNX parser dlopens the
unversioned `libtensorrt_rtx.so` when it imports a plugin node, and the process then dies with
"terminate called without an active exception". The fix is a symlink `libtensorrt_rtx.so` ->
the wheel's `.so.1` in a private cache folder that is on LD_LIBRARY_PATH *when the process
starts* (the dynamic loader reads it once), so engine builds run in a child process
(`gdn_export.trt.build`) started with `build_env()`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from gdn_export.errors import GdnExportError
from gdn_export.trt.plugin_build import how_to_build

PLUGINS_ENV = "GDN_EXPORT_PLUGINS"
# Force one TensorRT flavour ("tensorrt" or "tensorrt_rtx") instead of trying tensorrt first.
FLAVOUR_ENV = "GDN_EXPORT_TRT"
CACHE_ENV = "GDN_EXPORT_CACHE"
PLUGIN_LIBRARY = "libgdn_plugins.so"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PLUGINS = REPO_ROOT / "plugins" / "build" / PLUGIN_LIBRARY
FLAVOURS = ("tensorrt", "tensorrt_rtx")
_RTX_LIB = "libtensorrt_rtx.so"


@lru_cache(maxsize=None)
def flavour() -> str:
    """The TensorRT Python module to use: "tensorrt" if it imports, else "tensorrt_rtx"."""
    forced = os.environ.get(FLAVOUR_ENV)
    if forced:
        if forced not in FLAVOURS:
            raise GdnExportError(f"${FLAVOUR_ENV}={forced!r}: choose one of {', '.join(FLAVOURS)}")
        candidates = (forced,)
    else:
        candidates = FLAVOURS
    reasons = []
    for name in candidates:
        try:
            importlib.import_module(name)
            return name
        except Exception as exc:  # the PyPI `tensorrt` stubs raise more than ImportError
            reasons.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    raise GdnExportError("no TensorRT Python module imports (" + "; ".join(reasons)
                         + "); install tensorrt>=10.8 or tensorrt-rtx")


def import_trt() -> ModuleType:
    """The TensorRT module (`tensorrt` or `tensorrt_rtx`)."""
    return importlib.import_module(flavour())


def find_plugins(path: str | os.PathLike | None = None) -> Path:
    """The plugin library to load; GdnExportError naming where we looked when it is missing."""
    if path is not None:
        where, chosen = "--plugins", Path(path)
    elif os.environ.get(PLUGINS_ENV):
        where, chosen = f"${PLUGINS_ENV}", Path(os.environ[PLUGINS_ENV])
    else:
        where, chosen = "default location", DEFAULT_PLUGINS
    chosen = chosen.expanduser()
    if chosen.is_dir():
        chosen = chosen / PLUGIN_LIBRARY
    if not chosen.is_file():
        raise GdnExportError(f"plugin library not found: {chosen} ({where}); {how_to_build()}; or pass --plugins "
                             f"PATH / set ${PLUGINS_ENV}")
    return chosen.resolve()


def check_loads(library: Path) -> None:
    """GdnExportError unless the plugin library loads into this process (the dynamic loader's
    reason: not a shared library, another architecture, a missing dependency or symbol) and
    exports getCreators, the entry point TensorRT's IPluginRegistry::loadLibrary calls. The
    library links no TensorRT (plugins/CMakeLists.txt), so this needs none."""
    import ctypes

    try:
        handle = ctypes.CDLL(str(library), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GdnExportError(f"plugin library {library} does not load ({reason}); {how_to_build()}") from None
    if not hasattr(handle, "getCreators"):
        raise GdnExportError(f"{library} is not a TensorRT plugin library: it exports no getCreators "
                             f"(libgdn_plugins.so does); {how_to_build()}")


def cache_dir() -> Path:
    """Private cache folder of gdn-export ($GDN_EXPORT_CACHE, else $XDG_CACHE_HOME/gdn-export)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gdn-export"


def _rtx_library() -> Path | None:
    """The wheel's libtensorrt_rtx.so.1, or None when tensorrt_rtx is not the flavour in use."""
    if flavour() != "tensorrt_rtx":
        return None
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / _RTX_LIB).exists():
            return None  # the wheel already has the unversioned name: nothing to work around
        versioned = sorted(Path(folder).glob(_RTX_LIB + ".*"))
        if versioned:
            return versioned[0]
    return None


def rtx_symlink_dir() -> Path | None:
    """A folder holding libtensorrt_rtx.so -> the wheel's versioned library, made on first use;
    None when no workaround is needed."""
    target = _rtx_library()
    if target is None:
        return None
    folder = cache_dir() / f"trt-rtx-libs-{target.parent.stat().st_ino}"
    link = folder / _RTX_LIB
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{_RTX_LIB}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)  # atomic: a concurrent build sees the old link or the new one
    return folder


def build_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process that parses ONNX with plugin nodes (see module docstring)."""
    env = dict(os.environ if base is None else base)
    folder = rtx_symlink_dir()
    if folder is not None:
        parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        if str(folder) not in parts:
            env["LD_LIBRARY_PATH"] = os.pathsep.join([str(folder), *parts])
    # The child must import this same gdn_export, installed or not.
    py_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in py_path:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *py_path])
    env[FLAVOUR_ENV] = flavour()
    return env
