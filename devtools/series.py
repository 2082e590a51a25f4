"""The patch series against pinned SGLang: the one source of truth.

`patches/series` lists `NNNN-name.patch` files in `git format-patch` form. The
overlay (`overlay/python/...`) is generated from pristine + series and checked
for drift; the developer worktree (`build/work`) is a git repository at the pin
with the series applied as commits, exported back deterministically.

Standard library and git only.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devtools.pin import Pin, fetch_sdist, read_pin, sha256_of, unpack_sdist

# Fixed so that exporting an unchanged series gives byte-identical files.
PATCH_DATE = "Sat, 1 Jan 2000 00:00:00 +0000"
BASE_DATE = "2000-01-01T00:00:00+00:00"
IDENTITY = {
    "GIT_AUTHOR_NAME": "rlsync",
    "GIT_AUTHOR_EMAIL": "rlsync@localhost",
    "GIT_COMMITTER_NAME": "rlsync",
    "GIT_COMMITTER_EMAIL": "rlsync@localhost",
}
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_INDEX_LINE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)", re.M)
_FULL_HASH = re.compile(r"^[0-9a-f]{40}$")


class SeriesError(RuntimeError):
    pass


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """An environment where the user's git config cannot change our output."""
    env = dict(os.environ)
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", LC_ALL="C")
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    if extra:
        env.update(extra)
    return env


def git(
    cwd: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    # A ceiling above cwd keeps git from discovering an enclosing repository.
    extra = {"GIT_CEILING_DIRECTORIES": str(Path(cwd).resolve().parent)}
    extra.update(env or {})
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(extra), capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise SeriesError(
            f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}"
        )
    return proc


@dataclass(frozen=True)
class Layout:
    """Where things live in an rlsync checkout."""

    root: Path

    @property
    def pin_file(self) -> Path:
        return self.root / "upstream.pin"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def series_file(self) -> Path:
        return self.patches_dir / "series"

    @property
    def overlay_dir(self) -> Path:
        return self.root / "overlay"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def upstream_dir(self) -> Path:
        """Pristine tree; the sdist is unpacked as its `python/` folder."""
        return self.build_dir / "upstream"

    @property
    def work_dir(self) -> Path:
        return self.build_dir / "work"

    def pin(self) -> Pin:
        return read_pin(self.pin_file)

    def patches(self) -> list[Path]:
        return read_series(self.patches_dir)


def find_root(start: Path | None = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for cand in (here, *here.parents):
        if (cand / "upstream.pin").is_file() and (cand / "patches").is_dir():
            return cand
    raise SeriesError(
        f"no rlsync checkout (upstream.pin + patches/) at or above {here}"
    )


# --- the series -----------------------------------------------------------


def read_series(patches_dir: Path) -> list[Path]:
    series = patches_dir / "series"
    if not series.is_file():
        raise SeriesError(f"{series}: missing")
    names = []
    for line in series.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    problems = []
    for name in names:
        if not (patches_dir / name).is_file():
            problems.append(f"{series}: lists {name}, which does not exist")
    for path in sorted(patches_dir.glob("*.patch")):
        if path.name not in names:
            problems.append(f"{path}: not listed in {series}")
    if len(set(names)) != len(names):
        problems.append(f"{series}: lists a patch twice")
    if problems:
        raise SeriesError("\n".join(problems))
    return [patches_dir / name for name in names]


def touched_files(patch: Path) -> list[str]:
    """Paths a patch changes, in order of first appearance."""
    seen: dict[str, None] = {}
    for a, b in _DIFF_HEADER.findall(patch.read_text()):
        if a != b:
            raise SeriesError(f"{patch.name}: renames are not supported ({a} -> {b})")
        seen[b] = None
    return list(seen)


def series_files(patches: list[Path]) -> list[str]:
    seen: dict[str, None] = {}
    for patch in patches:
        for path in touched_files(patch):
            seen[path] = None
    return sorted(seen)


def lint_patch(patch: Path) -> list[str]:
    """What an upstream reviewer needs, and what keeps diffs unambiguous."""
    text = patch.read_text()
    head, sep, _ = text.partition("\ndiff --git ")
    problems = []
    if not sep:
        return [f"{patch.name}: contains no diff"]
    if not re.search(r"^Subject: \[PATCH\] \S", head, re.M):
        problems.append(f"{patch.name}: no 'Subject: [PATCH] ...' line")
    body = head.split("\n\n", 1)[1] if "\n\n" in head else ""
    body = body.split("\n---\n", 1)[0].strip()
    if len(body.splitlines()) < 2:
        problems.append(f"{patch.name}: the message needs a body saying what and why")
    if not re.search(r"^Forwarded: \S", body, re.M):
        problems.append(f"{patch.name}: the message needs a 'Forwarded: no|<PR>' line")
    headers = _DIFF_HEADER.findall(text)
    files = [b for _, b in headers]
    for name in sorted({f for f in files if files.count(f) > 1}):
        problems.append(f"{patch.name}: {name} has more than one diff; merge them")
    for old, new in _INDEX_LINE.findall(text):
        if not (_FULL_HASH.match(old) and _FULL_HASH.match(new)):
            problems.append(
                f"{patch.name}: abbreviated index {old}..{new}; use --full-index"
            )
            break
    if not re.match(r"From 0{40} ", text):
        problems.append(
            f"{patch.name}: first line must be 'From 0000... ' (--zero-commit)"
        )
    return problems


# --- applying -------------------------------------------------------------


def apply_patches(tree: Path, patches: list[Path], *extra: str) -> None:
    """Apply patches one after another, naming the first that fails (git
    apply cannot stack two patches of one file in a single call)."""
    for patch in patches:
        proc = git(
            tree, "apply", "--whitespace=nowarn", *extra, str(patch), check=False
        )
        if proc.returncode != 0:
            raise SeriesError(
                f"{patch.name} does not apply cleanly:\n"
                f"{(proc.stdout + proc.stderr).strip()}"
            )


def patched_tree(
    layout: Layout, dest: Path, patches: list[Path] | None = None
) -> list[str]:
    """Write pristine + series for the files the series touches into `dest`."""
    patches = layout.patches() if patches is None else patches
    files = series_files(patches)
    pristine = layout.upstream_dir
    for rel in files:
        src = pristine / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    apply_patches(dest, patches)
    return files


def ensure_upstream(layout: Layout) -> Path:
    """Unpack the verified pinned sdist as build/upstream/python (once)."""
    pin = layout.pin()
    stamp = layout.upstream_dir / ".sdist-sha256"
    if stamp.is_file() and stamp.read_text().strip() == pin.sha256:
        return layout.upstream_dir
    sdist = fetch_sdist(pin)
    if layout.upstream_dir.exists():
        shutil.rmtree(layout.upstream_dir)
    layout.upstream_dir.mkdir(parents=True)
    unpack_sdist(pin, sdist, layout.upstream_dir / "python")
    stamp.write_text(sha256_of(sdist) + "\n")
    return layout.upstream_dir


# --- overlay --------------------------------------------------------------


def regenerate_overlay(layout: Layout) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        files = patched_tree(layout, Path(tmp))
        if layout.overlay_dir.exists():
            shutil.rmtree(layout.overlay_dir)
        for rel in files:
            dst = layout.overlay_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / rel, dst)
    regenerate_vendored(layout)
    return files


# Modules of the series that the trainer library carries as generated copies
# (standard library only): copy -> overlay source. `make overlay` writes them;
# `make check` fails on drift. Edit the source in build/work, never the copy.
VENDORED = {
    "python/rlsync/update_group_net.py": (
        "python/sglang/srt/weight_sync/update_group_net.py"
    ),
}


def vendored_text(layout: Layout, source: str) -> str:
    header = f"# Generated from overlay/{source} by `make overlay`; do not edit.\n"
    return header + (layout.overlay_dir / source).read_text()


def regenerate_vendored(layout: Layout) -> list[str]:
    for copy, source in VENDORED.items():
        (layout.root / copy).parent.mkdir(parents=True, exist_ok=True)
        (layout.root / copy).write_text(vendored_text(layout, source))
    return sorted(VENDORED)


def check_vendored(layout: Layout) -> list[str]:
    problems = []
    for copy, source in VENDORED.items():
        path = layout.root / copy
        if not (layout.overlay_dir / source).is_file():
            problems.append(f"{copy}: its source overlay/{source} is missing")
        elif not path.is_file() or path.read_text() != vendored_text(layout, source):
            problems.append(
                f"{copy}: differs from overlay/{source} (edit build/work, "
                f"then `make patches overlay`)"
            )
    return problems


def overlay_files(layout: Layout) -> list[str]:
    if not layout.overlay_dir.is_dir():
        return []
    return sorted(
        p.relative_to(layout.overlay_dir).as_posix()
        for p in layout.overlay_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def _first_difference(rel: str, expected: bytes, actual: bytes) -> str:
    exp = expected.decode(errors="replace").splitlines(keepends=True)
    act = actual.decode(errors="replace").splitlines(keepends=True)
    diff = list(
        difflib.unified_diff(exp, act, f"pristine+series/{rel}", f"overlay/{rel}", n=1)
    )
    return "".join(diff[:12]).rstrip() or "(differs only in line endings or bytes)"


def check(layout: Layout) -> list[str]:
    """Every way the series, the pristine tree and the overlay can disagree."""
    try:
        patches = layout.patches()
    except SeriesError as e:
        return [str(e)]
    problems: list[str] = []
    for patch in patches:
        problems.extend(lint_patch(patch))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = patched_tree(layout, Path(tmp), patches)
        except SeriesError as e:
            return problems + [str(e)]
        present = set(overlay_files(layout))
        for rel in files:
            if rel not in present:
                problems.append(
                    f"overlay/{rel}: missing (a patch touches it; run `make overlay`)"
                )
                continue
            expected = (Path(tmp) / rel).read_bytes()
            actual = (layout.overlay_dir / rel).read_bytes()
            if expected != actual:
                problems.append(
                    f"overlay/{rel}: differs from pristine + series "
                    f"(edit build/work and run `make patches overlay`)\n"
                    + _first_difference(rel, expected, actual)
                )
        for rel in sorted(present - set(files)):
            problems.append(f"overlay/{rel}: no patch touches this file")
    problems.extend(check_series_number(layout))
    problems.extend(check_library_version(layout))
    problems.extend(check_vendored(layout))
    return problems


INFO_MODULE = "python/sglang/srt/weight_sync/rlsync_info.py"


def check_series_number(layout: Layout) -> list[str]:
    """The series number the server reports (/rlsync_info) is the pin's."""
    info = layout.overlay_dir / INFO_MODULE
    if not info.is_file():
        return []
    found = re.search(r"^SERIES = (\d+)$", info.read_text(), re.M)
    want = layout.pin().series
    if found is None or int(found.group(1)) != int(want):
        got = found.group(1) if found else "none"
        return [
            f"overlay/{INFO_MODULE}: SERIES = {got}, but upstream.pin says "
            f"series = {want}; bump both together (in build/work)"
        ]
    return []


LIBRARY_INIT = "python/rlsync/__init__.py"


def check_library_version(layout: Layout) -> list[str]:
    """The trainer library says the series it speaks: SERIES and a version
    0.<series>.<n>, both the pin's."""
    init = layout.root / LIBRARY_INIT
    if not init.is_file():
        return [f"{LIBRARY_INIT}: missing"]
    text = init.read_text()
    series_found = re.search(r"^SERIES = (\d+)$", text, re.M)
    version_found = re.search(r'^__version__ = "0\.(\d+)\.\d+"', text, re.M)
    want = str(layout.pin().series)
    problems = []
    if series_found is None or series_found.group(1) != want:
        problems.append(
            f"{LIBRARY_INIT}: SERIES is not {want}, the series upstream.pin names"
        )
    if version_found is None or version_found.group(1) != want:
        problems.append(
            f'{LIBRARY_INIT}: __version__ must be "0.{want}.<n>" (the series it speaks)'
        )
    return problems


# --- developer worktree ---------------------------------------------------


def make_worktree(layout: Layout) -> Path:
    """build/work: a git repository at the pin, one commit per patch."""
    pristine = ensure_upstream(layout)
    work = layout.work_dir
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    dates = {"GIT_AUTHOR_DATE": BASE_DATE, "GIT_COMMITTER_DATE": BASE_DATE}
    git(work, "init", "--quiet", "--initial-branch=rlsync")
    git(work, "config", "user.name", IDENTITY["GIT_AUTHOR_NAME"])
    git(work, "config", "user.email", IDENTITY["GIT_AUTHOR_EMAIL"])
    git(work, "config", "core.autocrlf", "false")
    shutil.copytree(pristine / "python", work / "python")
    git(work, "add", "--all", "--force", "python")
    pin = layout.pin()
    git(
        work, "commit", "--quiet", "--no-verify", "-m",
        f"{pin.name} {pin.version} (pristine sdist {pin.sha256[:12]})",
        env={**IDENTITY, **dates},
    )  # fmt: skip
    git(work, "tag", "upstream")
    patches = layout.patches()
    if patches:
        git(
            work, "am", "--quiet", "--keep-cr", "--committer-date-is-author-date",
            *map(str, patches), env=IDENTITY,
        )  # fmt: skip
    return work


def export_patches(layout: Layout) -> list[Path]:
    """Re-export build/work's commits since the pin as the series."""
    work = layout.work_dir
    if not (work / ".git").is_dir():
        raise SeriesError(f"{work}: no worktree; run `make worktree` first")
    dirty = git(work, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if dirty:
        raise SeriesError(f"{work}: uncommitted changes; commit them first:\n{dirty}")
    with tempfile.TemporaryDirectory() as tmp:
        git(
            work, "format-patch", "--quiet", "--zero-commit", "--full-index",
            "--no-signature", "--no-numbered", "--no-stat", "--no-renames",
            "--no-binary", "--diff-algorithm=myers", "--output-directory", tmp,
            "upstream..HEAD",
        )  # fmt: skip
        exported = sorted(Path(tmp).glob("*.patch"))
        for path in exported:
            text = re.sub(
                r"^Date: .*$", f"Date: {PATCH_DATE}", path.read_text(), 1, re.M
            )
            path.write_text(text)
        for old in layout.patches_dir.glob("*.patch"):
            old.unlink()
        for path in exported:
            shutil.copyfile(path, layout.patches_dir / path.name)
    layout.series_file.write_text("".join(p.name + "\n" for p in exported))
    return [layout.patches_dir / p.name for p in exported]
