"""The code blocks of README.md and docs/*.md, cut into chunks that each have
a kind (shell, python, http, json, trailers, output) and the `<!-- doc-test:
MARK -->` marks written before them: what tests/test_docs.py checks and
tests/test_serve_cpu.py runs against a server (its docstring says how a
block's kind is read)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*([\w -]+?)\s*-->\s*$")
FENCE = re.compile(r"^( *)(```+|~~~+)\s*([\w+-]*)")
LIST_ITEM = re.compile(r"^( *)([-*+]|\d+[.)])( +)")
KINDS = ("shell", "python", "http", "json", "trailers", "output")
FENCE_KINDS = {
    "python": "python",
    "py": "python",
    "bash": "shell",
    "sh": "shell",
    "shell": "shell",
    "console": "shell",
    "json": "json",
    "http": "http",
    "text": "output",
    "output": "output",
}
UNCHECKED_COMMANDS = {"cd", "export", "git", "curl", "$EDITOR", ".", "source"}
SHELL_WORDS = {"make", "pip", "rlsync", "python", "python3"} | UNCHECKED_COMMANDS
PYTHON_START = re.compile(
    r"^(from\s+\w[\w.]*\s+import\b|import\s+\w|async\s+def\b|def\b|class\b"
    r"|for\b|with\b|if\b|await\b|@\w|[A-Za-z_][\w.]*(\s*,\s*[A-Za-z_]\w*)*"
    r"\s*(=[^=]|\(|\+=))"
)
HTTP_LINE = re.compile(r"^\s*(GET|POST|PUT|PATCH|DELETE)\s+(/[\w/.-]*)")
TRAILER = re.compile(r"^(Depends|Feature|Bug|Forwarded):\s*(.*)$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


@dataclass(frozen=True)
class Chunk:
    """Lines of a block between blank lines, and the kind they are."""

    page: str
    line: int  # the chunk's first line in its page, from 1
    kind: str | None
    text: str
    marks: tuple[str, ...] = ()

    @property
    def run(self) -> bool:
        """Marked `<!-- doc-test: run -->`: run as it is, needing nothing."""
        return "run" in self.marks

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Block:
    page: str
    line: int
    lang: str
    lines: list[str]
    marks: list[str] = field(default_factory=list)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def blocks_of(page: str, text: str) -> list[Block]:
    """The fenced and indented code blocks of a markdown page, in order,
    each with the `doc-test` marks written before it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    content, blank, marks, i = 0, True, [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            blank, i = True, i + 1
            continue
        mark, fence = MARKER.match(line), FENCE.match(line)
        if mark:
            marks, blank, i = marks + mark.group(1).split(), True, i + 1
            continue
        if fence and _indent(line) < content + 4:
            end = _fence_end(lines, i, fence.group(2))
            body = [l[len(fence.group(1)) :] for l in lines[i + 1 : end]]
            blocks.append(Block(page, i + 2, fence.group(3).lower(), body, marks))
            marks, blank, i = [], False, end + 1
            continue
        if blank and _indent(line) >= content + 4:
            end = _indented_end(lines, i, content + 4)
            body = [l[content + 4 :] for l in lines[i:end]]
            blocks.append(Block(page, i + 1, "", body, marks))
            marks, blank, i = [], True, end
            continue
        item = LIST_ITEM.match(line)
        if item:
            content = len(item.group(0))
        elif blank and _indent(line) < content:
            content = _indent(line)
        marks, blank, i = [], False, i + 1
    return blocks


def _fence_end(lines: list[str], start: int, fence: str) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip().startswith(fence):
            return j
    return len(lines)


def _indented_end(lines: list[str], start: int, indent: int) -> int:
    """The line after an indented block's last non-blank line."""
    end = j = start
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) >= indent):
        if lines[j].strip():
            end = j + 1
        j += 1
    return end


def chunks_of(block: Block) -> list[Chunk]:
    """A block cut at its blank lines; each part with its kind."""
    chunks, start = [], 0
    for j in range(len(block.lines) + 1):
        if j == len(block.lines) or not block.lines[j].strip():
            if j > start:
                text = "\n".join(block.lines[start:j])
                kind = kind_of(text, block.lang, block.marks)
                chunks.append(
                    Chunk(
                        block.page, block.line + start, kind, text, tuple(block.marks)
                    )
                )
            start = j + 1
    return _joined(chunks)


def _joined(chunks: list[Chunk]) -> list[Chunk]:
    """Neighbouring python chunks of a block are one program."""
    out: list[Chunk] = []
    for chunk in chunks:
        if out and out[-1].kind == chunk.kind == "python":
            gap = chunk.line - out[-1].line - out[-1].text.count("\n") - 1
            text = out[-1].text + "\n" * (gap + 1) + chunk.text
            out[-1] = Chunk(chunk.page, out[-1].line, "python", text, chunk.marks)
        else:
            out.append(chunk)
    return out


def kind_of(text: str, lang: str, marks: list[str]) -> str | None:
    for mark in marks:
        if mark in KINDS:
            return mark
    if lang:
        return FENCE_KINDS.get(lang)
    first = text.lstrip().splitlines()[0]
    words = [w for w in first.split() if not ENV_ASSIGNMENT.match(w)]
    if first.startswith("$ ") or (words and words[0] in SHELL_WORDS):
        return "shell"
    if HTTP_LINE.match(first):
        return "http"
    if first[:1] in "{[":
        return "json"
    if TRAILER.match(first):
        return "trailers"
    if PYTHON_START.match(first):
        return "python"
    return None


def all_chunks() -> list[Chunk]:
    """Every chunk of README.md and docs/*.md, in order."""
    return [
        chunk
        for page in PAGES
        for block in blocks_of(str(page.relative_to(ROOT)), page.read_text())
        for chunk in chunks_of(block)
    ]


def command_lines(text: str) -> list[str]:
    """The commands of a shell chunk: prompt lines only where there are
    prompts; `\\` continuations and usage lines going on with `[` joined."""
    lines = text.splitlines()
    if any(l.startswith("$ ") for l in lines):
        lines = [l[2:] for l in lines if l.startswith("$ ")]
    joined: list[str] = []
    for line in lines:
        if joined and (joined[-1].endswith("\\") or line.lstrip().startswith("[")):
            joined[-1] = joined[-1].rstrip("\\").rstrip() + " " + line.strip()
        else:
            joined.append(line)
    return [l for l in joined if l.strip() and not l.lstrip().startswith("#")]


def reader_env(tmp_path: Path) -> dict[str, str]:
    """`rlsync` and `python` on PATH: this checkout's library, this
    interpreter (scripts, not links: a link to a venv's python leaves it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, argv in (("rlsync", "-m rlsync "), ("python", ""), ("python3", "")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {argv}"$@"\n')
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(ROOT)])
    return env
