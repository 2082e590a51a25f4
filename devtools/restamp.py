"""Carry a change to pin patches' messages or names into their ports.

A port records the sha256 of the pin patch it was made from (`ported-from`),
so rewording a pin patch, renaming it or changing a `Depends:` line leaves
every port of it stale although no line of code changed. `make
port-restamp` compares each pin's series with the one committed at a
revision (default HEAD): a pin patch whose changes are those of a
committed patch is the same patch, renamed or reworded (its diffs byte for
byte, but for their `index` lines and hunk positions, which move when an
earlier patch changes the same file). Each port of it, as committed at
that revision, gets the new name and header (the pin patch's own where the port's was the pin patch's; a
port with a message of its own keeps it, its `Depends:` lines renamed, and
is left stale if the pin patch was reworded beyond that), keeps its diffs,
and is stamped as made from the new pin patch. A port whose pin patch
changed its diffs or left the series is left as it is and named: those are
made again with `make port`, or removed. Every port is read before any is
written, so swaps and chains of names are safe, and running it again gives
the same result.

Standard library and git only, as the rest of devtools.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from devtools.ports import PORTED_FROM, parse_ported_from, read_ported_from
from devtools.releases import adjusted
from devtools.series import (
    PINS_DIR,
    Layout,
    SeriesError,
    git_env,
    placeless_diffs,
    read_series,
    series_names,
)

_DIFF_START = b"\ndiff --git "


def _split(text: bytes) -> tuple[bytes, bytes]:
    """A patch file's header and message, and its changes (from the first
    line starting `diff --git`)."""
    start = text.find(_DIFF_START)
    if start < 0:
        return text, b""
    return text[: start + 1], text[start + 1 :]


def _changes(text: bytes) -> str:
    """What a patch changes, as its ports depend on it (their own diffs are
    made against their release's files)."""
    return placeless_diffs(text.decode("utf-8", "surrogateescape"))


def _sha256(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def _git_show(layout: Layout, rev: str, path: str) -> bytes | None:
    """`path` (from the repository's root) as committed at `rev`; None
    where it is not there."""
    proc = subprocess.run(
        ["git", "show", f"{rev}:{path}"],
        cwd=layout.root,
        env=git_env(),
        capture_output=True,
    )
    return proc.stdout if proc.returncode == 0 else None


def committed_series(layout: Layout, rev: str) -> dict[str, bytes]:
    """{file name: bytes} of the pin's series as committed at `rev`."""
    where = f"{PINS_DIR}/{layout.version}/patches"
    listing = _git_show(layout, rev, f"{where}/series")
    if listing is None:
        raise SeriesError(f"{where}/series: not committed at {rev}")
    out = {}
    for name in series_names(listing.decode()):
        text = _git_show(layout, rev, f"{where}/{name}")
        if text is None:
            raise SeriesError(f"{where}/{name}: listed, but not committed at {rev}")
        out[name] = text
    return out


def _depends_renamer(renames: dict[str, str]):
    """Rename the patches `Depends:` lines name (with or without `.patch`)."""

    def rename(text: bytes) -> bytes:
        def line(m: re.Match) -> bytes:
            name = m.group(2).decode()
            stem = name.removesuffix(".patch")
            if stem not in renames:
                return m.group(0)
            new = renames[stem] + (".patch" if name.endswith(".patch") else "")
            return m.group(1) + new.encode()

        return re.sub(rb"^(Depends: *)(\S+)", line, text, flags=re.M)

    return rename


def _committed_folder(
    layout: Layout, rev: str
) -> tuple[dict[str, str], dict[str, bytes]]:
    """A release's `ported-from` and port files as committed at `rev`
    (nothing where it had none)."""
    where = layout.adjustments_dir.relative_to(layout.root).as_posix()
    stamps = _git_show(layout, rev, f"{where}/{PORTED_FROM}")
    if stamps is None:
        return {}, {}
    made_from = parse_ported_from(stamps.decode(), f"{rev}:{where}/{PORTED_FROM}")
    files = {name: _git_show(layout, rev, f"{where}/{name}") for name in made_from}
    return made_from, {name: text for name, text in files.items() if text is not None}


@dataclass
class Restamped:
    written: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    left_stale: list[str] = field(default_factory=list)


def restamp(layout: Layout, rev: str = "HEAD") -> Restamped:
    """Restamp the ports of `layout`'s pin (see the module's text)."""
    old = committed_series(layout, rev)
    new = {p.name: p.read_bytes() for p in read_series(layout.patches_dir)}
    new_by_changes = {_changes(text): name for name, text in new.items()}
    renamed_to = {
        name: new_by_changes[_changes(text)]
        for name, text in old.items()
        if _changes(text) in new_by_changes
    }
    rename = _depends_renamer(
        {
            o.removesuffix(".patch"): n.removesuffix(".patch")
            for o, n in renamed_to.items()
            if o != n
        }
    )
    order = list(new)
    out = Restamped()
    plans = []
    for release in adjusted(layout.root, layout.version):
        folder = Layout(layout.root, layout.version, release).adjustments_dir
        if not (folder / PORTED_FROM).is_file():
            continue
        made_from = read_ported_from(Layout(layout.root, layout.version, release))
        committed_stamps, committed_files = _committed_folder(
            Layout(layout.root, layout.version, release), rev
        )
        files: dict[str, bytes] = {}
        stamps: dict[str, str] = {}
        stale: dict[str, str] = {}
        carried: set[str] = set()  # committed ports given their new name
        # Ports made from a pin patch as it is now stay as they are.
        for name, sha in made_from.items():
            path = folder / name
            if name in new and sha == _sha256(new[name]) and path.is_file():
                files[name], stamps[name] = path.read_bytes(), sha
        # The committed ports, carried to the pin patches as they are now.
        for name, sha in committed_stamps.items():
            target = renamed_to.get(name)
            was = old.get(name)
            if target in files or name not in committed_files:
                continue
            if was is None or sha != _sha256(was):
                stale[name] = f"it was not made from {rev}'s pin patch"
                continue
            if target is None:
                stale[name] = (
                    "its pin patch's changes differ from those it was made from"
                    if name in new
                    else "its pin patch is no longer in the series: remove it"
                )
                continue
            head, changes = _split(committed_files[name])
            pin_head = _split(new[target])[0]
            if head == _split(was)[0]:
                head = pin_head
            elif rename(_split(was)[0]) == pin_head:
                head = rename(head)
            else:
                stale[name] = (
                    "its message is its own and its pin patch's was reworded "
                    "beyond renames: reword it the same way (make port)"
                )
                continue
            files[target], stamps[target] = head + changes, _sha256(new[target])
            carried.add(name)
        # What is neither current nor carried over stays, stale, unless a
        # carried port now has its name.
        for name, sha in made_from.items():
            if name in files or name in carried:
                stale.pop(name, None)
                continue
            path = folder / name
            if not path.is_file():
                stale[name] = f"{PORTED_FROM} lists it, but the file is missing"
                continue
            stale.setdefault(
                name,
                (
                    f"it was not made from {rev}'s pin patch (a rename or "
                    "rewording committed since: SINCE=<that commit>^)"
                    if name in new
                    else "its pin patch is no longer in the series: remove it"
                ),
            )
            files[name], stamps[name] = path.read_bytes(), sha
        out.left_stale += [f"{release}/{n}: {why}" for n, why in sorted(stale.items())]
        plans.append((folder, files, stamps))
    for folder, files, stamps in plans:
        for path in sorted(folder.glob("*.patch")):
            if path.name not in files:
                path.unlink()
                out.removed.append(path)
        for name, data in files.items():
            path = folder / name
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)
                out.written.append(path)
        ranked = sorted(
            stamps, key=lambda n: (order.index(n) if n in order else len(order), n)
        )
        (folder / PORTED_FROM).write_text(
            "# the sha256 of each pin patch its port here was made from\n"
            + "".join(f"{n} {stamps[n]}\n" for n in ranked)
        )
    return out
