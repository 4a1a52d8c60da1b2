"""Wrappers put around sys.stdout and sys.stderr for a while (the CLI's, an export's), taken out again however
their spans overlap with others' in other threads.

A wrapper holds the stream it stands for as `_stream`. Putting back the stream saved on entry is wrong when spans
overlap without nesting (one begins inside the other's and ends after it): the one leaving second would put back the
other's wrapper for good. `unwrap` takes a wrapper out of the chain wherever it sits in it.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["unwrap"]


def unwrap(name: str, wrapper: Any) -> None:
    """Take `wrapper` out of the chain of wrappers that `sys.<name>` ("stdout" or "stderr") is: the stream it stood
    for takes its place. Where it is hidden from the chain (a user's capture that keeps the stream under another name,
    and may put the wrapper back when its own span ends), it is marked done (`_done`): from then on it passes every
    write and flush through unchanged."""
    wrapper._done = True
    current = getattr(sys, name)
    if current is wrapper:
        setattr(sys, name, wrapper._stream)
        return
    seen: set[int] = set()
    node = current
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        inner = vars(node).get("_stream") if hasattr(node, "__dict__") else None
        if inner is wrapper:
            node._stream = wrapper._stream
            return
        node = inner
