"""Top-level behaviour: --version, --help of every subcommand, and what a user mistake looks like
from a real process (exit status, one stderr line, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gdn_export import __version__
from gdn_export.cli.main import main

SUBCOMMANDS = ("demo", "make-tiny", "export", "build", "run", "validate")


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gdn-export {__version__}"


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_of_each_subcommand(capsys, command):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gdn-export {command} ")
    assert "-h, --help" in out


def test_top_level_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in SUBCOMMANDS)


@pytest.mark.parametrize("argv,prefix", [
    ([], "gdn-export"), (["frobnicate"], "gdn-export"), (["run", "x.onnx"], "gdn-export run"),
    (["export", "ckpt"], "gdn-export export"), (["run", "x.onnx", "--input-ids", "1", "--bogus"], "gdn-export run"),
    (["run", "x.onnx", "--input-ids", "1", "--max-new-tokens", "ten"], "gdn-export run"),
    (["export", "ckpt", "-o", "m.onnx", "--dtype", "int8"], "gdn-export export"),
], ids=["no-command", "unknown-command", "run-without-ids", "export-without-o", "unknown-flag",
        "not-an-int", "bad-choice"])
def test_argparse_mistakes_exit_2(capsys, argv, prefix):
    """Usage mistakes too are one stderr line naming the command, exit 2 (main returns it)."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prefix}: error: "), lines


def _python_m(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "gdn_export", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv,command,fragment", [
    (["make-tiny", "{ckpt}"], "make-tiny", "exists and is not empty"),
    (["export", "{ckpt}", "-o", "no/such/folder/m.onnx"], "export", "does not exist"),
    (["run", "{onnx}", "--input-ids", "1,2,999"], "run", "token id 999 is out of range for vocab size 256"),
    (["validate", "{ckpt}"], "validate", "give --onnx and/or --engine"),
    (["build", "missing.onnx", "-o", "m.engine"], "build", "missing.onnx: no such ONNX file"),
], ids=["make-tiny-exists", "export-no-folder", "run-id-out-of-range", "validate-no-target",
        "build-no-onnx"])
def test_user_mistake_in_a_real_process(tmp_path, tiny_ckpt, tiny_onnx, argv, command, fragment):
    argv = [a.format(ckpt=tiny_ckpt, onnx=tiny_onnx) for a in argv]
    proc = _python_m(*argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"gdn-export {command}: error: ") and fragment in lines[0], lines[0]
    assert proc.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temp file


def test_interrupt_is_one_line_and_130(cli, monkeypatch, tmp_path):
    import gdn_export.cli.make_tiny as make_tiny

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(make_tiny, "run", interrupted)
    result = cli("make-tiny", tmp_path / "ckpt")
    assert result.code == 130 and result.err == "gdn-export make-tiny: interrupted\n"


def test_a_bug_keeps_its_traceback(cli, monkeypatch, tmp_path):
    """Only GdnExportError is a user mistake; anything else must propagate, not become exit 2."""
    import gdn_export.cli.make_tiny as make_tiny

    def buggy(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(make_tiny, "run", buggy)
    with pytest.raises(ZeroDivisionError):
        cli("make-tiny", tmp_path / "ckpt")


def test_the_script_ends_with_mains_status_and_every_line_written(tmp_path, tiny_ckpt):
    """`python -m gdn_export` (the console script's console_main) skips the interpreter's teardown: its
    exit status is main's, and what it printed arrives whole through a pipe (a long --help, the lines of
    a run: both flushed before the process ends)."""
    import gdn_export.cli.main as cli_main

    help_text = subprocess.run([sys.executable, "-m", "gdn_export", "export", "--help"], capture_output=True,
                               text=True, timeout=120)
    assert help_text.returncode == 0 and help_text.stderr == ""
    parser = cli_main.make_parser()
    want = cli_main._subparser(parser, "export").format_help()
    assert help_text.stdout.split() == want.split()  # the whole text (widths may differ: no terminal)
    ran = _python_m("run", tiny_ckpt, "--input-ids", "1,2,3", "--input-ids", "4", "--max-new-tokens", "2",
                    cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("\n") >= 2 and ran.stdout.endswith("\n")
    mistake = _python_m("run", tiny_ckpt, "--input-ids", "1,2,999", cwd=tmp_path)
    assert mistake.returncode == 2 and mistake.stderr.count("\n") == 1
