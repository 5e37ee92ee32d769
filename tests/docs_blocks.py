"""The code blocks of a documentation page, read the way the docs tests run
them (tests/docs/test_docs_tutorial.py states the convention).

A block is a Markdown fence: its language, its lines, and the file it
belongs to when its first line names one (``# shop/jobs.py`` in Python,
``{# shop/templates/shop/order_form.html #}`` in a Django template). Fences
written as MyST directives (```` ```{code-block} python ````) are not
blocks: they show code that cannot run here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

# A comment that is only a relative path with an extension: the block's file.
FILE_COMMENT = re.compile(r"^(?:#|\{#)\s*([\w./-]+\.\w+)\s*(?:#\})?\s*$")


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # where the fence opens in its page, for messages

    @property
    def file(self) -> str | None:
        """The file this block goes into, if its first line names one."""
        first = self.code.split("\n", 1)[0]
        match = FILE_COMMENT.match(first)
        return match.group(1) if match else None

    def commands(self) -> list[list[str]]:
        """A console block's commands: its ``$ `` lines; a sh block's: every
        line but comments. Each split as a shell would."""
        commands = []
        for line in self.code.splitlines():
            if self.language == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(shlex.split(line))
        return commands


def read_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    blocks: list[Block] = []
    language: str | None = None
    lines: list[str] = []
    start = 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if language is None:
            if line.startswith("```"):
                language, lines, start = line[3:].strip(), [], number
        elif line.strip() == "```":
            if language and not language.startswith("{"):
                blocks.append(Block(language, "\n".join(lines) + "\n", start))
            language = None
        else:
            lines.append(line)
    assert language is None, f"{page}: the fence opened at line {start} is never closed"
    return blocks
