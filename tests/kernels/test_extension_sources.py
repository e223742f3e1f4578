"""CPU-only: the cuda backend's build hash covers every file its sources include, so an edit to any
of them rebuilds the cached extension instead of loading a stale one."""

import re

from gdn_export.cuda import extension

INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"', re.M)


def test_build_hash_covers_every_local_include():
    seen, todo = set(), list(extension.SOURCES)
    while todo:
        path = todo.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        for name in INCLUDE.findall(path.read_text()):
            # "x.h" beside the file, or "<op>/cuda/x.h" under the extension's include path (kernels/)
            included = next((c for c in (path.parent / name, extension.KERNELS_DIR / name) if c.exists()), None)
            if included is not None:  # local headers; TensorRT / CUDA headers are not ours
                todo.append(included)
    hashed = {p.resolve() for p in extension.SOURCES + extension.HEADERS}
    missing = sorted(str(p.relative_to(extension.KERNELS_DIR.parent)) for p in seen - hashed)
    assert not missing, f"included but not in the build hash: {missing}"
