"""Text that came from a place another account may write, made safe to show.

A file name or field from a shared folder may hold terminal escapes (ESC, CSI, OSC links) or
line breaks; shown raw they would redraw a reader's screen or forge a line of the timeline.
"""

from __future__ import annotations

import re

#: C0 controls, DEL and C1 controls: what a terminal acts on rather than prints
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with each control character written as its escape (``\\x1b``), all else as is."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
