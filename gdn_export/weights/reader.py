"""Read tensors from a Hugging Face safetensors checkpoint directory, single-file or sharded.

    model.safetensors                       one file
    model.safetensors.index.json            {"weight_map": {tensor name: shard file}}

Shapes come from the file headers, so that every name and shape can be checked before any tensor
data is read. A missing or corrupt file is a one-line CheckpointError naming it, and so is a
quantized tensor whose values no quantizer writes (`check_values`): a float8_e4m3fn NaN (bytes
0x7F / 0xFF), a weight scale that is negative or not finite, an activation or AWQ pre-scale that is
not finite and > 0. Such a checkpoint would otherwise load and give wrong logits.
"""

from __future__ import annotations

import json
import struct
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from gdn_export.errors import CheckpointError
from gdn_export.paths import check_readable as _check_readable
from gdn_export.paths import os_reason

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
           "U8": torch.uint8, "BOOL": torch.bool}


# Scale tensors by name: a weight scale may be 0 (an all-zero block or channel), the scales that
# divide or multiply activations may not.
WEIGHT_SCALES = (".weight_scale_inv", ".weight_scale")
ACTIVATION_SCALES = (".input_scale", ".pre_quant_scale")


def check_values(name: str, dtype: str, tensor: torch.Tensor) -> None:
    """CheckpointError naming `name` when a quantized tensor holds values no quantizer writes
    (see the module docstring); other tensors pass unread. dtype: the safetensors dtype name."""
    if dtype == "F8_E4M3":
        nan = (tensor.view(torch.uint8) & 0x7F) == 0x7F
        if nan.any():
            raise CheckpointError(f"tensor {name} holds {int(nan.sum())} float8_e4m3fn NaN values "
                                  f"(a corrupt FP8 weight)")
        return
    positive = name.endswith(ACTIVATION_SCALES)
    if not (positive or name.endswith(WEIGHT_SCALES)) or not tensor.is_floating_point():
        return
    values = tensor.float()
    bad = ~torch.isfinite(values) | ((values <= 0) if positive else (values < 0))
    if bad.any():
        first = values.reshape(-1)[bad.reshape(-1).nonzero()[0, 0]].item()
        need = "finite and > 0" if positive else "finite and >= 0"
        raise CheckpointError(f"tensor {name}: {int(bad.sum())} of {values.numel()} scales are not {need} "
                              f"(e.g. {first})")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _exists(path: Path) -> bool:
    """Whether anything is at `path`; a permission problem on the way is named, not read as "no"."""
    try:
        path.stat()
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot look at it ({os_reason(exc)})") from None


def check_readable(path: Path, what: str, folder: bool = False) -> None:
    """gdn_export.paths.check_readable raising CheckpointError."""
    _check_readable(path, what, folder=folder, error=CheckpointError)


class CheckpointReader:
    """Tensor names, shapes and data of one checkpoint directory; use as a context manager.

    `shapes` maps every tensor name to its shape; `get(name)` reads one tensor on the CPU.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._stack = ExitStack()
        self._handles: dict[Path, object] = {}
        self.files: dict[str, Path] = {}  # tensor name -> file
        self.dtypes: dict[str, str] = {}  # tensor name -> safetensors dtype name ("BF16", "I8", ...)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._headers: dict[Path, tuple[int, dict]] = {}  # file -> (data start, header)
        try:
            self._index()
        except BaseException:
            self.close()
            raise

    def _open(self, path: Path):
        if path not in self._handles:
            check_readable(path, "safetensors file")
            try:
                self._handles[path] = self._stack.enter_context(safe_open(str(path), framework="pt"))
            except Exception as exc:  # safetensors raises its own error types for a bad header
                raise CheckpointError(f"{path}: not a readable safetensors file ({_one_line(exc)})") from None
        return self._handles[path]

    def _index(self) -> None:
        single, index = self.directory / SINGLE_FILE, self.directory / INDEX_FILE
        check_readable(self.directory, "checkpoint directory", folder=True)
        if _exists(index):
            check_readable(index, "safetensors index")
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: invalid safetensors index ({_one_line(exc)})") from None
            by_file: dict[str, list[str]] = {}
            for name, file in weight_map.items():
                by_file.setdefault(file, []).append(name)
            for file, names in sorted(by_file.items()):
                path = self.directory / file
                handle = self._open(path)
                present = set(handle.keys())
                for name in names:
                    if name not in present:
                        raise CheckpointError(f"{path}: tensor {name} listed in {INDEX_FILE} is not in the file")
                    self._add(name, path, handle)
        elif _exists(single):
            handle = self._open(single)
            for name in handle.keys():
                self._add(name, single, handle)
        else:
            raise CheckpointError(
                f"{self.directory}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors checkpoints are supported)"
            )

    def _add(self, name: str, path: Path, handle) -> None:
        try:
            piece = handle.get_slice(name)
            shape, dtype = tuple(piece.get_shape()), str(piece.get_dtype())
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read tensor {name} ({_one_line(exc)})") from None
        self.files[name] = path
        self.shapes[name] = shape
        self.dtypes[name] = dtype

    def get(self, name: str) -> torch.Tensor:
        """Tensor `name` on the CPU, in its stored dtype."""
        path = self.files[name]
        try:
            tensor = self._handles[path].get_tensor(name)
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read tensor {name} ({_one_line(exc)})") from None
        check_values(name, self.dtypes[name], tensor)
        return tensor

    def _header(self, path: Path) -> tuple[int, dict]:
        if path not in self._headers:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                self._headers[path] = (8 + n, json.loads(f.read(n)))
        return self._headers[path]

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Copy tensor `name` into `out` (same shape). Where the stored dtype is out's and out is a
        contiguous CPU tensor, the bytes are read from the file straight into out: no mmap pages
        of it stay resident and no temporary copy is made (how per-expert tensors are stacked)."""
        path = self.files[name]
        try:
            start, header = self._header(path)
            entry = header[name]
            begin, end = entry["data_offsets"]
            direct = (_DTYPES.get(entry["dtype"]) == out.dtype and out.is_contiguous()
                      and out.device.type == "cpu" and end - begin == out.numel() * out.element_size())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: cannot read tensor {name} ({_one_line(exc)})") from None
        if not direct:
            out.copy_(self.get(name))
            return
        with open(path, "rb") as f:
            f.seek(start + begin)
            view = memoryview(out.view(torch.uint8).reshape(-1).numpy())
            if f.readinto(view) != end - begin:
                raise CheckpointError(f"{path}: cannot read tensor {name} (file is truncated)")
        check_values(name, entry["dtype"], out)

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
