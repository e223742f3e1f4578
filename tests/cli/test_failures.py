"""Every command that writes, and every input a user can get wrong, ends in one stderr line and
exit 2 BEFORE the work, with nothing written: unwritable outputs (read-only folders, /proc, /sys,
missing parents, a folder where a file belongs and the reverse), existing outputs without
--overwrite, unreadable inputs (permission denied named as such), weights stored in dtypes the
model cannot take, non-strict --input-ids, generations longer than memory allows. Also: files
written with the usual modes, and every flag's --help naming its default."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gdn_export.cli.main import make_parser

# ------------------------------------------------------------------ helpers


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def shared_tmp():
    """A folder every user can enter (pytest's tmp_path lives under a 0700 folder of root's), for
    the cases that run as an unprivileged user."""
    root = Path(tempfile.mkdtemp(prefix="gdn-export-failures-"))
    root.chmod(0o777)
    yield root
    for p in [root, *root.rglob("*")]:
        with contextlib.suppress(OSError):
            p.chmod(0o777 if p.is_dir() else 0o666)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def unprivileged():
    """A context manager in which file permissions apply: as root, the effective user becomes
    nobody (65534) for its duration (root ignores a folder's mode); as anyone else, a no-op. The
    modules the commands import late are imported first (the interpreter's own files may not be
    readable by nobody)."""
    import gdn_export.onnx.export  # noqa: F401
    import gdn_export.runtime.ort_runner  # noqa: F401
    import gdn_export.trt.build  # noqa: F401
    import gdn_export.validate  # noqa: F401
    import gdn_export.weights.tiny  # noqa: F401

    @contextlib.contextmanager
    def as_nobody():
        if os.geteuid() != 0:
            yield
            return
        os.setegid(65534)
        os.seteuid(65534)
        try:
            yield
        finally:
            os.seteuid(0)
            os.setegid(0)

    return as_nobody


def copy_checkpoint(src: Path, dst: Path, convert: dict | None = None) -> Path:
    """A copy of checkpoint `src` in `dst`, tensors named in `convert` stored in another dtype."""
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(src / "model.safetensors")
    for name, dtype in (convert or {}).items():
        tensors[name] = tensors[name].to(dtype)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    for p in [dst, *dst.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


# Every command that writes: (name, argv builder given the output path, output is a folder).
WRITERS = {
    "export": (lambda o, c, x: ["export", c, "-o", o / "m.onnx"], "m.onnx", False),
    "make-tiny": (lambda o, c, x: ["make-tiny", o / "ckpt"], "ckpt", True),
    "run-save-logits": (lambda o, c, x: ["run", x, "--input-ids", "1,2", "--max-new-tokens", 1,
                                         "--save-logits", o / "l.npz"], "l.npz", False),
    "validate-json": (lambda o, c, x: ["validate", c, "--onnx", x, "--json", o / "r.json"], "r.json", False),
    "bench-json": (lambda o, c, x: ["bench", c, "--prompt-len", 2, "--decode-steps", 1, "--warmup", 0,
                                    "--repeats", 1, "--json", o / "b.json"], "b.json", False),
    "build": (lambda o, c, x: ["build", x, "-o", o / "m.engine", "--plugins", "/nowhere/lib.so"],
              "m.engine", False),
    "demo-keep": (lambda o, c, x: ["demo", "--keep", o], "tiny-qwen3_5", True),
}


def command_of(argv) -> str:
    return str(argv[0])


# ------------------------------------------------------------------ unwritable outputs

# Output folders that cannot take a file, for root and for anyone: (folder, fragment).
BAD_FOLDERS = {
    "proc": ("/proc", "folder /proc does not accept new files"),
    "proc-self": ("/proc/self", "folder /proc/self does not accept new files"),
    "proc-sys-kernel": ("/proc/sys/kernel", "/proc/sys/kernel"),
    "sys": ("/sys", "cannot write into folder /sys (permission denied)"),
    "sys-kernel": ("/sys/kernel", "cannot write into folder /sys/kernel (permission denied)"),
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("where", list(BAD_FOLDERS))
def test_virtual_and_system_folders_refused_first(cli, tiny_ckpt, tiny_onnx, writer, where):
    build, _, _ = WRITERS[writer]
    folder, fragment = BAD_FOLDERS[where]
    argv = build(Path(folder), tiny_ckpt, tiny_onnx)
    message = cli(*argv).error_line(command_of(argv))
    assert fragment in message


# make-tiny and demo create the missing parents of their folder: not a mistake for them.
PATH_CASES = [(w, c) for w in WRITERS for c in ("missing-parent", "missing-grandparent", "parent-is-a-file",
                                                  "folder-where-file-belongs")
              if not (WRITERS[w][2] and c.startswith("missing"))]


@pytest.mark.parametrize("writer,case", PATH_CASES, ids=[f"{w}-{c}" for w, c in PATH_CASES])
def test_missing_or_wrong_kind_of_path(cli, tmp_path, tiny_ckpt, tiny_onnx, writer, case):
    build, name, is_dir = WRITERS[writer]
    (tmp_path / "a-file").write_text("x")
    out = {"missing-parent": tmp_path / "no", "missing-grandparent": tmp_path / "no" / "deeper",
           "parent-is-a-file": tmp_path / "a-file", "folder-where-file-belongs": tmp_path}[case]
    if case == "folder-where-file-belongs":
        (out / name).mkdir() if not is_dir else (out / name).write_text("x")
    before = listing(tmp_path)
    argv = build(out, tiny_ckpt, tiny_onnx)
    message = cli(*argv).error_line(command_of(argv))
    if case == "parent-is-a-file":
        assert "a-file is a file, not a folder" in message
    elif case == "folder-where-file-belongs":
        assert ("is a file, not a folder" if is_dir else "is a folder, not a file name") in message
    else:
        assert "does not exist" in message and str(tmp_path / "no") in message
    assert listing(tmp_path) == before


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("mode", [0o555, 0o500, 0o111], ids=["r-x", "r--owner", "x-only"])
def test_read_only_folder_refused_first(cli, shared_tmp, unprivileged, tiny_ckpt, tiny_onnx, writer, mode):
    build, name, _ = WRITERS[writer]
    ro = shared_tmp / "ro"
    ro.mkdir()
    ro.chmod(mode)
    argv = build(ro, tiny_ckpt, tiny_onnx)
    with unprivileged():
        result = cli(*argv)
    message = result.error_line(command_of(argv))
    assert "permission denied" in message and str(ro) in message
    ro.chmod(0o755)
    assert list(ro.iterdir()) == []


def test_read_only_folder_deep_under_a_missing_one(cli, shared_tmp, unprivileged):
    """make-tiny creates missing parents: the nearest existing one must accept new files."""
    ro = shared_tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    with unprivileged():
        message = cli("make-tiny", ro / "a" / "b" / "ckpt").error_line("make-tiny")
    assert f"cannot write into folder {ro} (permission denied)" in message


def test_free_space_checked_before_the_export(cli, tmp_path, tiny_ckpt, monkeypatch):
    import gdn_export.paths as paths

    monkeypatch.setattr(paths, "free_bytes", lambda folder: 1 << 20)
    message = cli("export", tiny_ckpt, "-o", tmp_path / "m.onnx").error_line("export")
    assert "needs about" in message and "1.0 MiB free" in message
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ overwrite policy

@pytest.mark.parametrize("writer", list(WRITERS))
def test_existing_output_refused_without_overwrite(cli, tmp_path, tiny_ckpt, tiny_onnx, writer):
    build, name, is_dir = WRITERS[writer]
    target = tmp_path / name
    if is_dir:
        target.mkdir()
        (target / "config.json").write_text("{}")
    else:
        target.write_text("earlier")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    argv = build(tmp_path, tiny_ckpt, tiny_onnx)
    message = cli(*argv).error_line(command_of(argv))
    assert "exists" in message and "--overwrite" in message
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_export_refuses_an_existing_sidecar(cli, tmp_path, tiny_ckpt):
    (tmp_path / "m.onnx.data").write_text("weights of another export")
    message = cli("export", tiny_ckpt, "-o", tmp_path / "m.onnx").error_line("export")
    assert f"{tmp_path / 'm.onnx.data'} exists (pass --overwrite" in message


def test_overwrite_replaces_with_the_usual_modes(cli, tmp_path, tiny_ckpt, tiny_onnx):
    out = tmp_path / "l.npz"
    out.write_text("earlier")
    old = os.umask(0o022)
    try:
        result = cli("run", tiny_onnx, "--input-ids", "1,2", "--max-new-tokens", 1, "-q",
                     "--save-logits", out, "--overwrite")
        assert result.code == 0, result.err
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        os.umask(0o027)
        assert cli("run", tiny_onnx, "--input-ids", "1", "--max-new-tokens", 1, "-q",
                   "--save-logits", out, "--overwrite").code == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.npz"]  # no temporary left


def test_make_tiny_writes_the_usual_modes(cli, tmp_path):
    old = os.umask(0o022)
    try:
        assert cli("make-tiny", tmp_path / "ckpt").code == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [tmp_path / "ckpt", *(tmp_path / "ckpt").iterdir()]}
    assert modes == {"ckpt": 0o755, "config.json": 0o644, "model.safetensors": 0o644}


def test_validate_json_written_with_the_usual_mode(cli, tmp_path, tiny_ckpt, tiny_onnx):
    old = os.umask(0o022)
    try:
        result = cli("validate", tiny_ckpt, "--onnx", tiny_onnx, "--json", tmp_path / "r.json", "-q",
                     "--batch", 1, "--prompt-len", 3, "--decode-steps", 1)
    finally:
        os.umask(old)
    assert result.code == 0, result.err
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644


# ------------------------------------------------------------------ unreadable inputs

@pytest.mark.parametrize("what,fragment", [
    ("model.safetensors", "cannot read the safetensors file (permission denied)"),
    ("config.json", "cannot read the config file (permission denied)"),
    (".", "cannot read the checkpoint folder (permission denied)"),
], ids=["safetensors-0000", "config-0000", "folder-not-listable"])
@pytest.mark.parametrize("command", ["export", "run", "bench", "validate"])
def test_unreadable_checkpoint_named_as_permission(cli, shared_tmp, unprivileged, tiny_ckpt, tiny_onnx,
                                                   what, fragment, command):
    ckpt = copy_checkpoint(tiny_ckpt, shared_tmp / "ckpt")
    (ckpt / what).chmod(0o311 if what == "." else 0o000)
    argv = {"export": ["export", ckpt, "-o", shared_tmp / "m.onnx"],
            "run": ["run", ckpt, "--input-ids", "1"],
            "bench": ["bench", ckpt, "--prompt-len", 2],
            "validate": ["validate", ckpt, "--onnx", tiny_onnx]}[command]
    if command == "validate":
        onnx = shared_tmp / "m.onnx"
        shutil.copy(tiny_onnx, onnx)
        onnx.chmod(0o644)
        argv[3] = onnx
    with unprivileged():
        message = cli(*argv).error_line(command)
    assert fragment in message and "No such file" not in message
    assert sorted(p.name for p in shared_tmp.iterdir()) == sorted(["ckpt"] + (["m.onnx"] if command == "validate" else []))


@pytest.mark.parametrize("command", ["run", "build", "validate"])
def test_unreadable_onnx_named_as_permission(cli, shared_tmp, unprivileged, tiny_ckpt, tiny_onnx, command):
    onnx = shared_tmp / "m.onnx"
    shutil.copy(tiny_onnx, onnx)
    onnx.chmod(0o000)
    argv = {"run": ["run", onnx, "--input-ids", "1"],
            "build": ["build", onnx, "-o", shared_tmp / "m.engine"],
            "validate": ["validate", tiny_ckpt, "--onnx", onnx]}[command]
    if command == "validate":
        argv[1] = copy_checkpoint(tiny_ckpt, shared_tmp / "ckpt")
    with unprivileged():
        message = cli(*argv).error_line(command)
    assert f"{onnx}: cannot read the ONNX file (permission denied)" in message


# ------------------------------------------------------------------ weight dtypes

REFUSED_DTYPES = {
    "int8": (torch.int8, "I8 (int8)"), "int32": (torch.int32, "I32 (int32)"),
    "int64": (torch.int64, "I64 (int64)"), "int16": (torch.int16, "I16 (int16)"),
    "uint8": (torch.uint8, "U8 (uint8)"), "bool": (torch.bool, "BOOL (bool)"),
    "float8_e4m3fn": (torch.float8_e4m3fn, "F8_E4M3 (float8_e4m3fn)"),
    "float8_e5m2": (torch.float8_e5m2, "F8_E5M2 (float8_e5m2)"),
}


@pytest.mark.parametrize("tensor", ["model.embed_tokens.weight", "model.layers.0.linear_attn.A_log",
                                    "model.norm.weight"], ids=["embedding", "A_log", "final-norm"])
@pytest.mark.parametrize("dtype", list(REFUSED_DTYPES))
def test_weight_dtype_refused_by_name(cli, tmp_path, tiny_ckpt, tensor, dtype):
    torch_dtype, shown = REFUSED_DTYPES[dtype]
    ckpt = copy_checkpoint(tiny_ckpt, tmp_path / "ckpt", {tensor: torch_dtype})
    for argv in (["export", ckpt, "-o", tmp_path / "m.onnx"], ["run", ckpt, "--input-ids", "1"]):
        message = cli(*argv).error_line(argv[0])
        assert f"tensor {tensor} is stored as {shown}" in message and "cannot take" in message
    if dtype.startswith("float8"):
        assert "quantization_config" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_float64_weights_load_as_the_float32_values(tmp_path, tiny_ckpt):
    from gdn_export.weights import load_checkpoint

    name = "model.layers.0.linear_attn.A_log"
    ckpt = copy_checkpoint(tiny_ckpt, tmp_path / "ckpt", {name: torch.float64})
    got = dict(load_checkpoint(ckpt, dtype="float32").named_parameters())
    want = dict(load_checkpoint(tiny_ckpt, dtype="float32").named_parameters())
    assert torch.equal(got[name], want[name])


def test_dtype_check_takes_a_per_tensor_set():
    """The hook FP8 checkpoints use: one tensor may be F8_E4M3, the others only floats."""
    from gdn_export.errors import CheckpointError
    from gdn_export.weights.dtypes import FLOAT_DTYPES, check_tensor_dtypes

    allowed = lambda name: FLOAT_DTYPES | {"F8_E4M3"} if name == "w" else FLOAT_DTYPES  # noqa: E731
    check_tensor_dtypes({"w": "F8_E4M3", "s": "F32"}, allowed)
    with pytest.raises(CheckpointError, match=r"tensor s is stored as F8_E4M3"):
        check_tensor_dtypes({"w": "F8_E4M3", "s": "F8_E4M3"}, allowed, "ckpt")


# ------------------------------------------------------------------ strict --input-ids

@pytest.mark.parametrize("ids,fragment", [
    ("1,,2", "the 2. token id is empty"),
    ("1,2,,,3", "the 3. token id is empty"),
    ("1,2,", "the last token id is empty"),
    (",1", "the first token id is empty"),
    ("1, 2", "got ' 2' (no spaces"),
    ("1 ,2", "got '1 ' (no spaces"),
    ("1 2 3", "got '1 2 3' (no spaces"),
    (" 7", "got ' 7' (no spaces"),
    ("1\t2", "token ids must be integers"),
    ("1;2", "got '1;2'"),
    ("0x10", "got '0x10'"),
    ("+1", "got '+1'"),
    ("1.0", "got '1.0'"),
    ("1e3", "got '1e3'"),
    ("one", "got 'one'"),
    ("\u0661", "got '\u0661'"),
    ("-1", "token ids must be >= 0, got '-1'"),
    ("3,-20", "token ids must be >= 0, got '-20'"),
    ("", "is empty"),
    (",", "',' is empty"),
], ids=["double-comma", "triple-comma", "trailing-comma", "leading-comma", "space-after-comma",
        "space-before-comma", "space-separated", "leading-space", "tab", "semicolon", "hex", "plus-sign",
        "float", "exponent", "word", "arabic-indic-digit", "negative", "negative-later", "empty", "comma"])
def test_input_ids_strict(cli, tiny_onnx, ids, fragment):
    message = cli("run", tiny_onnx, "--input-ids", "1,2", "--input-ids", ids).error_line("run")
    assert fragment in message and repr(ids) in message


# ------------------------------------------------------------------ bounded generation

def test_generation_longer_than_memory_refused_with_numbers(cli, tiny_ckpt):
    message = cli("run", tiny_ckpt, "--input-ids", "1,2,3", "--max-new-tokens", 10**10).error_line("run")
    assert "10000000000 new tokens: needs" in message and "available" in message and "GiB" in message


@pytest.mark.parametrize("rows,new", [(1, 300), (4, 40), (2, 1), (3, 0)],
                         ids=["long", "batch", "short-batch", "prefill-only"])
def test_generation_bound_is_exact(cli, tiny_ckpt, monkeypatch, rows, new):
    """Refused with one byte less than the states, the K/V cache and the kept logits need; run
    with exactly that much."""
    import numpy as np

    import gdn_export.runtime.memory as memory
    from gdn_export.cli.run import _torch_layout
    from gdn_export.runtime.torch_runner import TorchRunner
    from gdn_export.weights import load_checkpoint

    prompts = [np.array([1, 2, 3])] * rows
    model = load_checkpoint(tiny_ckpt)
    model.layout = _torch_layout(prompts, new)
    need = sum(memory.generation_bytes(TorchRunner(model), prompts, new))
    argv = ["run", tiny_ckpt, "--max-new-tokens", new, "-q"] + ["--input-ids", "1,2,3"] * rows
    monkeypatch.setattr(memory, "cpu_available_bytes", lambda: need - 1)
    message = cli(*argv).error_line("run")
    assert f"{new} new tokens: needs" in message and "but cpu has" in message
    monkeypatch.setattr(memory, "cpu_available_bytes", lambda: need)
    result = cli(*argv)
    assert result.code == 0, result.err
    assert len(result.out.splitlines()) == rows


def test_generate_refuses_before_allocating(tiny_ckpt, monkeypatch):
    import numpy as np

    import gdn_export.runtime.memory as memory
    from gdn_export.errors import InputError
    from gdn_export.runtime.base import generate
    from gdn_export.runtime.torch_runner import TorchRunner
    from gdn_export.weights import load_checkpoint

    runner = TorchRunner(load_checkpoint(tiny_ckpt))
    monkeypatch.setattr(runner, "empty_states", lambda b: pytest.fail("allocated before the check"))
    monkeypatch.setattr(memory, "cpu_available_bytes", lambda: 1 << 16)
    with pytest.raises(InputError, match="needs .* available"):
        generate(runner, np.array([[1, 2, 3]]), 1000)


# ------------------------------------------------------------------ --help

def _subparsers(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.parametrize("command", sorted(_subparsers(make_parser())))
def test_every_flag_has_help_with_its_default(command):
    sub = _subparsers(make_parser())[command]
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{command} {action.option_strings or action.dest}: no help text"
        shown = sub.formatter_class("x")._get_help_string(action) % {"default": action.default}
        needs_default = action.option_strings and not action.required and \
            not isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if needs_default:
            assert "default" in shown, f"{command} {action.option_strings[0]}: help names no default: {shown!r}"


def test_top_level_description_names_the_families():
    text = make_parser().format_help().replace("\n", " ")
    for name in ("Qwen3-Next", "Qwen3.5", "OLMo-Hybrid", "VL"):
        assert name in text


# ------------------------------------------------------------------ more output mistakes

@pytest.mark.parametrize("writer", ["export", "run-save-logits", "validate-json", "bench-json", "build"])
def test_file_name_too_long_for_the_file_system(cli, tmp_path, tiny_ckpt, tiny_onnx, writer):
    """A name the final rename would reject (255 bytes on ext4) is refused first."""
    build, name, _ = WRITERS[writer]
    stem, suffix = os.path.splitext(name)
    long_name = "n" * (os.pathconf(tmp_path, "PC_NAME_MAX") - len(suffix) - 2) + suffix
    argv = [str(a).replace(str(tmp_path / name), str(tmp_path / long_name))
            for a in build(tmp_path, tiny_ckpt, tiny_onnx)]
    message = cli(*argv).error_line(command_of(argv))
    assert "the file name is" in message and "allows" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--json", "--save-logits"])
def test_a_device_is_never_replaced(cli, tiny_ckpt, tiny_onnx, flag):
    argv = (["bench", tiny_ckpt, "--json", "/dev/null", "--overwrite"] if flag == "--json" else
            ["run", tiny_onnx, "--input-ids", "1", "--save-logits", "/dev/null", "--overwrite"])
    message = cli(*argv).error_line(argv[0])
    assert "/dev/null: is not a regular file" in message
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("argv", [
    ["run", "m.onnx", "--input-ids", "1", "--max-new-tokens", "1e3"],
    ["run", "m.onnx", "--input-ids", "1", "--max-new-tokens", ""],
    ["run", "m.onnx", "--input-ids", "1", "--dtype", "float64"],
    ["export", "ckpt", "-o", "m.onnx", "--state-dtype", "int8"],
    ["bench", "ckpt", "--batch", "two"],
    ["make-tiny", "d", "--shards", "1.5"],
    ["validate", "ckpt", "--onnx", "m.onnx", "--no-such-flag"],
    ["build", "m.onnx"],
], ids=["exponent-int", "empty-int", "dtype-float64", "state-dtype-int8", "word-int", "float-int",
        "unknown-flag", "missing-required"])
def test_usage_mistakes_are_one_line_naming_the_command(cli, argv):
    message = cli(*argv).error_line(argv[0])
    assert f"see gdn-export {argv[0]} --help" in message


@pytest.mark.parametrize("args", [["--prompt-len", 10**8, "--batch", 64], ["--decode-steps", 10**10]],
                         ids=["long-prompts", "many-steps"])
def test_bench_bound_before_loading(cli, tiny_ckpt, args):
    """bench sizes its states from config.json on the meta device: refused before the first
    progress line, so the error is the only stderr line."""
    message = cli("bench", tiny_ckpt, *args).error_line("bench")
    assert "needs" in message and "available; lower --batch, --prompt-len or --decode-steps" in message


# ------------------------------------------------------------------ inputs that are not files

@pytest.mark.parametrize("where", ["config", "safetensors", "onnx", "calib"])
def test_a_pipe_is_refused_not_opened(cli, tmp_path, tiny_ckpt, where):
    """Opening a FIFO for reading waits for a writer for ever: refused by its kind instead."""
    fifo = tmp_path / {"config": "ck/config.json", "safetensors": "ck/model.safetensors",
                       "onnx": "m.onnx", "calib": "ids.txt"}[where]
    if where in ("config", "safetensors"):
        (tmp_path / "ck").mkdir()
        keep = "model.safetensors" if where == "config" else "config.json"
        shutil.copy(tiny_ckpt / keep, tmp_path / "ck" / keep)
    os.mkfifo(fifo)
    argv = {"config": ["run", tmp_path / "ck", "--input-ids", "1,2"],
            "safetensors": ["export", tmp_path / "ck", "-o", tmp_path / "x.onnx"],
            "onnx": ["run", fifo, "--input-ids", "1,2"],
            "calib": ["quantize", tiny_ckpt, "-o", tmp_path / "q", "--format", "fp8", "--calib-data", fifo]}[where]
    message = cli(*argv).error_line(argv[0])
    assert f"{fifo}: is not a regular file (a device, pipe or socket)" in message
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "q").exists()


# ------------------------------------------------------------------ folders make-tiny fills in place

def test_make_tiny_into_the_current_folder(cli, tmp_path, monkeypatch):
    """"." has no name to rename by, and the shell stands in it: the checkpoint is written into it."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert cli("make-tiny", ".").code == 0
    assert listing(tmp_path / "here") == ["config.json", "model.safetensors"]
    assert cli("make-tiny", ".", "--overwrite", "--shards", "2", "--family", "olmo_hybrid").code == 0
    assert listing(tmp_path / "here") == ["config.json", "model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert listing(tmp_path) == ["here", *(f"here/{n}" for n in listing(tmp_path / "here"))]


def test_make_tiny_into_a_mount_point(cli, tmp_path):
    """A mount point cannot be renamed and its siblings sit on another file system: filled in place
    (read-only: refused first)."""
    import subprocess

    point = tmp_path / "mnt"
    point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        assert cli("make-tiny", point).code == 0
        assert listing(point) == ["config.json", "model.safetensors"]
        subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        assert "read-only file system" in cli("make-tiny", point / "sub").error_line("make-tiny")
    finally:
        subprocess.run(["umount", str(point)], check=True)


# ------------------------------------------------------------------ values no command can honour

@pytest.mark.parametrize("argv,fragment", [
    (["make-tiny", "{tmp}/t", "--seed", "-1"], "argument --seed: must be in [0, 2**63 - 1], got -1"),
    (["make-tiny", "{tmp}/t", "--seed", str(10**20)], "argument --seed: must be in [0, 2**63 - 1]"),
    (["demo", "--seed", "-1"], "argument --seed: must be in [0, 2**63 - 1]"),
    (["validate", "{ckpt}", "--onnx", "{onnx}", "--seed", "x"], "argument --seed: must be an integer, got 'x'"),
    (["validate", "{ckpt}", "--onnx", "{onnx}", "--rtol", "nan"], "tolerances must be numbers >= 0"),
    (["validate", "{ckpt}", "--onnx", "{onnx}", "--batch", "100000", "--prompt-len", "10000000"],
     "token ids need 7450.58 GiB"),
    (["validate", "{ckpt}", "--onnx", "{onnx}", "--prompt-len", "100", "--decode-steps", "10000"],
     "--prompt-len 100 + --decode-steps 10000 = 10100 tokens exceed the cache of 4096 slots"),
    (["validate", "{ckpt}", "--onnx", "{onnx}", "--baseline", "{ckpt}"],
     "--baseline applies to a quantized checkpoint"),
    (["validate", "{ckpt}", "--onnx", "{onnx}", "--quant-tol", "0.5"],
     "--quant-tol applies to a quantized checkpoint"),
    (["validate", "{ckpt}", "--onnx", "{onnx}", "--quant-tol", "nan"], "--quant-tol must be a number >= 0, got nan"),
    (["bench", "--runtime", "ort", "--onnx", "{onnx}", "--dtype", "fp16"],
     "--dtype applies to --runtime torch only (an exported file keeps the precision it was exported in)"),
    (["export", "{ckpt}", "-o", "{tmp}/x.onnx", "--max-cache-len", str(10**13)],
     "--max-cache-len 10000000000000: tracing the export holds an example K/V cache (batch 2, inputs and "
     "outputs) whose tensors need 9536743.16 GiB, but the host has"),
    (["export", "{ckpt}", "-o", "{tmp}/x.onnx", "--kv-cache", "concat", "--max-cache-len", "64"],
     "--max-cache-len sizes the inplace K/V cache"),
    (["build", "{onnx}", "-o", "{tmp}/x.onnx"], "an engine file name must end in .engine / .plan / .trt"),
    (["bench", "{ckpt}", "--quant-steps", "-1"], "--quant-steps applies with --quant only"),
    (["bench", "{ckpt}", "--calib-samples", "3"], "--calib-samples applies with --quant only"),
    (["bench", "{ckpt}", "--runtime", "ort", "--onnx", "{onnx}"], "drop the checkpoint argument"),
    (["run", "{tmp}/dir.onnx", "--input-ids", "1"], "dir.onnx: is a folder, expected an ONNX file"),
], ids=["seed-negative", "seed-huge", "demo-seed", "seed-text", "rtol-nan", "validate-ids-memory",
        "validate-past-the-cache", "baseline-unquantized", "quant-tol-unquantized", "quant-tol-nan",
        "bench-ort-dtype", "export-cache-memory", "concat-cache-len",
        "build-onnx-suffix", "bench-quant-steps-alone", "bench-calib-alone", "bench-ort-checkpoint",
        "run-folder-named-onnx"])
def test_values_refused_before_the_work(cli, tmp_path, tiny_ckpt, tiny_onnx, argv, fragment):
    (tmp_path / "dir.onnx").mkdir()
    fill = [str(a).format(tmp=tmp_path, ckpt=tiny_ckpt, onnx=tiny_onnx) for a in argv]
    before = listing(tmp_path)
    result = cli(*fill)
    assert fragment in result.error_line(fill[0])
    assert listing(tmp_path) == before
