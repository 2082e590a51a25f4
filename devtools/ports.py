"""Ports of a pin's series to another release (pins/releases: `adjusted`).

A port is the pin's series with the patches that do not apply to the release
replaced by versions made against it: pins/<pin>/releases/<release>/<the pin
patch's file name>, and `ported-from` in the same folder, which records the
sha256 of each pin patch a port was made from. When a pin patch changes,
`make check` names every port of it that must be made again; a port is never
edited by hand, only exported from the release's worktree:

    make port RELEASE=<r>          build/<r>/work: the release's wheel, then
                                   the series by `git am -3` (stops at a
                                   conflict: resolve, `git am --continue`)
    make port-export RELEASE=<r>   write the patches that differ from the
                                   pin's (and only those) back as the port

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from devtools.imports import unresolved_imports
from devtools.names import unbound_globals
from devtools.pin import sha256_of
from devtools.releases import adjusted
from devtools.series import (
    FORMAT_PATCH,
    IDENTITY,
    PATCH_DATE,
    Layout,
    SeriesError,
    ensure_upstream,
    git,
    lint_patch,
    make_worktree,
    patched_tree,
    placeless_diffs,
    read_series,
    write_generated,
)

PORTED_FROM = "ported-from"


def read_ported_from(layout: Layout) -> dict[str, str]:
    """{pin patch file name: sha256 of the pin patch the port was made from}."""
    path = layout.adjustments_dir / PORTED_FROM
    return parse_ported_from(path.read_text(errors="replace"), str(path))


def parse_ported_from(text: str, path: str) -> dict[str, str]:
    """`ported-from`'s text (from `path`, for errors) as read_ported_from
    reads it."""
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[1]):
            raise SeriesError(f"{path}:{lineno}: expected '<patch> <sha256>'")
        if parts[0] in out:
            raise SeriesError(f"{path}:{lineno}: {parts[0]} listed twice")
        out[parts[0]] = parts[1]
    return out


def check_ports(layout: Layout) -> list[str]:
    """Every way the ports of a pin's series can disagree with it and with
    the release map (no release tree needed)."""
    problems: list[str] = []
    pin_patches = {p.name: p for p in read_series(layout.patches_dir)}
    wanted = set(adjusted(layout.root, layout.version))
    ports_dir = layout.pin_dir / "releases"
    present = {d.name for d in ports_dir.iterdir()} if ports_dir.is_dir() else set()
    for release in sorted(present - wanted):
        problems.append(
            f"{ports_dir / release}: pins/releases does not map {release} to "
            f"{layout.version} adjusted"
        )
    for release in sorted(wanted):
        port = Layout(layout.root, layout.version, release)
        where = port.adjustments_dir.relative_to(layout.root)
        patches = sorted(port.adjustments_dir.glob("*.patch"))
        if not patches or not (port.adjustments_dir / PORTED_FROM).is_file():
            problems.append(
                f"{where}: missing (pins/releases maps {release} adjusted: run "
                f"`make port RELEASE={release}` and `make port-export`)"
            )
            continue
        try:
            made_from = read_ported_from(port)
        except SeriesError as e:
            problems.append(str(e))
            continue
        for patch in patches:
            problems.extend(lint_patch(patch))
            if patch.name not in pin_patches:
                problems.append(
                    f"{where}/{patch.name}: ports no patch of {layout.version}'s series"
                )
            elif made_from.get(patch.name) != sha256_of(pin_patches[patch.name]):
                problems.append(
                    f"{where}/{patch.name}: ported from another version of "
                    f"pins/{layout.version}/patches/{patch.name}; make it again: "
                    f"`make port RELEASE={release}`, `make port-export RELEASE={release}` "
                    "(`make port-restamp` where only its name or message changed)"
                )
        for stray in sorted(port.adjustments_dir.iterdir()):
            if stray.name != PORTED_FROM and stray.suffix != ".patch":
                problems.append(
                    f"{where}/{stray.name}: neither a port nor {PORTED_FROM}"
                )
        for name in sorted(set(made_from) - {p.name for p in patches}):
            problems.append(f"{where}/{PORTED_FROM}: names {name}, which is no port")
    return problems


def check_release(layout: Layout) -> list[str]:
    """A served release's drift check, without servers: its series applies
    to its pristine wheel (fetched, sha256 checked), every file it writes
    compiles and looks up no global its module does not bind (that the
    pristine file binds), and every `from sglang... import` in them
    resolves."""
    pristine = ensure_upstream(layout)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = patched_tree(layout, Path(tmp))
        except SeriesError as e:
            return [f"{layout.release}: {e}"]
        write_generated(layout, Path(tmp))
        problems, parsed = [], []
        for rel in files:
            path = Path(tmp) / rel
            if rel.endswith(".py") and path.is_file():
                try:
                    unbound = unbound_globals(path.read_text(), rel)
                except SyntaxError as e:
                    problems.append(f"{layout.release}: {rel}:{e.lineno}: {e.msg}")
                    continue
                parsed.append(rel)
                before = pristine / rel
                if before.is_file():
                    unbound -= unbound_globals(before.read_text(), rel)
                problems += [
                    f"{layout.release}: {rel}: uses {name}, which the module "
                    "neither defines nor imports"
                    for name in sorted(unbound)
                ]
        for rel, line, module, name in unresolved_imports(Path(tmp), pristine, parsed):
            problems.append(
                f"{layout.release}: {rel}:{line}: imports {name} from {module}, "
                "which the release with its series does not define"
            )
    return problems


def current_ports(layout: Layout, start: Optional[Layout] = None) -> list[Path]:
    """The release's series to port from: a port where it was made from the
    pin patch as it is now, else (with `start`, a nearer release of the same
    pin) that release's current port, else the pin patch (a pin patch that
    changed is merged into the release again, so its change reaches the port)."""
    sources = [where for where in (layout, start) if where is not None]
    made_from = [
        (
            read_ported_from(where)
            if (where.adjustments_dir / PORTED_FROM).is_file()
            else {}
        )
        for where in sources
    ]
    out = []
    for patch in read_series(layout.patches_dir):
        out.append(patch)
        for where, made in zip(sources, made_from):
            port = where.adjustments_dir / patch.name
            if port.is_file() and made.get(patch.name) == sha256_of(patch):
                out[-1] = port
                break
    return out


def make_port_worktree(
    layout: Layout, start: Optional[Layout] = None
) -> tuple[Path, str]:
    """build/<release>/work: the release's pristine wheel, then its series
    (ports where there are, else the pin's patches) by `git am -3`, with the
    pin's worktree fetched so that a patch made against the pin can merge.
    `start`: a nearer release the pin's series serves whose ports to take
    where this release has none (its worktree, from `make port`, is fetched
    too, for their merge bases).
    Returns the worktree and "" or the name of the patch it stopped at."""
    if not layout.release:
        raise SeriesError("a port is made for a release: RELEASE=<version>")
    pin_work = make_worktree(Layout(layout.root, layout.version))
    if start is not None:
        _check_start(layout, start)
    patches = current_ports(layout, start)
    work = make_worktree(Layout(layout.root, layout.version, layout.release), [])
    git(work, "fetch", "--quiet", str(pin_work), "rlsync:refs/pin/rlsync")
    if start is not None:
        git(work, "fetch", "--quiet", str(start.work_dir), "rlsync:refs/from/rlsync")
    am = ["am", "--quiet", "--keep-cr", "--committer-date-is-author-date", "-3"]
    proc = git(work, *am, *map(str, patches), env=IDENTITY, check=False)
    write_generated(layout, work)
    if proc.returncode == 0:
        return work, ""
    applied = int(git(work, "rev-list", "--count", "upstream..HEAD").stdout)
    return work, patches[applied].name


def _check_start(layout: Layout, start: Layout) -> None:
    """`start` is another release of the same pin with a finished worktree."""
    if start.version != layout.version or not start.release:
        raise SeriesError(
            f"FROM={start.release or start.version}: not a release that "
            f"{layout.version}'s series serves"
        )
    if start.release == layout.release:
        raise SeriesError(f"FROM={start.release}: the release being ported")
    work = start.work_dir
    made = (work / ".git").is_dir() and not (work / ".git" / "rebase-apply").is_dir()
    if made:
        count = git(work, "rev-list", "--count", "upstream..rlsync", check=False)
        made = count.returncode == 0 and int(count.stdout) == len(start.patches())
    if not made:
        raise SeriesError(
            f"{work}: no finished port worktree of {start.release} to start from; "
            f"run `make port RELEASE={start.release}` first"
        )


def export_port(layout: Layout) -> list[Path]:
    """Write the release worktree's patches that differ from the pin's as the
    port (and `ported-from`); drop earlier ports no longer needed."""
    work = layout.work_dir
    if not (work / ".git").is_dir():
        raise SeriesError(f"{work}: no worktree; run `make port RELEASE=...` first")
    if (work / ".git" / "rebase-apply").is_dir():
        raise SeriesError(f"{work}: `git am` has not finished; resolve and continue")
    dirty = git(work, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if dirty:
        raise SeriesError(f"{work}: uncommitted changes; commit them first:\n{dirty}")
    pin_patches = read_series(layout.patches_dir)
    with tempfile.TemporaryDirectory() as tmp:
        git(work, *FORMAT_PATCH, "--output-directory", tmp, "upstream..HEAD")
        exported = sorted(Path(tmp).glob("*.patch"))
        if len(exported) != len(pin_patches):
            raise SeriesError(
                f"{work}: {len(exported)} commits since upstream, the series has "
                f"{len(pin_patches)}: one commit per patch, in series order"
            )
        ported: list[tuple[Path, str]] = []
        for made, pin_patch in zip(exported, pin_patches):
            with open(made, newline="") as f:  # keep a CR a file has
                text = re.sub(r"^Date: .*$", f"Date: {PATCH_DATE}", f.read(), 1, re.M)
            if placeless_diffs(text) != placeless_diffs(
                pin_patch.read_bytes().decode()
            ):
                ported.append((pin_patch, text))
        out = layout.adjustments_dir
        if out.exists():
            shutil.rmtree(out)
        if not ported:
            return []
        out.mkdir(parents=True)
        for pin_patch, text in ported:
            with open(out / pin_patch.name, "w", newline="") as f:
                f.write(text)
        (out / PORTED_FROM).write_text(
            "# the sha256 of each pin patch its port here was made from\n"
            + "".join(f"{p.name} {sha256_of(p)}\n" for p, _ in ported)
        )
    return [out / p.name for p, _ in ported]
