"""TensorRT runners of a vision-language build: model.engine (language, visual inputs) and
model.vision.engine (vision encoder), built by `gdn-export build` (gdn_export.vlm.build).

    TrtVLRunner(model.engine)     TrtRunner with rope_positions / visual_embeds / visual_index fed
                                  as gdn_export.vlm.runner's ORT and torch runners feed them
    TrtVision(model.vision.engine).encode(pixel_values [P, D], grid_thw [N, 3]) -> [P / m^2, hidden]

Both read the ONNX metadata their build record keeps (`gdn_export.vlm.*`): the vision config,
hidden size and fingerprint; open_trt_vlm refuses a pair from different checkpoints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from gdn_export.errors import GdnExportError, InputError
from gdn_export.trt.runtime import TrtRunner
from gdn_export.vlm import export as vx
from gdn_export.vlm.runner import _VisualMixin, check_pair


def _record(engine_path: Path) -> dict:
    from gdn_export.trt.build import layers_path

    path = layers_path(engine_path)
    if not path.is_file():
        raise InputError(f"{engine_path}: no build record {path.name} beside it (build it with gdn-export build)")
    return json.loads(path.read_text(encoding="utf-8"))


class TrtVLRunner(_VisualMixin, TrtRunner):
    """The language engine of a vision-language build (module docstring)."""

    def __init__(self, engine_path, **kwargs):
        super().__init__(engine_path, **kwargs)
        self.metadata = self._record.get("metadata", {})
        if self.metadata.get(vx.KEY_ROLE) != "language":
            raise InputError(f"{self.path}: not the language engine of a vision-language export")
        missing = [n for n in vx.VISUAL_INPUTS if n not in self._inputs]
        if missing:
            raise GdnExportError(f"{self.path}: the engine has no {', '.join(missing)}")
        self._init_visual(int(self.metadata[vx.KEY_HIDDEN]), np.float32)

    def _extra_inputs(self, input_ids, past_lengths, seq_lens):
        positions, embeds, index = self.visual_inputs(input_ids, past_lengths, seq_lens)
        return {vx.ROPE_POSITIONS: positions, vx.VISUAL_EMBEDS: np.asarray(embeds, np.float32),
                vx.VISUAL_INDEX: index}


class TrtVision:
    """The vision engine: encode as gdn_export.vlm.runner.TorchVision (module docstring)."""

    def __init__(self, engine_path: str | os.PathLike, *, plugins=None, device=None, trt=None, cuda=None):
        from gdn_export.trt import loader
        from gdn_export.vision_config import VisionConfig

        self.path = Path(engine_path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such vision engine (build writes it beside model.engine)")
        self.metadata = _record(self.path).get("metadata", {})
        if self.metadata.get(vx.KEY_ROLE) != "vision":
            raise InputError(f"{self.path}: not the vision engine of a vision-language build")
        self.config = VisionConfig(**json.loads(self.metadata[vx.KEY_CONFIG]))
        raw = self.metadata.get(vx.KEY_PREPROCESSOR)
        self.processor_config = json.loads(raw) if raw else None
        if cuda is None:
            from gdn_export.trt._cuda import TorchCuda

            cuda = TorchCuda(device)
        self._cuda, self._trt = cuda, trt or loader.import_trt()
        logger = self._trt.Logger(self._trt.Logger.WARNING)
        with cuda.scope():
            self._runtime = self._trt.Runtime(logger)
            self.engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
            if self.engine is None:
                raise GdnExportError(f"{self.path}: TensorRT could not deserialize the engine")
            self.context = self.engine.create_execution_context()
        self._stream = cuda.new_stream()

    def _dtype(self, name):
        import torch

        t = self._trt.DataType
        return {t.FLOAT: torch.float32, t.HALF: torch.float16, t.BF16: torch.bfloat16,
                t.INT64: torch.int64}[self.engine.get_tensor_dtype(name)]

    def encode(self, pixel_values: np.ndarray, grid_thw: np.ndarray) -> np.ndarray:
        from gdn_export.models.vision import check_grid, merged_tokens

        check_grid(np.shape(pixel_values), grid_thw, self.config)
        cuda, caller = self._cuda, self._cuda.current_stream()
        n_out = sum(merged_tokens(grid_thw, self.config.spatial_merge_size))
        with cuda.on(self._stream):
            cuda.wait(self._stream, caller)
            shape = np.shape(pixel_values)
            pv = cuda.zeros(int(np.prod(shape)), self._dtype(vx.PIXEL_VALUES)).view(shape)
            grid = cuda.zeros(int(np.size(grid_thw)), self._dtype(vx.GRID_THW)).view(np.shape(grid_thw))
            out = cuda.zeros(n_out * int(self.metadata[vx.KEY_HIDDEN]), self._dtype(vx.VISUAL_EMBEDS))
            out = out.view(n_out, int(self.metadata[vx.KEY_HIDDEN]))
            cuda.upload(pv, np.asarray(pixel_values, np.float32))
            cuda.upload(grid, np.asarray(grid_thw, np.int64))
            for name, view in ((vx.PIXEL_VALUES, pv), (vx.GRID_THW, grid)):
                if not self.context.set_input_shape(name, tuple(view.shape)):
                    raise InputError(f"{name} shape {list(view.shape)} is outside the vision engine's profile "
                                     f"(build it with larger --image-sizes / --max-images)")
            got = tuple(int(d) for d in self.context.get_tensor_shape(vx.VISUAL_EMBEDS))
            if got != tuple(out.shape):
                raise GdnExportError(f"{self.path}: TensorRT infers visual_embeds {list(got)}, expected "
                                     f"{list(out.shape)}")
            for name, view in ((vx.PIXEL_VALUES, pv), (vx.GRID_THW, grid), (vx.VISUAL_EMBEDS, out)):
                self.context.set_tensor_address(name, view.untyped_storage().data_ptr())
            if not self.context.execute_async_v3(cuda.handle(self._stream)):
                raise GdnExportError(f"{self.path}: TensorRT execution of the vision engine failed")
            host = cuda.to_host(out)
        cuda.wait(caller, self._stream)
        return host.astype(np.float32, copy=False)


def vision_engine_path(engine_path) -> Path:
    path = Path(engine_path)
    return path.with_name(path.name.removesuffix(".engine") + ".vision.engine")


def open_trt_vlm(engine_path, *, plugins=None, device=None, vision_file=None):
    """(TrtVLRunner, TrtVision) of a vision-language build; the pair's fingerprints must agree."""
    runner = TrtVLRunner(engine_path, plugins=plugins, device=device)
    vpath = Path(vision_file) if vision_file else vision_engine_path(engine_path)
    vision = TrtVision(vpath, plugins=plugins, device=device)
    check_pair(runner.metadata, vision.metadata, Path(engine_path).name, vpath.name)
    return runner, vision
