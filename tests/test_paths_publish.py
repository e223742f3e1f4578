"""The last step of every writer (gdn_export.paths): a finished file or folder is moved to its name
without ever replacing what another run put there meanwhile, unless overwrite; the loser's
temporary files go, the winner's output stays as it is."""

from __future__ import annotations

import errno
import os

import pytest

from gdn_export import paths
from gdn_export.errors import OutputError


def _tmp(folder, text="ours"):
    tmp = folder / ".out.tmp"
    tmp.write_text(text)
    return tmp


def test_a_file_that_appeared_is_kept(tmp_path):
    (tmp_path / "out").write_text("theirs")
    with pytest.raises(OutputError, match=r"out appeared while this command ran .* pass --overwrite"):
        paths.publish_file(_tmp(tmp_path), tmp_path / "out", "-o out")
    assert (tmp_path / "out").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_overwrite_replaces(tmp_path):
    (tmp_path / "out").write_text("theirs")
    paths.publish_file(_tmp(tmp_path), tmp_path / "out", overwrite=True)
    assert (tmp_path / "out").read_text() == "ours" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_new_name_gets_the_file(tmp_path):
    paths.publish_file(_tmp(tmp_path), tmp_path / "out")
    assert (tmp_path / "out").read_text() == "ours" and [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("existing", [False, True])
def test_without_hard_links_the_name_is_claimed_exclusively(tmp_path, monkeypatch, existing):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    if existing:
        (tmp_path / "out").write_text("theirs")
        with pytest.raises(OutputError, match="appeared while this command ran"):
            paths.publish_file(_tmp(tmp_path), tmp_path / "out")
        assert (tmp_path / "out").read_text() == "theirs"
    else:
        paths.publish_file(_tmp(tmp_path), tmp_path / "out")
        assert (tmp_path / "out").read_text() == "ours"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_publish_files_takes_back_its_own_when_a_later_one_lost(tmp_path):
    (tmp_path / "model.onnx").write_text("theirs")
    data, onnx = tmp_path / ".d.tmp", tmp_path / ".m.tmp"
    data.write_text("weights")
    onnx.write_text("graph")
    with pytest.raises(OutputError):
        paths.publish_files([(data, tmp_path / "model.onnx.data"), (onnx, tmp_path / "model.onnx")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert (tmp_path / "model.onnx").read_text() == "theirs"


def _folder(parent, name=".new"):
    tmp = parent / name
    tmp.mkdir()
    (tmp / "config.json").write_text("ours")
    return tmp


def test_a_folder_that_appeared_is_kept(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("theirs")
    with pytest.raises(OutputError, match="appeared while this command ran"):
        paths.publish_dir(_folder(tmp_path), tmp_path / "ckpt", "-o ckpt")
    assert (tmp_path / "ckpt" / "config.json").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.parametrize("before", ["none", "empty", "full"])
def test_a_folder_is_published_onto_nothing_an_empty_folder_or_with_overwrite(tmp_path, before):
    target = tmp_path / "ckpt"
    if before != "none":
        target.mkdir()
    if before == "full":
        (target / "old.bin").write_text("old")
    paths.publish_dir(_folder(tmp_path), target, overwrite=before == "full")
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_atomic_file_keeps_a_file_that_appeared(tmp_path):
    target = tmp_path / "report.json"
    with pytest.raises(OutputError, match="appeared"):
        with paths.atomic_file(target, overwrite=False) as tmp:
            tmp.write_text("ours")
            target.write_text("theirs")
    assert target.read_text() == "theirs" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_temp_dir_beside_has_the_usual_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        tmp = paths.temp_dir_beside(tmp_path / "out")
        (tmp / "f").write_text("x")
        (tmp / "f").chmod(0o600)
        paths.usual_modes(tmp)
    finally:
        os.umask(umask)
    assert oct(tmp.stat().st_mode & 0o777) == oct(0o755) and oct((tmp / "f").stat().st_mode & 0o777) == oct(0o644)
    assert tmp.parent == tmp_path and tmp.name.startswith(".out.")


def test_describe_folder_names_the_largest_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 3000)
    assert paths.describe_folder(tmp_path) == f"{tmp_path} (2 files, 2.9 KiB: the largest model.safetensors 2.9 KiB)"
