"""Vision-language runners: a vision encoder plus a language runner that takes visual inputs.

    runner, vision = open_vlm(MODEL)        # checkpoint folder (PyTorch) or model.onnx (ONNX Runtime)
    result = generate_vl(runner, vision, rows, VisualInputs(...), max_new_tokens)

The language runners are the text runners (gdn_export.runtime) with three more inputs per call:
`set_visual` arms the next call (a prompt's prefill, one call) with its rope_positions,
visual_embeds and visual_index (gdn_export.vlm.positions.VisualCall); every other call (decode
steps, text prompts) gets text positions past + t + rope_delta on all three streams and no visual
rows. States and everything else behave as for text. The vision encoders take pixel_values
[P, C*Tp*Ps*Ps] and grid_thw [N, 3] (numpy) and return [P / m^2, hidden] (numpy, the model dtype
as float32 for bf16); the grid is checked first (gdn_export.models.vision.check_grid).

open_vlm refuses a language / vision pair whose `gdn_export.vlm.fingerprint` (or hidden size)
differ, naming both files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gdn_export.errors import InputError
from gdn_export.runtime import base
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.vlm import export as vx
from gdn_export.vlm.images import VisualInputs
from gdn_export.vlm.positions import VisualCall, VisualTokens, build_prompt, decode_positions, visual_call


class _VisualMixin:
    """Feeds the language graph's visual inputs (module docstring)."""

    hidden_size: int
    embed_dtype: type

    def _init_visual(self, hidden: int, embed_dtype) -> None:
        self.hidden_size = hidden
        self.embed_dtype = embed_dtype
        self._pending: tuple[VisualCall, np.ndarray] | None = None
        self.rope_delta: np.ndarray | None = None

    def set_visual(self, call: VisualCall, embeds: np.ndarray) -> None:
        """Arm the next call (a prefill of exactly call.rope_positions' [B, T] tokens)."""
        if embeds.shape != (len(call.visual_index), self.hidden_size):
            raise InputError(f"{embeds.shape[0]} visual features of width {embeds.shape[-1]} for "
                             f"{len(call.visual_index)} placeholder tokens of width {self.hidden_size}")
        self._pending = (call, embeds)

    def reset_visual(self) -> None:
        self._pending, self.rope_delta = None, None

    def visual_inputs(self, ids: np.ndarray, past: np.ndarray, lens: np.ndarray):
        """(rope_positions [3, B, T], visual_embeds [N, hidden], visual_index [N]) of this call."""
        B, T = ids.shape
        if self._pending is not None:
            call, embeds = self._pending
            self._pending = None
            if call.rope_positions.shape[1:] != (B, T) or (past != 0).any():
                raise InputError(f"a prompt with images is prefilled in one call of "
                                 f"{call.rope_positions.shape[2]} tokens from an empty cache; this call "
                                 f"has {T} tokens at past lengths {past.tolist()} (does it fit the cache?)")
            self.rope_delta = call.rope_delta.copy()
            return call.rope_positions, embeds.astype(self.embed_dtype, copy=False), call.visual_index
        delta = self.rope_delta if self.rope_delta is not None and len(self.rope_delta) == B \
            else np.zeros(B, np.int64)
        if (past == 0).all():  # a new text prompt: no visual offsets
            delta = np.zeros(B, np.int64)
            self.rope_delta = delta
        return (decode_positions(past, T, delta), np.zeros((0, self.hidden_size), self.embed_dtype),
                np.zeros(0, np.int64))


class TorchVLRunner(_VisualMixin, TorchRunner):
    """HybridVLForCausalLM behind the Runner interface."""

    def __init__(self, model, device="cpu", op_backend=None):
        super().__init__(model, device, op_backend)
        self._init_visual(model.config.hidden_size, np.float32)
        self._extra = None

    def _forward(self, input_ids, past_lengths, seq_lens, states):
        self._extra = self.visual_inputs(input_ids, past_lengths, seq_lens)
        return super()._forward(input_ids, past_lengths, seq_lens, states)

    def _call(self, ids, past, lens, states, model=None):
        import torch

        positions, embeds, index = self._extra
        extra = (torch.from_numpy(positions).to(self.device),
                 torch.from_numpy(np.asarray(embeds, np.float32)).to(self.device, self.model.dtype),
                 torch.from_numpy(index).to(self.device))
        with torch.no_grad(), self._backend_context():
            logits, *new_states = (self.model if model is None else model)(ids, past, lens, *extra, *states)
        return logits, new_states


class OrtVLRunner(_VisualMixin, OrtRunner):
    """The language graph of a vision-language export in ONNX Runtime."""

    token_inputs = (*OrtRunner.token_inputs, *vx.VISUAL_INPUTS)

    def __init__(self, onnx_path, providers=("CPUExecutionProvider",), session_options=None):
        super().__init__(onnx_path, providers, session_options)
        if self.metadata.get(vx.KEY_ROLE) != "language":
            raise InputError(f"{self.path}: not the language graph of a vision-language export")
        dtype = self.metadata.get("gdn_export.dtype", "float32")
        self._init_visual(int(self.metadata[vx.KEY_HIDDEN]), np.float16 if dtype == "float16" else np.float32)

    def _extra_inputs(self, input_ids, past_lengths, seq_lens):
        positions, embeds, index = self.visual_inputs(input_ids, past_lengths, seq_lens)
        return {vx.ROPE_POSITIONS: positions, vx.VISUAL_EMBEDS: embeds, vx.VISUAL_INDEX: index}


# ------------------------------------------------------------------------------ vision encoders


class TorchVision:
    """VisionEncoder in PyTorch: encode(pixel_values, grid_thw) -> [P / m^2, hidden] numpy."""

    def __init__(self, encoder, device="cpu", processor_config: dict | None = None):
        import torch

        self.device = torch.device(device)
        self.encoder = encoder.to(self.device).eval()
        self.config = encoder.config
        self.processor_config = processor_config

    def encode(self, pixel_values: np.ndarray, grid_thw: np.ndarray) -> np.ndarray:
        import torch

        from gdn_export.models.vision import check_grid

        check_grid(np.shape(pixel_values), grid_thw, self.config)
        with torch.no_grad():
            out = self.encoder(torch.from_numpy(np.asarray(pixel_values, np.float32)).to(self.device),
                               torch.from_numpy(np.asarray(grid_thw, np.int64)).to(self.device))
        return out.float().cpu().numpy()


class OrtVision:
    """The vision graph in ONNX Runtime: encode as TorchVision."""

    def __init__(self, path, providers=("CPUExecutionProvider",)):
        import onnx
        import onnxruntime as ort

        from gdn_export.vision_config import VisionConfig

        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such vision ONNX file (export writes it beside model.onnx)")
        try:
            model = onnx.load(str(self.path), load_external_data=False)
        except Exception as exc:  # protobuf's DecodeError or an OSError
            raise InputError(f"{self.path}: not an ONNX model ({exc})") from None
        self.metadata = {p.key: p.value for p in model.metadata_props}
        if self.metadata.get(vx.KEY_ROLE) != "vision":
            raise InputError(f"{self.path}: not the vision graph of a gdn-export vision-language export")
        self.config = VisionConfig(**json.loads(self.metadata[vx.KEY_CONFIG]))
        self.dtype = np.float16 if self.metadata.get("gdn_export.dtype") == "float16" else np.float32
        raw = self.metadata.get(vx.KEY_PREPROCESSOR)
        self.processor_config = json.loads(raw) if raw else None
        self.session = ort.InferenceSession(str(self.path), providers=list(providers))

    def encode(self, pixel_values: np.ndarray, grid_thw: np.ndarray) -> np.ndarray:
        from gdn_export.models.vision import check_grid

        check_grid(np.shape(pixel_values), grid_thw, self.config)
        out, = self.session.run(None, {vx.PIXEL_VALUES: np.asarray(pixel_values, self.dtype),
                                       vx.GRID_THW: np.asarray(grid_thw, np.int64)})
        return out.astype(np.float32, copy=False)


def check_pair(language_meta: dict, vision_meta: dict, language_name: str, vision_name: str) -> None:
    """InputError unless the two files come from one export (fingerprint and hidden size)."""
    a, b = language_meta.get(vx.KEY_FINGERPRINT), vision_meta.get(vx.KEY_FINGERPRINT)
    if a is None or b is None or a != b:
        raise InputError(f"{vision_name} comes from another checkpoint than {language_name} "
                         f"(fingerprints {str(b)[:12]} vs {str(a)[:12]})")
    if language_meta.get(vx.KEY_HIDDEN) != vision_meta.get(vx.KEY_HIDDEN):
        raise InputError(f"{vision_name} has hidden size {vision_meta.get(vx.KEY_HIDDEN)}, "
                         f"{language_name} {language_meta.get(vx.KEY_HIDDEN)}")


def open_vlm(model: str | Path, device: str = "cpu", vision_file: str | Path | None = None, *,
             dtype=None, layout=None):
    """(language runner, vision encoder) for a composite checkpoint folder (PyTorch; `dtype` and
    `layout` shape it) or a vision-language model.onnx (ONNX Runtime, with model.vision.onnx beside
    it unless vision_file names another)."""
    path = Path(model)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if path.is_dir():
        from gdn_export.vlm.images import read_processor_config
        from gdn_export.vlm.weights import has_vision_tower, load_language, load_vision

        if not has_vision_tower(path):
            raise InputError(f"{path}: not a vision-language checkpoint with its vision tower "
                             f"(model.visual.*); images cannot be used")
        lm = load_language(path, dtype=dtype, device=device)
        if layout is not None:
            lm.layout = layout
        vision = TorchVision(load_vision(path, dtype=lm.dtype), device, read_processor_config(path))
        return TorchVLRunner(lm, device), vision
    if path.suffix == ".onnx":
        from gdn_export.vlm.detect import is_vlm_onnx

        if not is_vlm_onnx(path):
            raise InputError(f"{path}: a text-only export; images need the vision-language export of a "
                             f"composite checkpoint (export without --text-only)")
        runner = OrtVLRunner(path)
        vpath = Path(vision_file) if vision_file else vx.vision_path(path)
        vision = OrtVision(vpath)
        check_pair(runner.metadata, vision.metadata, path.name, vpath.name)
        return runner, vision
    raise InputError(f"{path}: images need a checkpoint folder or a vision-language model.onnx")


def tokens_of(vision) -> VisualTokens:
    return VisualTokens.from_config(vision.config)


def prompt_rows(ids, visual: VisualInputs, vision) -> list[np.ndarray]:
    """Token rows (1-D int64) with the first row's images and videos placed before its ids
    (vision_start, the placeholders of each grid, vision_end: gdn_export.vlm.positions.build_prompt)."""
    rows = [np.asarray(r, np.int64) for r in ids]
    if not visual.empty:
        images = visual.image_grid_thw if visual.image_grid_thw is not None else []
        videos = visual.video_grid_thw if visual.video_grid_thw is not None else []
        rows[0] = build_prompt(rows[0], images, videos, tokens_of(vision))
    return rows


def encode_all(vision, visual: VisualInputs) -> np.ndarray:
    """[N, hidden] float32: image features, then video features."""
    visual.check_pairs()
    feats = []
    if visual.pixel_values is not None:
        feats.append(vision.encode(visual.pixel_values, visual.image_grid_thw))
    if visual.pixel_values_videos is not None:
        feats.append(vision.encode(visual.pixel_values_videos, visual.video_grid_thw))
    return np.concatenate(feats) if feats else np.zeros((0, 0), np.float32)


def prefill_vl(runner, vision, rows, visual: VisualInputs):
    """One prefill call of prompts `rows` (holding their placeholders) with the images / videos of
    `visual`, from empty states. Returns (logits [B, V] at each row's last token, states, lengths)."""
    prompts = base.as_prompts(rows, runner.vocab_size)
    width = max(len(p) for p in prompts)
    call = visual_call(prompts, width, visual.image_grid_thw, visual.video_grid_thw, tokens_of(vision))
    runner.reset_visual()
    embeds = encode_all(vision, visual)
    if len(call.visual_index):
        runner.set_visual(call, embeds)
    lens = np.array([len(p) for p in prompts], np.int64)
    logits, states = runner.forward(base.pad_rows(prompts, width), 0, runner.empty_states(len(prompts)), lens)
    if logits.shape[1] > 1:  # the layout keeps every position's logits
        logits = logits[np.arange(len(prompts)), lens - 1]
    else:
        logits = logits[:, -1]
    return logits, states, lens


def generate_vl(runner, vision, rows, visual: VisualInputs, max_new_tokens: int, on_step=None):
    """Greedy generation (gdn_export.runtime.base.generate) of prompts `rows` (1-D token arrays
    holding their placeholders) with the images / videos of `visual`. The placeholders are
    checked against the grids before the vision encoder runs."""
    prompts = base.as_prompts(rows, runner.vocab_size)
    tokens = tokens_of(vision)
    width = max(len(p) for p in prompts)
    call = visual_call(prompts, width, visual.image_grid_thw, visual.video_grid_thw, tokens)
    runner.reset_visual()
    embeds = encode_all(vision, visual)
    if len(call.visual_index):
        runner.set_visual(call, embeds)
    return base.generate(runner, prompts, max_new_tokens, on_step=on_step, prefill_chunk=width)
