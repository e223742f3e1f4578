"""A CPU stand-in of the TensorRT runtime API and of the runner's CUDA side, recording every call.

The "engine file" is JSON describing the I/O tensors and profiles (`write_engine`); the fake
context infers output shapes like a gdn-export engine and, on execute, reads and writes the bound
CPU buffers through their raw addresses: logits[b, 0, v] = 1000 * b + seq_lens[b], every present
state = past state + 1. So the tests see what a step really read and wrote.
"""

from __future__ import annotations

import ctypes
import enum
import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch


class DataType(enum.Enum):
    FLOAT, HALF, BF16, INT32, INT64, BOOL = range(6)


_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT64: np.int64, DataType.INT32: np.int32}
_NAMES = {"float32": DataType.FLOAT, "float16": DataType.HALF, "bfloat16": DataType.BF16, "int64": DataType.INT64}


class TensorIOMode(enum.Enum):
    NONE, INPUT, OUTPUT = range(3)


class DynamicShapesKernelSpecializationStrategy(enum.Enum):
    LAZY, EAGER, NONE = range(3)


class CudaGraphStrategy(enum.Enum):
    DISABLED, WHOLE_GRAPH_CAPTURE = range(2)


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self):
        pass


class FakeTrt:
    """What TrtRunner uses of the tensorrt / tensorrt_rtx module."""

    DataType, TensorIOMode, ILogger = DataType, TensorIOMode, ILogger
    DynamicShapesKernelSpecializationStrategy, CudaGraphStrategy = \
        DynamicShapesKernelSpecializationStrategy, CudaGraphStrategy

    def __init__(self, name="tensorrt_rtx", version="1.7.1.116", alias_query=True):
        self.__name__, self.__version__ = name, version
        self.alias_query = alias_query
        self.calls: list[tuple] = []  # every context call, in order
        self.contexts: list[FakeContext] = []

    def get_plugin_registry(self):
        return self

    def get_creator(self, name, version, namespace):
        return object()  # the plugins count as loaded

    def Runtime(self, logger):  # noqa: N802 (TensorRT's name)
        return FakeRuntime(self)


class FakeRuntime:
    def __init__(self, trt):
        self.trt = trt

    def deserialize_cuda_engine(self, data: bytes):
        spec = json.loads(data)
        cls = FakeEngine if self.trt.alias_query else FakeEngineWithoutAliasQuery
        return cls(self.trt, spec)


class RuntimeConfig:
    dynamic_shapes_kernel_specialization_strategy = DynamicShapesKernelSpecializationStrategy.LAZY
    cuda_graph_strategy = CudaGraphStrategy.DISABLED


class FakeEngineWithoutAliasQuery:
    def __init__(self, trt, spec):
        self.trt, self.spec = trt, spec
        self.tensors = spec["tensors"]  # [{name, mode, shape (-1 dynamic), dtype}]
        self.num_io_tensors = len(self.tensors)
        self.num_optimization_profiles = len(spec["profiles"])
        self.runtime_config = None

    def _t(self, name):
        return next(t for t in self.tensors if t["name"] == name)

    def get_tensor_name(self, i):
        return self.tensors[i]["name"]

    def get_tensor_mode(self, name):
        return TensorIOMode[self._t(name)["mode"]]

    def get_tensor_shape(self, name):
        return tuple(self._t(name)["shape"])

    def get_tensor_dtype(self, name):
        return _NAMES[self._t(name)["dtype"]]

    def get_tensor_profile_shape(self, name, index):
        return [tuple(s) for s in self.spec["profiles"][index][name]]

    def create_runtime_config(self):
        self.runtime_config = RuntimeConfig()
        return self.runtime_config

    def create_execution_context(self, config=None):
        context = FakeContext(self, config)
        self.trt.contexts.append(context)
        return context


class FakeEngine(FakeEngineWithoutAliasQuery):
    def get_aliased_input_tensor(self, name):
        return self.spec.get("aliases", {}).get(name)


def _array(address: int, shape, dtype) -> np.ndarray:
    count = int(np.prod(shape))
    raw = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


class FakeContext:
    def __init__(self, engine, config):
        self.engine, self.config = engine, config
        self.calls = engine.trt.calls
        self.profile, self.shapes, self.addresses = 0, {}, {}

    def set_optimization_profile_async(self, index, stream):
        self.calls.append(("set_optimization_profile_async", index, stream))
        self.profile, self.shapes = index, {}  # TensorRT forgets the input shapes on a switch
        return True

    def set_input_shape(self, name, shape):
        self.calls.append(("set_input_shape", name, tuple(shape)))
        mn, _, mx = self.engine.get_tensor_profile_shape(name, self.profile)
        if len(shape) != len(mn) or any(not lo <= d <= hi for d, lo, hi in zip(shape, mn, mx)):
            return False
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, address):
        self.calls.append(("set_tensor_address", name, address))
        self.addresses[name] = address
        return True

    def get_tensor_shape(self, name):
        if self.engine.get_tensor_mode(name) == TensorIOMode.INPUT:
            return self.shapes.get(name, self.engine.get_tensor_shape(name))
        batch, seq = self.shapes.get("input_ids", (-1, -1))
        if name == "logits":
            v = self.engine.get_tensor_shape(name)[-1]
            return (batch, 1 if self.engine.get_tensor_shape(name)[1] == 1 else seq, v)
        past = self.shapes.get("past" + name[len("present"):])
        if past is None:
            return tuple(-1 for _ in self.engine.get_tensor_shape(name))
        if self.engine.get_tensor_shape(name)[2] == -1:  # concat layout: present grows by seq
            return (past[0], past[1], past[2] + seq, past[3])
        return past

    def execute_async_v3(self, stream):
        self.calls.append(("execute_async_v3", stream))
        inputs = {n: s for n, s in self.shapes.items()}
        batch, _ = inputs["input_ids"]
        lens = _array(self.addresses["seq_lens"], (batch,), np.int64).copy()
        logits = _array(self.addresses["logits"], self.get_tensor_shape("logits"), np.float32)
        logits[...] = (1000 * np.arange(batch) + lens)[:, None, None]
        for t in self.engine.tensors:
            if not t["name"].startswith("present."):
                continue
            past_name = "past" + t["name"][len("present"):]
            dtype = _NP[_NAMES[t["dtype"]]]
            old = _array(self.addresses[past_name], inputs[past_name], dtype).copy()
            new = _array(self.addresses[t["name"]], self.get_tensor_shape(t["name"]), dtype)
            if old.shape == new.shape:
                new[...] = old + 1
        return True


def write_engine(path: Path, *, batch: int = 4, prefill: int = 16, cache_len: int = 32, layout: str = "inplace",
                 logits: str = "last", vocab: int = 11, record: bool = True, trt_name: str = "tensorrt_rtx",
                 trt_version: str = "1.7.1.116", alias_kv: bool = True, plugin_alias: str = "plugin",
                 visual_hidden: int = 0, max_visual: int = 64) -> Path:
    """A fake engine of one GDN layer (conv + recurrent states) and one attention layer (key / value),
    with prefill / decode profiles like `build_engine`'s, plus its build record. visual_hidden > 0:
    the language engine of a vision-language export (rope_positions, visual_embeds [n, hidden] fp16,
    visual_index after seq_lens; n in 0..max_visual in both profiles)."""
    past = -1 if layout == "concat" else cache_len
    states = [("past.0.conv", [-1, 8, 3], "float16"), ("past.0.recurrent", [-1, 2, 4, 4], "float32"),
              ("past.1.key", [-1, 2, past, 4], "float16"), ("past.1.value", [-1, 2, past, 4], "float16")]
    tensors = [{"name": "input_ids", "mode": "INPUT", "shape": [-1, -1], "dtype": "int64"},
               {"name": "past_lengths", "mode": "INPUT", "shape": [-1], "dtype": "int64"},
               {"name": "seq_lens", "mode": "INPUT", "shape": [-1], "dtype": "int64"}]
    if visual_hidden:
        tensors += [{"name": "rope_positions", "mode": "INPUT", "shape": [3, -1, -1], "dtype": "int64"},
                    {"name": "visual_embeds", "mode": "INPUT", "shape": [-1, visual_hidden], "dtype": "float16"},
                    {"name": "visual_index", "mode": "INPUT", "shape": [-1], "dtype": "int64"}]
    tensors += [{"name": n, "mode": "INPUT", "shape": s, "dtype": d} for n, s, d in states]
    tensors.append({"name": "logits", "mode": "OUTPUT", "shape": [-1, 1 if logits == "last" else -1, vocab],
                    "dtype": "float32"})
    tensors += [{"name": "present" + n[4:], "mode": "OUTPUT", "shape": s, "dtype": d} for n, s, d in states]

    def profile(seq_max, opt_batch):
        out = {"input_ids": [[1, 1], [opt_batch, seq_max], [batch, seq_max]]}
        for name in ("past_lengths", "seq_lens"):
            out[name] = [[1], [opt_batch], [batch]]
        if visual_hidden:
            out["rope_positions"] = [[3, 1, 1], [3, opt_batch, seq_max], [3, batch, seq_max]]
            out["visual_embeds"] = [[0, visual_hidden], [max_visual // 2, visual_hidden], [max_visual, visual_hidden]]
            out["visual_index"] = [[0], [max_visual // 2], [max_visual]]
        for n, s, _ in states:
            p = [0, cache_len // 2, cache_len]
            out[n] = [[1] + [p[0] if d < 0 else d for d in s[1:]], [opt_batch] + [p[1] if d < 0 else d for d in s[1:]],
                      [batch] + [p[2] if d < 0 else d for d in s[1:]]]
        return out

    aliases = {}
    if layout == "inplace" and alias_kv:
        aliases = {"present.1.key": "past.1.key", "present.1.value": "past.1.value"}
    spec = {"tensors": tensors, "profiles": [profile(prefill, 1), profile(1, batch)], "aliases": aliases}
    path.write_text(json.dumps(spec))
    if record:
        spec_states = [{"name": n, "output": "present" + n[4:], "layer": int(n.split(".")[1]), "kind": n.split(".")[2],
                        "dtype": d, "shape": ["batch"] + [("past" if x < 0 else x) for x in s[1:]]}
                       for n, s, d in states]
        gdn = {"name": "conv", "type": "PluginV3", "inputs": ["x", "past.0.conv"], "outputs": ["y", "present.0.conv"]}
        rec = {"name": "gdr", "type": "PluginV3", "inputs": ["q", "past.0.recurrent"],
               "outputs": ["o", "present.0.recurrent"]}
        if plugin_alias == "separate":
            rec["inputs"] = ["q", "copy_of_state"]
            gdn["inputs"].append("past.0.recurrent")  # another reader of the state: TensorRT copies
        kv = {"name": "kv", "type": "kgen", "inputs": ["k", "present.1.key", "present.1.value"],
              "outputs": ["present.1.key", "present.1.value"]}
        if layout == "concat":
            kv["inputs"] = ["k", "past.1.key", "past.1.value"]
        metadata = {"gdn_export.state_specs": json.dumps(spec_states), "gdn_export.kv_cache": layout,
                    "gdn_export.logits": logits, "gdn_export.vocab_size": str(vocab)}
        if visual_hidden:
            metadata.update({"gdn_export.vlm.role": "language", "gdn_export.vlm.hidden_size": str(visual_hidden),
                             "gdn_export.vlm.fingerprint": "ab" * 32})
        Path(str(path) + ".layers.json").write_text(json.dumps({
            "trt": trt_name, "trt_version": trt_version, "metadata": metadata,
            "outputs": [t["name"] for t in tensors if t["mode"] == "OUTPUT"],
            "profiles": [{"name": "prefill"}, {"name": "decode"}], "engine_layers": [gdn, rec, kv]}))
    return path


class FakeStream:
    def __init__(self, handle: int):
        self.handle = handle


class FakeCuda:
    """The runner's CUDA side on CPU tensors; streams are handles, every use is logged."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.log: list[tuple] = []
        self.caller = FakeStream(7)  # the caller's current stream
        self.current = self.caller
        self.streams: list[FakeStream] = []

    @contextmanager
    def scope(self):
        yield

    def zeros(self, numel, dtype):
        return torch.zeros(max(int(numel), 1), dtype=dtype)

    def new_stream(self):
        self.streams.append(FakeStream(100 + len(self.streams)))
        return self.streams[-1]

    def current_stream(self):
        return self.current

    @staticmethod
    def handle(stream):
        return stream.handle

    def wait(self, waiter, producer):
        self.log.append(("wait", waiter.handle, producer.handle))

    @contextmanager
    def on(self, stream):
        before, self.current = self.current, stream
        self.log.append(("on", stream.handle))
        try:
            yield
        finally:
            self.current = before

    def upload(self, dst, array):
        self.log.append(("upload", self.current.handle))
        dst.copy_(torch.from_numpy(np.ascontiguousarray(array)))

    def to_host(self, tensor):
        self.log.append(("to_host", self.current.handle))
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy().copy()
