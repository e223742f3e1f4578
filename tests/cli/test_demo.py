"""`gdn-export demo --keep DIR` mistakes end before any work (the demo itself runs in CI as
`gdn-export demo`; it takes ~15 s, so it is not repeated here)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("keep,fragment", [
    ("a-file", "a-file is a file, not a folder"),
    ("a-file/sub", "a-file is a file, not a folder"),
    ("taken", "taken/tiny-qwen3_5: exists and is not empty (pass --overwrite"),
], ids=["keep-is-a-file", "keep-under-a-file", "someone-elses-folder-in-the-way"])
def test_keep_target_in_the_way(cli, tmp_path, keep, fragment):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "taken" / "tiny-qwen3_5").mkdir(parents=True)
    (tmp_path / "taken" / "tiny-qwen3_5" / "notes.txt").write_text("keep me")
    result = cli("demo", "--keep", tmp_path / keep)
    assert fragment in result.error_line("demo")
    assert (tmp_path / "taken" / "tiny-qwen3_5" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "taken"]


def test_unwritable_temporary_folder_is_one_line(cli, monkeypatch):
    import tempfile

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", refuse)
    result = cli("demo")
    assert result.code == 2
    line = result.error_line("demo")
    assert "cannot create a temporary folder in" in line and "Permission denied" in line and "TMPDIR" in line
