"""TensorRT side of gdn-export: engine building, inspection and the TensorRT runner.

    build_engine(onnx, engine, plugins=..., min/opt/max_shapes=..., workspace=..., progress=...)
    inspect_engine(engine, plugins=...) -> EngineLayers     layers, and which are gdn plugins
    state_aliasing(engine) -> {present.*: how}              which state outputs share their input's memory
    TrtRunner(engine, plugins=...)                          gdn_export.runtime.base.Runner on a GPU

TensorRT is imported lazily (`loader.import_trt`: tensorrt 10.x/11.x if it imports, else
tensorrt_rtx), so importing this package needs neither.
"""

from gdn_export.trt.build import build_engine
from gdn_export.trt.inspect import EngineLayers, inspect_engine, state_aliasing
from gdn_export.trt.loader import find_plugins
from gdn_export.trt.profile import DEFAULT_RANGES, make_profile, make_profiles, parse_shape_specs

__all__ = ["DEFAULT_RANGES", "EngineLayers", "TrtRunner", "build_engine", "find_plugins", "inspect_engine",
           "make_profile", "make_profiles", "parse_shape_specs", "state_aliasing"]


def __getattr__(name):
    if name == "TrtRunner":  # imports torch; only on use
        from gdn_export.trt.runtime import TrtRunner

        return TrtRunner
    raise AttributeError(name)
