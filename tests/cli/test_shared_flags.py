"""Every flag several subcommands share (--device, --op-backend, --dtype, --seed, --plugins) is
declared once, in gdn_export/cli/args.py, with one default, and every subcommand's --help
documents it with that default; --op-backend's choices are the backend registry's."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from gdn_export.cli.main import SUBCOMMANDS, _subparser, make_parser

CLI = Path(__file__).resolve().parents[2] / "gdn_export" / "cli"
DEFAULTS = {
    "--device": "(default: cpu)",
    "--op-backend": "(default: $GDN_EXPORT_BACKEND, else reference on the CPU and triton on CUDA)",
    "--dtype": "(default: fp32 for a checkpoint; an exported model keeps the precision it was exported in)",
    "--seed": "(default: 0)",
    "--plugins": "(default: $GDN_EXPORT_PLUGINS, then plugins/build/libgdn_plugins.so;",
}
TAKES = {
    "demo": {"--seed"}, "make-tiny": {"--seed"}, "quantize": {"--device"}, "export": {"--dtype"},
    "build": {"--plugins"}, "run": {"--dtype", "--device", "--op-backend", "--plugins", "--seed"},
    "validate": {"--dtype", "--device", "--seed", "--plugins"},
    "bench": {"--device", "--op-backend", "--dtype", "--seed"},
    "serve": {"--device", "--op-backend", "--dtype", "--seed"},
}


def _commands():
    return [m.__name__.rpartition(".")[2].replace("_", "-") for m in SUBCOMMANDS]


def test_every_subcommand_is_listed():
    assert sorted(TAKES) == sorted(_commands())


@pytest.mark.parametrize("command", sorted(TAKES))
def test_help_documents_each_shared_flag_with_its_one_default(command):
    sub = _subparser(make_parser(), command)
    text = " ".join(sub.format_help().split())
    actions = {opt: a for a in sub._actions for opt in a.option_strings}
    assert {flag for flag in DEFAULTS if flag in actions} == TAKES[command]
    for flag in TAKES[command]:
        assert flag in text
        help_text = " ".join(sub._get_formatter()._expand_help(actions[flag]).split())
        assert DEFAULTS[flag] in help_text, (command, flag, help_text)
        assert f"{flag} " in text and help_text[:40] in text  # rendered in --help, not only declared


def test_shared_flags_are_declared_only_in_args_py():
    found = []
    for path in sorted(CLI.glob("*.py")):
        if path.name == "args.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                names = [a.value for a in node.args if isinstance(a, ast.Constant)]
                found += [f"{path.name}:{node.lineno} {n}" for n in names if n in DEFAULTS]
    assert not found, f"declare shared flags through gdn_export.cli.args: {found}"


def test_op_backend_choices_are_the_registry(monkeypatch, capsys):
    from gdn_export.ops import backends

    monkeypatch.setitem(backends._MODULES, "mine", "some.module")
    action = next(a for a in _subparser(make_parser(), "run")._actions if "--op-backend" in a.option_strings)
    assert list(action.choices) == backends.names() and "mine" in action.choices
    parser = make_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "m.onnx", "--input-ids", "1", "--op-backend", "nope"])
    err = capsys.readouterr().err.strip()
    assert err.endswith("argument --op-backend: invalid choice: 'nope' (choose from 'reference', 'triton', "
                        "'cuda', 'mine') (see gdn-export run --help)")


@pytest.mark.parametrize("given, env, device, want", [
    ("cuda", None, "cpu", "cuda"), (None, None, "cpu", "reference"), (None, None, "cuda:1", "triton"),
    (None, "triton", "cpu", None)])
def test_one_default_for_op_backend(monkeypatch, given, env, device, want):
    from gdn_export.cli.args import op_backend_of

    if env:
        monkeypatch.setenv("GDN_EXPORT_BACKEND", env)
    else:
        monkeypatch.delenv("GDN_EXPORT_BACKEND", raising=False)
    assert op_backend_of(argparse.Namespace(op_backend=given), device) == want
