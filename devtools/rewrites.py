"""Which patches rewrite lines an earlier patch of the series added.

A pull-request branch whose later commit rewrites an earlier one's lines
makes a reviewer read code twice, once in a form that never ships. This
follows every line through the series: the pristine file's lines belong to
upstream, a patch's `+` lines to that patch, and a patch's `-` lines are
counted against whoever wrote them. The patches apply in order exactly as
`git format-patch` wrote them (no fuzz), so each hunk's line numbers are
those of the file as the patches before it left it.

`pins/<pin>/rewrites` lists the rewrites a series still has (`<patch>
<earlier patch> <lines>`): `make check` fails on a rewrite it does not list
or on more lines than it lists, so the list only shrinks.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

from devtools.line_origins import HUNK, UPSTREAM, file_diffs, pristine_texts
from devtools.series import Layout, SeriesError

REWRITES_FILE = "rewrites"


def _apply(
    lines: list[tuple[str, str]], diff: list[str], patch: str, where: str
) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """`lines` ((text, author) each) with `diff`'s hunks applied by `patch`;
    and {author: lines of theirs it removed}."""
    out: list[tuple[str, str]] = []
    removed: dict[str, int] = {}
    at = 0  # index into `lines` of the next line not yet copied
    i = 0
    while i < len(diff):
        hunk = HUNK.match(diff[i])
        i += 1
        if not hunk:
            continue
        start = int(hunk.group(1)) - (0 if hunk.group(2) == "0" else 1)
        out.extend(lines[at:start])
        at = start
        while i < len(diff) and diff[i][:1] in (" ", "-", "+", "\\"):
            kind, text = diff[i][:1], diff[i][1:]
            i += 1
            if kind == "\\":
                continue
            if kind == "+":
                out.append((text, patch))
                continue
            if at >= len(lines) or lines[at][0] != text:
                raise SeriesError(f"{patch}: {where}: a hunk does not match its file")
            if kind == " ":
                out.append(lines[at])
            else:
                removed[lines[at][1]] = removed.get(lines[at][1], 0) + 1
            at += 1
    out.extend(lines[at:])
    return out, removed


def rewrites(layout: Layout) -> dict[tuple[str, str], int]:
    """{(patch, earlier patch): lines of the earlier patch's it removes or
    changes}, over the series as it applies to the pristine tree."""
    patches = [(p.name.removesuffix(".patch"), p.read_text()) for p in layout.patches()]
    paths = {path for _, text in patches for path, _ in file_diffs(text)}
    return rewrites_of(patches, pristine_texts(layout, paths))


def rewrites_of(
    patches: list[tuple[str, str]], pristine: dict[str, str | None]
) -> dict[tuple[str, str], int]:
    """`rewrites` of `patches` ((name, text), in order) on the `pristine`
    files ({path: text, None where new})."""
    files: dict[str, list[tuple[str, str]]] = {}
    found: dict[tuple[str, str], int] = {}
    for name, text in patches:
        for path, diff in file_diffs(text):
            if path not in files:
                text = pristine.get(path) or ""
                files[path] = [(line, UPSTREAM) for line in text.split("\n")]
                if text.endswith("\n") or not text:
                    files[path].pop()
            files[path], removed = _apply(files[path], diff, name, path)
            for author, count in removed.items():
                if author != UPSTREAM:
                    found[(name, author)] = found.get((name, author), 0) + count
    return found


def read_allowed(layout: Layout) -> dict[tuple[str, str], int]:
    path = layout.pin_dir / REWRITES_FILE
    allowed: dict[tuple[str, str], int] = {}
    if not path.is_file():
        return allowed
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or not parts[2].isdigit():
            raise SeriesError(f"{path}:{lineno}: expected '<patch> <earlier> <lines>'")
        allowed[(parts[0], parts[1])] = int(parts[2])
    return allowed


def check_rewrites(layout: Layout) -> list[str]:
    """A rewrite `pins/<pin>/rewrites` does not list, or grown past it."""
    try:
        allowed = read_allowed(layout)
    except SeriesError as e:
        return [str(e)]
    try:
        found = rewrites(layout)
    except SeriesError:
        return []  # a patch that does not apply: `series.check` names it
    problems = []
    for (patch, earlier), count in sorted(found.items()):
        limit = allowed.get((patch, earlier), 0)
        if count > limit:
            problems.append(
                f"{patch}.patch rewrites {count} lines that {earlier}.patch adds "
                f"({REWRITES_FILE} allows {limit}): change them in {earlier} "
                "instead, so no commit of the series rewrites another's"
            )
    return problems


def rewrites_text(found: dict[tuple[str, str], int]) -> str:
    """`pins/<pin>/rewrites` listing `found` (what `rewrites` gives)."""
    return (
        "# Patches that rewrite lines an earlier patch adds (make rewrites):\n"
        "# <patch> <earlier patch> <lines>. make check fails on more; the list\n"
        "# only shrinks, to none.\n"
        + "".join(f"{p} {e} {n}\n" for (p, e), n in sorted(found.items()))
    )
