"""Every log line within LINE_WIDTH columns: a longer line is wrapped at spaces with a hanging indent under its
text (after the leading spaces and a `[tag] ` or a summary label), so a wrapped line still reads as one item.
DEBUG_NAN_LOG_WIDTH=N sets another width, 0 none (one line per item, for tools that grep the log)."""

from __future__ import annotations

import os
import re
import textwrap

LINE_WIDTH = 100
_TAG = re.compile(r"^( *)(\[[^\]]{1,20}\] +|[a-z][\w ]{0,14}?  +)?")  # `[tag] ` or a summary label


def log_width() -> int:
    """The wrap width: DEBUG_NAN_LOG_WIDTH if set (0: never wrap), else LINE_WIDTH."""
    value = os.environ.get("DEBUG_NAN_LOG_WIDTH", "")
    return int(value) if value.isdigit() else LINE_WIDTH


def fit(line: str, width: int = LINE_WIDTH) -> list[str]:
    """`line` as one or more lines of at most `width` characters (a word longer than that is split)."""
    if len(line) <= width:
        return [line]
    spaces, tag = _TAG.match(line).groups()
    indent = " " * (len(spaces) + (len(tag) if tag else 2))
    if len(indent) > width // 2:
        indent = " " * 4
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_on_hyphens=False,
                         drop_whitespace=True) or [line[:width]]
