"""The documentation's relative links resolve and its command lines are real.

Pages: README.md, CONTRIBUTING.md, CHANGELOG.md, docs/**/*.md, plugins/**/README.md and
benchmarks/README.md. Every relative link (inline `[text](target)` and reference definitions
`[label]: target`, outside code) names a file or folder that exists, and a `#anchor` names a heading
of the markdown file it points into (GitHub's slugs). Every `gdn-export SUBCOMMAND ...` (or
`python -m gdn_export SUBCOMMAND ...`) in a code block or inline code names a subcommand of
gdn_export.cli.main's parser and only flags that subcommand's parser knows; placeholders (`...`,
CHECKPOINT, `<folder>`) and shell comments are not read as flags.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from gdn_export.cli.main import make_parser

ROOT = Path(__file__).resolve().parents[1]


def doc_files(root: Path = ROOT) -> list[Path]:
    files = [root / "README.md", root / "CONTRIBUTING.md", root / "CHANGELOG.md", root / "benchmarks/README.md"]
    files += sorted((root / "docs").rglob("*.md")) + sorted((root / "plugins").rglob("README.md"))
    return [f for f in files if f.is_file() and "build" not in f.relative_to(root).parts]


# --- markdown structure -------------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def split_code(text: str) -> tuple[list[str], list[str]]:
    """(prose lines with code blocks blanked, code block lines): fenced blocks, and indented blocks
    (4 spaces after a blank line, outside a list)."""
    prose, code = [], []
    fence = None
    prev_blank, in_list, in_indented = True, False, False
    for line in text.splitlines():
        if fence:
            if line.strip().startswith(fence):
                fence = None
            else:
                code.append(line)
            prose.append("")
            continue
        m = FENCE.match(line)
        if m:
            fence = m.group(1)[0] * len(m.group(1))
            prose.append("")
            continue
        indented = line.startswith("    ") and line.strip()
        if indented and (in_indented or (prev_blank and not in_list)):
            in_indented = True
            code.append(line)
            prose.append("")
            continue
        if line.strip():
            in_indented = False
            if re.match(r"^\s*([-*+]|\d+[.)])\s", line):
                in_list = True
            elif not line.startswith(" "):
                in_list = False
        prev_blank = not line.strip()
        prose.append(line)
    return prose, code


def paragraphs(lines: list[str]) -> list[str]:
    return [p for p in "\n".join(lines).split("\n\n") if p.strip()]


CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def inline_code(prose: list[str]) -> list[str]:
    return [m.group(2).replace("\n", " ") for p in paragraphs(prose) for m in CODE_SPAN.finditer(p)]


def without_inline_code(prose: list[str]) -> str:
    return "\n\n".join(CODE_SPAN.sub(lambda m: " " * len(m.group(0)), p) for p in paragraphs(prose))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: link text kept, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return out


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def links(text: str) -> list[str]:
    prose, _ = split_code(text)
    body = without_inline_code(prose)
    return [m.group(1) for m in LINK.finditer(body)] + REF_DEF.findall(body)


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-zA-Z][\w+.-]*:", target) or target.startswith("//"):
            continue  # a URL (http:, mailto:, ...)
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path.resolve()
        try:
            rel = dest.relative_to(root.resolve()).as_posix()
        except ValueError:
            problems.append(f"{target}: outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{target}: no such file ({rel})")
            continue
        if anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {rel}")
    return problems


# --- command lines ------------------------------------------------------------------------------

COMMAND = re.compile(r"(?:(?<![\w.-])gdn-export|-m\s+gdn_export)(?=\s|$)(.*)")


def command_lines(text: str) -> list[str]:
    """The text after each `gdn-export` / `-m gdn_export` in the code blocks and inline code, up to
    the end of its (backslash-joined) line, a shell comment or the next shell command."""
    prose, code = split_code(text)
    chunks = inline_code(prose) + "\n".join(code).replace("\\\n", " ").splitlines()
    out = []
    for chunk in chunks:
        for m in COMMAND.finditer(chunk):
            rest = re.split(r"(?:^|\s)#|&&|;|\s\|\s|\|\||`", m.group(1))[0]
            out.append(rest.strip())
    return out


def _is_placeholder(word: str) -> bool:
    return not word or word.isupper() or not re.fullmatch(r"[a-z][a-z0-9-]*", word)


def command_problems(rest: str, parser: argparse.ArgumentParser) -> list[str]:
    sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    words = rest.split()
    if not words:
        return []
    first = words[0]
    if first.startswith("-"):  # gdn-export --help / --version
        cmd, sub, args = "gdn-export", parser, words
    elif _is_placeholder(first):
        return []
    elif first not in sub_action.choices:
        return [f"gdn-export {rest}: no subcommand {first!r}"]
    else:
        cmd, sub, args = f"gdn-export {first}", sub_action.choices[first], words[1:]
    known = {opt for a in sub._actions for opt in a.option_strings}
    problems = []
    for word in args:
        word = word.strip("[](){},'\"")
        for part in re.split(r"[/|]", word):
            part = part.split("=")[0].rstrip(".,:;")
            if not re.fullmatch(r"--?[a-zA-Z][\w-]*", part):
                continue  # a value, a placeholder (`...`, --trt-*-shapes), `--`
            if part not in known:
                problems.append(f"{cmd}: no flag {part} (in `{rest}`)")
    return problems


@pytest.fixture(scope="module")
def parser():
    return make_parser()


DOCS = doc_files()


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "benchmarks/README.md",
            "plugins/README.md", "docs/onnx.md", "docs/perf/README.md"} <= names, names


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    problems = link_problems(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_command_lines_use_real_subcommands_and_flags(page, parser):
    problems = [p for rest in command_lines(page.read_text(encoding="utf-8")) for p in command_problems(rest, parser)]
    assert not problems, "\n".join(problems)


# --- the checks themselves ----------------------------------------------------------------------

def test_the_link_check_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n\n## The `--x` flag (new)\n\n## Title\n")
    page = tmp_path / "docs" / "a.md"
    page.write_text(
        "# A\n\n[ok](b.md) [ok](b.md#title-1) [ok](b.md#the---x-flag-new) [self](#a) [web](https://x.y/z)\n"
        "[gone](c.md) [bad anchor](b.md#nope) [bad self](#b)\n"
        "`[in code](nowhere.md)`\n\n```\n[in a block](nowhere.md)\n```\n\n[ref]: missing.md\n")
    problems = link_problems(page, root=tmp_path)
    assert problems == ["c.md: no such file (docs/c.md)", "b.md#nope: no heading #nope in docs/b.md",
                        "#b: no heading #b in docs/a.md", "missing.md: no such file (docs/missing.md)"], problems


def test_the_command_check_reads_code_and_ignores_placeholders(parser):
    text = ("Run `gdn-export export CHECKPOINT -o model.onnx --dtype fp16` and `gdn-export frobnicate`.\n\n"
            "```bash\ngdn-export build model.onnx -o m.engine \\\n    --no-such-flag   # --also-not-read\n"
            "gdn-export run m.engine --input-ids 1,2 [--trt-*-shapes] ... && other --xyz\n"
            "gdn-export serve --port 8000\n```\n\n"
            "    python3 -m gdn_export bench $CK --batch 1 --bogus\n")
    rests = command_lines(text)
    assert rests == ["export CHECKPOINT -o model.onnx --dtype fp16", "frobnicate",
                     "build model.onnx -o m.engine      --no-such-flag", "run m.engine --input-ids 1,2 [--trt-*-shapes] ...",
                     "serve --port 8000", "bench $CK --batch 1 --bogus"], rests
    problems = [p for r in rests for p in command_problems(r, parser)]
    assert [p.split(" (in")[0] for p in problems] == [
        "gdn-export frobnicate: no subcommand 'frobnicate'", "gdn-export build: no flag --no-such-flag",
        "gdn-export bench: no flag --bogus"], problems
