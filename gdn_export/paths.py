"""Paths the user gives: outputs checked before the work and written atomically with the usual
file modes; inputs checked for reading with the reason named (`check_readable`).

Every command that writes checks its output first (`check_output_file` / `check_output_dir`),
before any checkpoint is read, graph traced or token generated:

- the parent folder exists and is a folder, the path itself is not a folder (for a file) and not a
  file (for a folder);
- the folder accepts a new file: a probe file is created and removed there, so that a read-only
  folder, a read-only file system or a virtual one (/proc, /sys) is named now, with its reason
  ("permission denied", "read-only file system", "does not accept new files");
- an existing output is refused unless `overwrite` (the CLI's `--overwrite`): one policy for every
  command;
- where the size of the output is known up front (`need_bytes`), the folder's file system has that
  much free space.

Files are then written to a temporary name in the same folder and moved into place (`atomic_file`,
`publish_file`; folders: `temp_dir_beside`, `publish_dir`), so that nothing half-written is left
under the final name, with mode 0666 & ~umask for files and 0777 & ~umask for folders (0644 / 0755
under the usual umask 022) rather than the 0600 / 0700 of `tempfile.mkstemp` / `mkdtemp` and of the
safetensors writer (`usual_modes`).

The check before the work and the move after it are minutes apart, and another run may write the
same output meanwhile. Without `overwrite` the move never replaces what appeared: a file is linked
to its final name (`os.link` fails on an existing name; where the file system has no hard links, the
name is claimed by an exclusive create first), a folder is renamed onto its name (which fails on a
non-empty folder); the loser gets an OutputError and leaves the winner's output as it is.

Every failure is an `OutputError` (a GdnExportError: one line, exit 2 on the command line) whose
message starts with `what` (e.g. "-o model.onnx", "--save-logits out.npz").
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from gdn_export.errors import GdnExportError, OutputError

# Free space kept beyond an output's own size (file system metadata, temporary copies of small files).
SPACE_MARGIN = 16 << 20


def os_reason(exc: OSError) -> str:
    """A short reason for an OSError, the kind named first: "permission denied", "read-only file
    system", "no space left on device", ... (lower case, no errno number, no path)."""
    reasons = {errno.EACCES: "permission denied", errno.EPERM: "permission denied (operation not permitted)",
               errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on device",
               errno.EDQUOT: "disk quota exceeded", errno.ENOENT: "no such file or folder",
               errno.ENOTDIR: "a part of the path is not a folder", errno.EISDIR: "is a folder",
               errno.ENAMETOOLONG: "file name too long", errno.ELOOP: "too many symbolic links"}
    if exc.errno in reasons:
        return reasons[exc.errno]
    return (exc.strerror or type(exc).__name__).lower()


def check_readable(path: str | os.PathLike, what: str, folder: bool = False,
                   error: type[GdnExportError] = GdnExportError, missing: str = "{path}: {what} not found") -> None:
    """`error` unless `path` is a readable file (with folder: a listable folder), naming the reason:
    `missing` (formatted with path and what), "... is a folder, expected a <what>", "... is not a
    regular file" (a pipe, device or socket: never opened, a pipe would block), "cannot read the
    <what> (permission denied)". Unlike Path.is_file(), a permission problem is never read as "missing"."""
    path = Path(path)
    try:
        if folder:
            if not os.path.isdir(path) and path.exists():
                raise error(f"{path}: is a file, expected {_a(what)}")
            os.listdir(path)
        else:
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # opening a pipe would wait for a writer
                raise error(f"{path}: is not a regular file (a device, pipe or socket), expected {_a(what)}")
            with open(path, "rb"):
                pass
    except (FileNotFoundError, NotADirectoryError):
        raise error(missing.format(path=path, what=what)) from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, expected {_a(what)}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({os_reason(exc)})") from None


def _a(what: str) -> str:
    """'a folder', 'an ONNX file': the indefinite article for a message."""
    return f"{'an' if what[:1].lower() in 'aeiou' else 'a'} {what}"


def file_mode() -> int:
    """The mode a plain `open(path, "w")` would give a new file: 0666 & ~umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def dir_mode() -> int:
    """The mode `os.mkdir` would give a new folder: 0777 & ~umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o777 & ~umask


def _stat(path: Path, what: str) -> os.stat_result | None:
    """os.stat(path), None when nothing is there; other errors (permission) name the reason."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return None
        raise OutputError(f"{what}: cannot look at {path} ({os_reason(exc)})") from None


def check_folder_writable(folder: Path, what: str) -> None:
    """OutputError unless a new file can be created in `folder` (created and removed again)."""
    st = _stat(folder, what)
    if st is None:
        # The nearest existing ancestor says whether it is a typo or a file in the way.
        parent = folder
        while parent != parent.parent and _stat(parent, what) is None:
            parent = parent.parent
        if parent.is_file() or (parent != folder and not parent.is_dir()):
            raise OutputError(f"{what}: {parent} is a file, not a folder")
        raise OutputError(f"{what}: folder {folder} does not exist")
    if not os.path.isdir(folder):
        raise OutputError(f"{what}: {folder} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".gdn-export-write-test.", dir=folder)
    except OSError as exc:
        if exc.errno == errno.ENOENT:  # the folder exists: a virtual file system (/proc) refuses
            raise OutputError(f"{what}: folder {folder} does not accept new files (a virtual file "
                              f"system such as /proc or /sys?)") from None
        raise OutputError(f"{what}: cannot write into folder {folder} ({os_reason(exc)})") from None
    os.close(fd)
    os.unlink(probe)


# Longest suffix the writers add to a name for their temporary file or folder (".name.XXXXXXXX.tmp").
TEMP_NAME_EXTRA = 24


def check_name_length(path: Path, what: str) -> None:
    """OutputError when the file name (with the temporary name's extra characters) is longer than
    the folder's file system allows, which would only surface at the final rename."""
    try:
        limit = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return
    length = len(os.fsencode(path.name))
    if length + TEMP_NAME_EXTRA > limit:
        raise OutputError(f"{what}: the file name is {length} bytes; {path.parent} allows {limit} "
                          f"({limit - TEMP_NAME_EXTRA} with the temporary name written first)")


def free_bytes(folder: Path) -> int | None:
    """Free bytes for an unprivileged user on `folder`'s file system; None where it cannot tell
    (a virtual file system reports a size of 0)."""
    try:
        usage = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    if usage.f_blocks == 0:
        return None
    return usage.f_bavail * usage.f_frsize


def check_free_space(folder: Path, need_bytes: int, what: str) -> None:
    """OutputError when `folder`'s file system has less than need_bytes (+ SPACE_MARGIN) free."""
    free = free_bytes(folder)
    if free is not None and need_bytes + SPACE_MARGIN > free:
        raise OutputError(f"{what}: needs about {human_size(need_bytes)} but {folder} has {human_size(free)} free")


def human_size(n: int) -> str:
    """1536 -> "1.5 KiB"; bytes below 1 KiB as "N bytes"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def check_output_file(path: str | os.PathLike, what: str | None = None, *, overwrite: bool = False,
                      need_bytes: int = 0, suffix: str | None = None,
                      also: tuple[Path, ...] = ()) -> Path:
    """Path(path) once it is known that a file can be written there (module docstring).

    what: how the user named it (default: the path), the start of every message; overwrite: accept
    an existing file; need_bytes: its expected size, checked against the free space; suffix: the
    name must end in it (e.g. ".onnx"); also: other files the command writes beside it (a sidecar),
    refused like the main one when they exist.
    """
    p = Path(path)
    what = what or str(p)
    if not p.name or str(path).endswith(os.sep):
        raise OutputError(f"{what}: give a file name, not a folder")
    if suffix is not None and p.suffix != suffix:
        raise OutputError(f"{what}: the file name must end in {suffix}")
    st = _stat(p, what)
    if st is not None and os.path.isdir(p):
        raise OutputError(f"{what}: is a folder, not a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # os.replace would put a regular file in place of a device, a pipe or a socket
        raise OutputError(f"{what}: is not a regular file (a device, pipe or socket); give a file path")
    check_folder_writable(p.parent, what)
    check_name_length(p, what)
    if not overwrite:
        for existing in (p, *also):
            if existing.exists() or existing.is_symlink():
                which = "" if existing == p else f" {existing}"
                raise OutputError(f"{what}:{which} exists (pass --overwrite to replace it)")
    if need_bytes:
        check_free_space(p.parent, need_bytes, what)
    return p


def check_output_dir(path: str | os.PathLike, what: str | None = None, *, overwrite: bool = False,
                     need_bytes: int = 0, replaceable=None) -> Path:
    """Path(path) once it is known that a folder can be created there (or an existing one replaced).

    An existing empty folder is accepted; a non-empty one only with overwrite, and then only when
    `replaceable(path)` (if given) says it holds what this command writes (make-tiny replaces a
    checkpoint, never an arbitrary folder). Missing parents are created by the writer, so the
    nearest existing ancestor must accept new files.
    """
    p = Path(path)
    what = what or str(p)
    st = _stat(p, what)
    if st is not None and not os.path.isdir(p):
        raise OutputError(f"{what}: is a file, not a folder")
    if st is not None:
        try:
            empty = not any(p.iterdir())
        except OSError as exc:
            raise OutputError(f"{what}: cannot list {p} ({os_reason(exc)})") from None
        if not empty and not overwrite:
            raise OutputError(f"{what}: exists and is not empty (pass --overwrite to replace it)")
        if not empty and replaceable is not None and not replaceable(p):
            raise OutputError(f"{what}: is not empty and holds no gdn-export output (no config.json); "
                              f"--overwrite replaces only such a folder")
        if writes_in_place(p):
            check_folder_writable(p, what)
    ancestor = p.parent
    while _stat(ancestor, what) is None and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    check_folder_writable(ancestor, what)
    if ancestor == p.parent:
        check_name_length(p, what)
    if need_bytes:
        check_free_space(ancestor, need_bytes, what)
    return p


def writes_in_place(folder: Path) -> bool:
    """Whether an existing output folder is filled in place rather than replaced by a renamed
    sibling: a mount point (which cannot be renamed, and whose siblings are on another file
    system) or the current folder (which the user's shell stands in)."""
    folder = Path(os.path.abspath(folder))
    return folder.is_dir() and (os.path.ismount(folder) or folder == Path.cwd())


def _appeared(what: str, path: Path) -> OutputError:
    where = f"{path}" if what == str(path) else f"{what}: {path}"
    return OutputError(f"{where} appeared while this command ran (another run writing the same output?); "
                       f"it is kept: pass --overwrite to replace it")


# errnos of a file system without hard links (FAT, some FUSE and network file systems)
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV, errno.ENOSYS}


def publish_file(tmp: str | os.PathLike, path: str | os.PathLike, what: str | None = None, *,
                 overwrite: bool = False) -> Path:
    """Move the finished file `tmp` (same folder) to `path`. With overwrite an existing `path` is
    replaced (os.replace); without, an existing `path` is an OutputError and stays untouched, even
    when it appeared a moment ago (module docstring). `tmp` is gone afterwards either way."""
    tmp, path = Path(tmp), Path(path)
    what = what or str(path)
    try:
        if overwrite:
            os.replace(tmp, path)
            return path
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise _appeared(what, path) from None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            try:  # claim the name exclusively, then rename over the claim
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                raise _appeared(what, path) from None
            os.replace(tmp, path)
        return path
    except OSError as exc:
        raise OutputError(f"{what}: cannot write {path} ({os_reason(exc)})") from None
    finally:
        tmp.unlink(missing_ok=True)


def publish_files(moves, what: str | None = None, *, overwrite: bool = False) -> None:
    """publish_file for each (tmp, path) of `moves` in order (a sidecar before the file that points
    at it). When one fails, the files this call has already put in place are removed again: a run
    that lost the race leaves the winner's files alone and none of its own."""
    done: list[Path] = []
    try:
        for tmp, path in moves:
            publish_file(tmp, path, what or str(path), overwrite=overwrite)
            done.append(Path(path))
    except BaseException:
        if not overwrite:  # names this call created exclusively: nobody else's files
            for path in done:
                path.unlink(missing_ok=True)
        raise


def publish_dir(tmp: str | os.PathLike, path: str | os.PathLike, what: str | None = None, *,
                overwrite: bool = False) -> Path:
    """Move the finished folder `tmp` (same parent) to `path`. An empty folder at `path` is
    replaced; a non-empty one only with overwrite (moved aside, then removed once `tmp` is in
    place); without, it is an OutputError and stays untouched, even when it appeared a moment ago.
    On an OutputError `tmp` is removed."""
    import shutil

    tmp, path = Path(tmp), Path(path)
    what = what or str(path)
    old = None
    try:
        if overwrite and path.is_dir() and any(path.iterdir()):
            old = path.with_name(f".{path.name}.old.{os.getpid()}")
            os.rename(path, old)
        try:
            os.rename(tmp, path)  # onto an existing folder only when it is empty
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                if old is not None:
                    os.rename(old, path)
                    old = None
                raise _appeared(what, path) from None
            raise
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"{what}: cannot write {path} ({os_reason(exc)})") from None
    except BaseException:  # the OutputError above, an interrupt
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, what: str | None = None, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends without an exception it is given
    the usual file mode and moved to `path` (`publish_file`: without overwrite, a file that appeared
    at `path` meanwhile is an OutputError and kept), otherwise removed. The temporary name keeps
    the suffix (numpy's savez and others append one otherwise)."""
    path = Path(path)
    what = what or str(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    except OSError as exc:
        raise OutputError(f"{what}: cannot write into folder {path.parent} ({os_reason(exc)})") from None
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        try:
            os.chmod(tmp, file_mode())
        except OSError as exc:
            raise OutputError(f"{what}: cannot write {path} ({os_reason(exc)})") from None
        publish_file(tmp, path, what, overwrite=overwrite)
    finally:
        tmp.unlink(missing_ok=True)


def temp_dir_beside(path: str | os.PathLike, what: str | None = None) -> Path:
    """A new empty folder with the usual mode (0777 & ~umask) in `path`'s parent, named after it
    (.NAME.XXXXXXXX): where an output folder is assembled before `publish_dir`, or where an output
    file and its sidecar are written before `publish_file`."""
    path = Path(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:
        raise OutputError(f"{what or path}: cannot write into folder {path.parent} ({os_reason(exc)})") from None
    make_dir_mode_usual(tmp)
    return tmp


def usual_modes(folder: Path) -> None:
    """chmod every file directly in `folder` to 0666 & ~umask (safetensors and mkstemp write 0600)."""
    mode = file_mode()
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink():
            f.chmod(mode)


def describe_folder(folder: str | os.PathLike) -> str:
    """"FOLDER (N files, SIZE: the largest NAME SIZE)": what a command wrote into an output folder."""
    folder = Path(folder)
    files = [f for f in folder.iterdir() if f.is_file()]
    if not files:
        return f"{folder} (empty)"
    sizes = {f.name: f.stat().st_size for f in files}
    largest = max(sizes, key=sizes.get)
    return (f"{folder} ({len(files)} files, {human_size(sum(sizes.values()))}: the largest {largest} "
            f"{human_size(sizes[largest])})")


def make_dir_mode_usual(path: Path) -> None:
    """chmod a folder made by tempfile.mkdtemp (0700) to the usual 0777 & ~umask."""
    os.chmod(path, dir_mode())
