"""Keyset cursors in URLs: the list's key of the last row shown, each value
tagged with its type ("i42.s01JB..."), so a bookmarked page resumes exactly."""

from __future__ import annotations

from typing import Any

MAX_LENGTH = 200


def encode(after: tuple[Any, ...] | None) -> str | None:
    if after is None:
        return None
    return ".".join(f"i{v}" if isinstance(v, int) else f"s{v}" for v in after)


def decode(text: str) -> tuple[Any, ...]:
    """The key ``text`` names; ValueError (naming the problem) if it is none."""
    if not text or len(text) > MAX_LENGTH:
        raise ValueError("the cursor 'after' is empty or too long: follow the list's Next link")
    values: list[Any] = []
    for part in text.split("."):
        tag, value = part[:1], part[1:]
        if tag == "i" and value.lstrip("-").isdigit():
            values.append(int(value))
        elif tag == "s" and value.isalnum():
            values.append(value)
        else:
            raise ValueError(
                f"the cursor 'after' is malformed ({text!r}): follow the list's Next link"
            )
    return tuple(values)
