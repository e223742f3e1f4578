"""The samples run, and the README's command lines name real subcommands and flags."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gdn_export.cli.main import make_parser

ROOT = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_python_api_sample(tmp_path):
    out = subprocess.run([sys.executable, ROOT / "samples/python_api.py", tmp_path], env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch tokens" in out.stdout and "ort   tokens" in out.stdout


def test_shell_sample(tmp_path):
    out = subprocess.run(["bash", ROOT / "samples/export_and_validate.sh", tmp_path], env=_env(),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "PASS" in out.stdout
    assert (tmp_path / "report.json").is_file() and (tmp_path / "ort.npz").is_file()


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        for m in re.finditer(r"gdn-export ([a-z-]+)([^`|\n]*)", line):
            yield m.group(1), m.group(2)


def _subparsers():
    parser = make_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


@pytest.mark.parametrize("sub,rest", sorted(set(_readme_commands())), ids=lambda x: x[:40])
def test_readme_command_lines_use_real_flags(sub, rest):
    subs = _subparsers()
    if sub == "demo" and not rest.strip():
        return
    assert sub in subs, f"README mentions unknown subcommand {sub!r}"
    known = {opt for a in subs[sub]._actions for opt in a.option_strings}
    for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
        assert flag in known, f"README: `gdn-export {sub}` has no flag {flag}"
