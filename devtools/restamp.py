"""Carry a change to pin patches' messages or names into their ports.

A port records the sha256 of the pin patch it was made from (`ported-from`),
so rewording a pin patch, renaming it or changing a `Depends:` line leaves
every port of it stale although no line of code changed. `make
port-restamp` compares each pin's series with the one committed at a
revision (default HEAD): a pin patch whose changes (its diffs, byte for
byte) are those of a committed patch is the same patch, renamed or
reworded. Each port made from the committed patch gets the new name and
header (the pin patch's own where the port's was the pin patch's, else its
own with the renames applied), keeps its diffs, and is stamped as made from
the new pin patch. A port whose pin patch changed its diffs, or whose own
message would need more than renames, is left stale and named: those are
made again with `make port`.

Standard library and git only, as the rest of devtools.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from devtools.ports import PORTED_FROM, read_ported_from
from devtools.releases import adjusted
from devtools.series import PINS_DIR, Layout, SeriesError, git_env, read_series

_DIFF_START = b"\ndiff --git "


def _split(text: bytes) -> tuple[bytes, bytes]:
    """A patch file's header and message, and its changes (from the first
    line starting `diff --git`)."""
    start = text.find(_DIFF_START)
    if start < 0:
        return text, b""
    return text[: start + 1], text[start + 1 :]


def _sha256(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def committed_series(layout: Layout, rev: str) -> dict[str, bytes]:
    """{file name: bytes} of the pin's series as committed at `rev`."""
    where = f"{PINS_DIR}/{layout.version}/patches"

    def show(path: str) -> bytes:
        proc = subprocess.run(
            ["git", "show", f"{rev}:{where}/{path}"],
            cwd=layout.root,
            env=git_env(),
            capture_output=True,
        )
        if proc.returncode != 0:
            raise SeriesError(
                f"git show {rev}:{where}/{path}: {proc.stderr.decode().strip()}"
            )
        return proc.stdout

    names = []
    for line in show("series").decode().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return {name: show(name) for name in names}


def _renamer(renames: dict[str, str]):
    """Replace each old patch name (with or without `.patch`) by its new
    one, where it stands as a whole name."""
    if not renames:
        return lambda text: text
    pattern = re.compile(
        rb"(?<![\w-])("
        + b"|".join(re.escape(old.encode()) for old in sorted(renames, key=len)[::-1])
        + rb")(?![\w])(?!-[\w])"
    )
    return lambda text: pattern.sub(
        lambda m: renames[m.group(1).decode()].encode(), text
    )


@dataclass
class Restamped:
    written: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    left_stale: list[str] = field(default_factory=list)


def restamp(layout: Layout, rev: str = "HEAD") -> Restamped:
    """Restamp the ports of `layout`'s pin (see the module's text)."""
    old = committed_series(layout, rev)
    new = {p.name: p.read_bytes() for p in read_series(layout.patches_dir)}
    new_by_changes = {_split(text)[1]: name for name, text in new.items()}
    renamed_to = {
        name: new_by_changes[_split(text)[1]]
        for name, text in old.items()
        if _split(text)[1] in new_by_changes
    }
    stems = {
        o.removesuffix(".patch"): n.removesuffix(".patch")
        for o, n in renamed_to.items()
        if o != n
    }
    rename = _renamer(stems)
    order = list(new)
    out = Restamped()
    for release in adjusted(layout.root, layout.version):
        port = Layout(layout.root, layout.version, release)
        folder = port.adjustments_dir
        if not (folder / PORTED_FROM).is_file():
            continue
        made_from = read_ported_from(port)
        stamps: dict[str, str] = {}
        for name, sha in made_from.items():
            path = folder / name
            if name in new and sha == _sha256(new[name]):
                stamps[name] = sha  # made from the pin patch as it is
                continue
            was = old.get(name)
            target = renamed_to.get(name)
            if was is None or sha != _sha256(was) or target is None:
                why = (
                    "its pin patch's changes differ from those it was made from"
                    if was is not None and sha == _sha256(was)
                    else f"it was not made from {rev}'s pin patch"
                )
                out.left_stale.append(f"{release}/{name}: {why}")
                stamps[name] = sha
                continue
            head, changes = _split(path.read_bytes())
            pin_head = _split(new[target])[0]
            if head == _split(was)[0]:
                head = pin_head
            elif rename(_split(was)[0]) == pin_head:
                head = rename(head)
            else:
                out.left_stale.append(
                    f"{release}/{name}: its message is its own and its pin "
                    "patch's changed beyond renames"
                )
                stamps[name] = sha
                continue
            (folder / target).write_bytes(head + changes)
            out.written.append(folder / target)
            if target != name:
                path.unlink()
                out.removed.append(path)
            stamps[target] = _sha256(new[target])
        ranked = sorted(stamps, key=lambda n: order.index(n) if n in order else -1)
        (folder / PORTED_FROM).write_text(
            "# the sha256 of each pin patch its port here was made from\n"
            + "".join(f"{n} {stamps[n]}\n" for n in ranked)
        )
    return out
