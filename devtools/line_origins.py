"""Where each line of a series' final tree comes from.

The series applies patch after patch; a later patch often rewrites lines an
earlier one added (`make rewrites` counts them). A pull request must not: a
reviewer would read code twice, once in a form that never ships. This
follows every line slot through the series to the final tree:

- a line the pristine file has belongs to upstream; when a patch removes it,
  the line stays as a tombstone that records the remover, so a commit before
  that one still has it;
- a line a patch adds belongs to that patch, its *origin*, unless the patch
  wrote it in place of lines an earlier patch added (in the same block of
  `-`/`+` lines): then it takes the earliest origin of the lines it
  replaced, so the commit that first wrote that code ships its final form;
- a line a later patch removes is gone: no commit of a pull request needs it.

What comes out, per file, is the final tree's lines and the pristine lines
the series removed, in one order (removed before added where they meet),
each with its origin or remover: enough to cut the final diff into commits
that only add final lines and remove pristine ones, so none rewrites
another's (`pr_series`).

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from devtools.series import Layout, SeriesError, ensure_upstream

UPSTREAM = ""
# How alike (difflib's ratio) a changed line is to the line it replaces.
SAME_LINE_RATIO = 0.6
_FILE_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Line:
    """One line of a file as the series leaves it: `origin` is the patch
    that added it (UPSTREAM for a pristine line); `removed_by`, for a
    pristine line a patch removed, names that patch (the line is not in the
    final tree)."""

    text: str
    origin: str = UPSTREAM
    removed_by: str = ""

    @property
    def live(self) -> bool:
        return not self.removed_by


def file_diffs(text: str) -> list[tuple[str, list[str]]]:
    """(path, the diff's lines from its first hunk on), per file of a patch."""
    out: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        header = _FILE_HEADER.match(line)
        if header:
            out.append((header.group(2), []))
        elif out and (out[-1][1] or line.startswith("@@")):
            out[-1][1].append(line)
    return out


def pristine_lines(text: str | None) -> list[Line]:
    """A pristine file's lines (None: the file is new)."""
    if not text:
        return []
    lines = [Line(line) for line in text.split("\n")]
    if text.endswith("\n"):
        lines.pop()
    return lines


class _Cursor:
    """Walks a file's lines, copying them to `out`; positions count live
    lines only (tombstones are copied along, as a patch never saw them)."""

    def __init__(self, lines: list[Line]) -> None:
        self.lines = lines
        self.out: list[Line] = []
        self.at = 0  # next element of `lines` not yet copied
        self.live_seen = 0

    def copy_to_live(self, live_index: int) -> None:
        while self.live_seen < live_index:
            self.out.append(self.take())

    def take(self) -> Line:
        """Copy tombstones, then return the next live line (not copied)."""
        while self.at < len(self.lines) and not self.lines[self.at].live:
            self.out.append(self.lines[self.at])
            self.at += 1
        if self.at >= len(self.lines):
            raise IndexError
        line = self.lines[self.at]
        self.at += 1
        self.live_seen += 1
        return line

    def rest(self) -> list[Line]:
        return self.out + self.lines[self.at :]


def apply_diff(
    lines: list[Line], diff: list[str], patch: str, order: dict[str, int], where: str
) -> list[Line]:
    """`lines` with one file's hunks of `patch` applied (see the module's
    docstring); `order`: each patch's place in the series."""
    cursor = _Cursor(lines)
    i = 0
    while i < len(diff):
        hunk = HUNK.match(diff[i])
        i += 1
        if not hunk:
            continue
        start = int(hunk.group(1)) - (0 if hunk.group(2) == "0" else 1)
        cursor.copy_to_live(start)
        while i < len(diff) and diff[i][:1] in (" ", "-", "+", "\\"):
            if diff[i][:1] == " ":
                line = _take(cursor, diff[i][1:], patch, where)
                cursor.out.append(line)
                i += 1
                continue
            if diff[i][:1] == "\\":
                i += 1
                continue
            # One block of - and + lines.
            removed: list[Line] = []
            added: list[str] = []
            while i < len(diff) and diff[i][:1] in ("-", "+", "\\"):
                kind, text = diff[i][:1], diff[i][1:]
                i += 1
                if kind == "-":
                    line = _take(cursor, text, patch, where)
                    removed.append(line)
                    if line.origin == UPSTREAM:
                        line.removed_by = patch
                        cursor.out.append(line)
                elif kind == "+":
                    added.append(text)
            origins = _added_origins(removed, added, patch, order)
            cursor.out.extend(Line(t, o) for t, o in zip(added, origins))
    return cursor.rest()


def _added_origins(
    removed: list[Line], added: list[str], patch: str, order: dict[str, int]
) -> list[str]:
    """The origin of each line a block adds: a line that keeps or changes
    a line of an earlier patch (difflib pairs them: the same text, or the
    most alike in a replaced run) takes that line's origin; a line it
    inserts is the patch's own."""
    origins = [patch] * len(added)
    matcher = difflib.SequenceMatcher(
        None, [line.text for line in removed], added, autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            origins[j1:j2] = [line.origin or patch for line in removed[i1:i2]]
        elif tag == "replace":
            for i, j in _pairs(removed[i1:i2], added[j1:j2]):
                if removed[i1 + i].origin != UPSTREAM:
                    earlier = removed[i1 + i].origin
                    origins[j1 + j] = min(earlier, patch, key=lambda n: order[n])
    return origins


def _pairs(removed: list[Line], added: list[str]) -> list[tuple[int, int]]:
    """(removed index, added index) of each added line that changes a
    removed one: the most alike pairs first, each line in one pair, none
    less alike than SAME_LINE_RATIO (below it, a new line)."""
    scored = []
    for i, line in enumerate(removed):
        for j, text in enumerate(added):
            matcher = difflib.SequenceMatcher(None, line.text, text, autojunk=False)
            if matcher.real_quick_ratio() < SAME_LINE_RATIO:
                continue
            if matcher.quick_ratio() < SAME_LINE_RATIO:
                continue
            ratio = matcher.ratio()
            if ratio >= SAME_LINE_RATIO:
                scored.append((-ratio, i, j))
    pairs, used_i, used_j = [], set(), set()
    for _, i, j in sorted(scored):
        if i not in used_i and j not in used_j:
            pairs.append((i, j))
            used_i.add(i)
            used_j.add(j)
    return pairs


def _take(cursor: _Cursor, text: str, patch: str, where: str) -> Line:
    try:
        line = cursor.take()
    except IndexError:
        line = None
    if line is None or line.text != text:
        raise SeriesError(f"{patch}: {where}: a hunk does not match its file")
    return line


def line_origins(
    patches: list[tuple[str, str]], pristine: dict[str, str | None]
) -> dict[str, list[Line]]:
    """{path: its lines} after `patches` ((name, text) each, in series
    order) on the `pristine` files ({path: text, None where the file is
    new}; every path a patch touches)."""
    order = {UPSTREAM: -1, **{name: i for i, (name, _) in enumerate(patches)}}
    files: dict[str, list[Line]] = {}
    for name, text in patches:
        for path, diff in file_diffs(text):
            if path not in files:
                files[path] = pristine_lines(pristine.get(path))
            files[path] = apply_diff(files[path], diff, name, order, path)
    return files


def pristine_texts(layout: Layout, paths) -> dict[str, str | None]:
    """The pristine text of each path (None: the file is new)."""
    root = ensure_upstream(layout)
    return {
        path: (root / path).read_text() if (root / path).is_file() else None
        for path in sorted(paths)
    }
