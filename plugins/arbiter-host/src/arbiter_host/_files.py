"""Small readers of kernel text files, shared by the host kinds."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """The file's text with surrounding whitespace stripped, or None when it cannot be read.

    Kernel attribute files can vanish between listing and reading (a USB supply unplugged),
    refuse a read (``EINVAL``/``ENODATA`` from a driver) or hold bytes that are not UTF-8; all
    of those read as "not known".
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data.decode("utf-8", "replace").strip()


def read_int(path: Path) -> int | None:
    """The file's integer value, or None when it cannot be read or is not an integer."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None
