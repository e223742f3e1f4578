"""User-facing errors.

A `GdnExportError` is a mistake in what the user gave us (a bad checkpoint, a bad flag, a bad
tensor). The command line prints its message on one line and exits with status 2, without a
traceback. Anything else is a bug in gdn-export and keeps its traceback.
"""


class GdnExportError(Exception):
    """A user-facing error whose message names the problem in one line."""


class CheckpointError(GdnExportError):
    """The checkpoint directory, its config.json or its tensors are unusable."""


class ConfigError(CheckpointError):
    """config.json asks for something gdn-export cannot honour."""


class InputError(GdnExportError):
    """Token ids, positions or state tensors given at run time are malformed."""


class OutputError(GdnExportError):
    """An output path cannot be written: a missing or read-only folder, a folder in a file's place,
    an existing output without --overwrite, too little free space (gdn_export.paths)."""
