"""Human and machine renderings of a parity report."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gdn_export.errors import GdnExportError
from gdn_export.paths import atomic_file, check_output_file
from gdn_export.validate.compare import Report


def format_table(report: Report, *, states: bool = True) -> str:
    """A fixed-width table: one row per compared tensor, then a verdict line."""
    rows = [r for r in report.rows if states or r.tensor == "logits"]
    head = ("backend", "phase", "tensor", "max abs", "max rel", "atol", "rtol", "")
    body = [
        (r.backend, r.phase, r.tensor, f"{r.max_abs:.3e}", f"{r.max_rel:.3e}", f"{r.atol:g}",
         f"{r.rtol:g}", _verdict(r))
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    failed = sum(not r.passed for r in report.rows)
    stepped = [r for r in report.rows if r.passed and r.note]
    if not report.rows:
        verdict = "FAIL: no tensors were compared"
    elif failed == 0:
        verdict = f"PASS: {len(report.rows)} tensors within tolerance"
    else:
        verdict = f"FAIL: {failed} of {len(report.rows)} tensors over tolerance"
    if stepped:
        verdict += f" ({len(stepped)} of them only within {stepped[0].note})"
    lengths = sorted(set(report.prompt_lengths or [report.prompt_len]))
    prompt = (f"prompt {lengths[0]} tokens" if len(lengths) == 1 else
              f"ragged prompts of {', '.join(map(str, report.prompt_lengths))} tokens")
    summary = (f"reference {report.reference}, batch {report.batch}, {prompt}, "
               f"{report.decode_steps} decode steps, seed {report.seed}")
    return "\n".join([summary, line(head), line(["-" * w for w in widths]), *map(line, body), verdict])


def _verdict(row) -> str:
    if row.passed:
        return f"ok ({row.note})" if row.note else "ok"
    return f"FAIL ({row.note})" if row.note else "FAIL"


def write_json(report: Report, path: str | os.PathLike, *, overwrite: bool = True) -> None:
    """Write the report atomically (temp file in the same folder, then rename; without overwrite a
    file that appeared at `path` meanwhile is kept and this is an OutputError).

    A missing folder, a folder in the file's place or an unwritable folder is a GdnExportError
    naming it.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise GdnExportError(f"{path.parent}: folder for the JSON report does not exist")
    if path.is_dir():
        raise GdnExportError(f"{path}: is a folder, not a file name for the JSON report")
    check_output_file(path, f"JSON report {path}", overwrite=True)
    with atomic_file(path, f"JSON report {path}", overwrite=overwrite) as tmp:
        tmp.write_text(json.dumps(report.to_dict(), indent=2, allow_nan=True), encoding="utf-8")
