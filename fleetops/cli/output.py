"""Where a command's output goes: to stdout, or whole to a file (``-o``), which a reader never
sees half written. ``fleetops audit`` and ``fleetops baseline`` write their reports through it."""

from __future__ import annotations

import os
import sys


def write_out(text: str, output: str | None) -> None:
    """``text`` to ``output`` atomically (a reader never sees half a file), or to stdout. The
    temporary file is in the same folder (the rename stays on one file system), hidden, with no
    suffix a collector globs for, and made by ``open`` so the result has the umask's mode."""
    if not output:
        sys.stdout.write(text)
        return
    import contextlib

    folder = os.path.dirname(os.path.abspath(output))
    tmp = os.path.join(folder, f".{os.path.basename(output)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
