"""Small checks and renderings shared by the readers of a run's files (files.py, heads_file.py): what a value
is (a number, a finite one, a whole one), how a value or a path is named in a message, and JSON and text read
the way every run file is."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from attnconv.fileio import dangling_link, file_kind


def is_whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def path_kind(path: Path) -> str:
    try:
        return file_kind(path.stat().st_mode)
    except OSError:
        return dangling_link(path) or "a broken link"


def file_text(data: bytes) -> str:
    """A run file's bytes as text: UTF-8, a byte-order mark (an editor's, on Windows) left out."""
    return data.decode("utf-8-sig")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    """A number (not a bool) that a float holds finitely: an integer of 10**400 (JSON reads it) is not."""
    try:
        return is_number(v) and math.isfinite(v)
    except OverflowError:
        return False


def short_value(v: Any) -> str:
    """`v` as JSON (a float that is not finite as Python writes it, anything else by its kind), at most 40
    characters."""
    try:
        text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    except RecursionError:
        text = f"(a deeply nested {type(v).__name__})"
    except (ValueError, TypeError):  # not JSON: a tensor, a set, a container holding one
        text = _described(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _described(v: Any) -> str:
    shape = getattr(v, "shape", None)
    if shape is not None and hasattr(v, "dtype"):  # a tensor (or an array): its kind, not its values
        return f"(a {str(v.dtype).removeprefix('torch.')} tensor of shape {tuple(shape)})"
    return f"(a {type(v).__name__})"


def json_loads(text: str) -> Any:
    """json.loads, with nesting too deep for the parser, or a number too long for Python to read,
    as a ValueError saying so (not a RecursionError, nor Python's advice on its digit limit)."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise ValueError("nested too deeply to be read") from None


def _parse_int(digits: str) -> int:
    if len(digits) > 4000:  # Python refuses over 4300 digits with advice meant for programmers
        raise ValueError(f"a number of {len(digits)} digits")
    return int(digits)


def shortened(text: str, keep: int = 80) -> str:
    """A long name (a path of thousands of characters) shown by its two ends, so that a message stays short."""
    return text if len(text) <= 2 * keep + 3 else f"{text[:keep]}...{text[-keep:]}"


# Characters of each value `shown_pair` shows.
_PAIR_WIDTH = 40


def shown_pair(was: Any, new: Any) -> tuple[str, str]:
    """Two differing values as JSON, each shortened to about 40 characters around where they first differ (two
    long values that differ past their start would otherwise look the same)."""
    a, b = (json.dumps(v) for v in (was, new))
    if len(a) <= _PAIR_WIDTH and len(b) <= _PAIR_WIDTH:
        return a, b
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, at - _PAIR_WIDTH // 4)
    return tuple(("..." if start else "") + t[start:start + _PAIR_WIDTH] + ("..." if len(t) > start + _PAIR_WIDTH else "")
                 for t in (a, b))
