"""Apply the series to, or remove it from, a user's SGLang tree.

Accepted trees (the patches name `python/sglang/...`; paths are mapped):
  - a checkout of the upstream repository (`<repo>/python/sglang`), git or not;
  - an unpacked sdist (`sglang-<v>/sglang`, with `PKG-INFO`/`pyproject.toml`);
  - a site-packages directory holding `sglang/` and `sglang-<v>.dist-info/`;
  - the `sglang` package directory itself (what `import sglang` points at).

All-or-nothing: the new content of every file is computed first, in a scratch
directory (or in memory), and only then written; nothing is written when any
hunk fails. When a plain apply does not fit and the tree is a git checkout,
a 3-way merge (base: the release's files, named by the blob ids the patches
record) is used instead. Neither path touches the git index, so uncommitted
edits stay uncommitted and take part as they are; `revert` undoes either kind
of apply, byte for byte.
"""

from __future__ import annotations

import ast
import base64
import email.utils
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devtools import series
from devtools.pin import Pin
from devtools.series import SeriesError, apply_patches, git, series_files

PACKAGE = "python/sglang"
_NO_BLOB = re.compile(r"^0+$")


class CheckoutError(SeriesError):
    pass


# --- where the tree is, and what it is --------------------------------------


@dataclass(frozen=True)
class Target:
    """An SGLang tree: `root`, and the prefix of series paths it lacks."""

    root: Path
    kind: str  # "checkout", "sdist" or "site-packages"
    strip: str  # "" for a checkout, "python/" otherwise

    def path(self, rel: str) -> Path:
        if not rel.startswith(self.strip):
            raise CheckoutError(
                f"{rel} lies outside the sglang package, so it cannot be written "
                f"into {self.kind} {self.root}; use a checkout of the repository"
            )
        return self.root / rel[len(self.strip) :]

    @property
    def package(self) -> Path:
        return self.path(PACKAGE)

    @property
    def is_git(self) -> bool:
        return is_git_toplevel(self.root)


def is_git_toplevel(tree: Path) -> bool:
    if not (tree / ".git").exists():
        return False
    proc = git(tree, "rev-parse", "--show-toplevel", check=False)
    return (
        proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == tree.resolve()
    )


def _is_package(path: Path) -> bool:
    return (
        path.name == "sglang"
        and (path / "__init__.py").is_file()
        and (path / "srt").is_dir()
    )


def _dist_infos(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("sglang-*.dist-info") if p.is_dir())


def find_target(tree: Path) -> Target:
    given = tree
    tree = tree.resolve()
    if not tree.is_dir():
        raise CheckoutError(f"{given}: no such directory")
    if _is_package(tree):
        tree = tree.parent
    if (tree / "python" / "sglang").is_dir():
        return Target(tree, "checkout", "")
    if _is_package(tree / "sglang"):
        if tree.name == "python" and is_git_toplevel(tree.parent):
            return Target(tree.parent, "checkout", "")
        sdist = (tree / "PKG-INFO").is_file() or (tree / "pyproject.toml").is_file()
        if _dist_infos(tree) and not sdist:
            return Target(tree, "site-packages", "python/")
        return Target(tree, "sdist", "python/")
    hint = ""
    if _dist_infos(tree):
        hint = (
            "; SGLang is installed here from elsewhere (an editable install?): pass "
            "the directory `python -c 'import sglang,os;"
            "print(os.path.dirname(sglang.__file__))'` prints"
        )
    raise CheckoutError(
        f"{given}: no python/sglang/ here, nor sglang/; pass the root of an SGLang "
        f"checkout, an unpacked sdist (sglang-<version>/), a site-packages "
        f"directory holding sglang/, or the sglang package directory{hint}"
    )


# --- which version --------------------------------------------------------


def _version_from_file(path: Path) -> str | None:
    """`__version__ = "x"` in a version file, read without importing it."""
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            # `__version__ = version = "0.5.10"` is one Assign with two targets.
            if "__version__" in names and isinstance(node.value.value, str):
                return node.value.value
    return None


def _metadata_version(path: Path) -> str | None:
    """`Version:` of a PKG-INFO or METADATA file."""
    if not path.is_file():
        return None
    m = re.search(r"^Version: *(\S+)$", path.read_text(errors="replace"), re.M)
    return m.group(1) if m else None


def _pyproject_version(path: Path) -> str | None:
    """A static `version = "x"` in pyproject.toml's [project] table."""
    if not path.is_file():
        return None
    m = re.search(r"^\[project\]$(.*?)(?=^\[|\Z)", path.read_text(), re.M | re.S)
    found = m and re.search(r"""^version *= *["']([^"']+)["']""", m.group(1), re.M)
    return found.group(1) if found else None


def _git_version(root: Path) -> tuple[str, str] | None:
    """The nearest release tag behind HEAD (local commits on top are fine)."""
    proc = git(
        root, "describe", "--tags", "--long", "--match", "v[0-9]*", "HEAD", check=False
    )
    if proc.returncode != 0:
        return None
    described = proc.stdout.strip()
    tag, ahead, _ = described.rsplit("-", 2)
    where = f"HEAD is {tag}" if ahead == "0" else f"HEAD is {ahead} commits on {tag}"
    return tag.removeprefix("v"), f"git describe: {where}"


def _file_version(target: Target) -> tuple[str, str] | None:
    """The version the tree's metadata and version files give (the first
    found), refused where two of them disagree: a package dir of one
    release with the metadata of another would get the other's series."""
    base = target.path("python/")
    candidates = [base / "PKG-INFO", base / "pyproject.toml"]
    candidates += [d / "METADATA" for d in _dist_infos(base)]
    candidates += [target.package / "version.py", target.package / "_version.py"]
    found: list[tuple[str, str]] = []
    for path in candidates:
        if path.name in ("PKG-INFO", "METADATA"):
            version = _metadata_version(path)
        elif path.name == "pyproject.toml":
            version = _pyproject_version(path)
        else:
            version = _version_from_file(path)
        if version:
            found.append((version, str(path.relative_to(target.root))))
    releases = {version.split("+")[0] for version, _ in found}
    if len(releases) > 1:
        said = ", ".join(f"{where} says {version}" for version, where in found)
        raise CheckoutError(
            f"{target.root}: its files disagree on SGLang's version ({said}); "
            "nothing was changed: reinstall SGLang so that one release is left"
        )
    return found[0] if found else None


def _detect(target: Target) -> tuple[str, str] | None:
    """(version, where it was read). A git checkout's tags come first: a
    checkout's `_version.py`, where there is one, is a build's leftover."""
    if target.is_git:
        found = _git_version(target.root)
        if found:
            return found
    return _file_version(target)


def detect_version(tree: Path) -> str | None:
    """SGLang's version of any accepted tree (see the module's docstring)."""
    found = _detect(find_target(tree))
    return found[0] if found else None


def check_tree(tree: Path, pin: Pin, supported: list[str] | None = None) -> Target:
    """The tree, if it holds SGLang `pin.version`; else CheckoutError naming
    the versions the series exists for (`supported`, default the pin's)."""
    versions = ", ".join(supported or [pin.version, *pin.serves])
    target = find_target(tree)
    infos = {_metadata_version(d / "METADATA") for d in _dist_infos(target.root)}
    if target.kind == "site-packages" and len(infos) > 1:
        raise CheckoutError(
            f"{target.root}: several sglang dist-info directories "
            f"({', '.join(d.name for d in _dist_infos(target.root))}); "
            f"reinstall SGLang {pin.version} so that one is left"
        )
    found = _detect(target)
    if found is None:
        tags = " (git: no release tag v* behind HEAD; `git fetch --tags`?)"
        raise CheckoutError(
            f"{target.root}: cannot tell its SGLang version (no PKG-INFO, no "
            f"dist-info METADATA, no sglang/_version.py"
            f"{tags if target.is_git else ''}); the series needs {versions}"
        )
    version, source = found
    if version.split("+")[0] not in (pin.version, *pin.serves):
        raise CheckoutError(
            f"{target.root}: SGLang {version} found ({source}), but the series is "
            f"for {versions}; use SGLang {versions.replace(', ', ' or ')} (in a "
            f"git checkout: the release's tag, local commits on top are fine)"
        )
    return target


# --- generated files --------------------------------------------------------


def _generated_files(layout: series.Layout) -> dict[str, str]:
    """Build-time generated modules of the series, {series path: text}."""
    return dict(series.generated_files(layout))


def _generated_for(patches: list[Path], given: dict[str, str] | None) -> dict:
    if given is not None:
        return dict(given)
    if not patches:
        return {}
    try:
        root = series.find_root(patches[0].parent)
        layout = series.Layout(root, patches[0].parent.parent.name)
    except SeriesError:
        return {}
    return _generated_files(layout)


def _check_generated(generated: dict[str, str], patched: list[str]) -> None:
    both = sorted(set(generated) & set(patched))
    if both:
        raise CheckoutError(
            f"generated files also touched by a patch: {', '.join(both)}"
        )


# --- computing new contents -----------------------------------------------


Contents = dict[str, "bytes | None"]


def _snapshot(target: Target, rels: list[str]) -> Contents:
    out: Contents = {}
    for rel in rels:
        path = target.path(rel)
        out[rel] = path.read_bytes() if path.is_file() else None
    return out


def _run_patches(
    contents: Contents, patches: list[Path], *flags: str
) -> tuple[Contents | None, str]:
    """The patches applied to `contents` in a scratch tree (series paths):
    (new contents, "") or (None, why)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "tree"
        scratch.mkdir()
        for rel, data in contents.items():
            if data is not None:
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                (scratch / rel).write_bytes(data)
        try:
            apply_patches(scratch, patches, *flags)
        except SeriesError as e:
            return None, str(e)
        return {
            rel: (scratch / rel).read_bytes() if (scratch / rel).is_file() else None
            for rel in contents
        }, ""


def _pristine_blobs(patches: list[Path]) -> dict[str, str | None]:
    """Each file's blob id before the series (None: the series creates it),
    from the first `index <old>..<new>` line of its first patch."""
    blobs: dict[str, str | None] = {}
    for patch in patches:
        current = None
        for line in patch.read_text().splitlines():
            m = re.match(r"^diff --git a/(\S+) b/\S+$", line)
            if m:
                current = m.group(1) if m.group(1) not in blobs else None
                continue
            m = re.match(r"^index ([0-9a-f]+)\.\.[0-9a-f]+", line)
            if m and current is not None:
                blobs[current] = None if _NO_BLOB.match(m.group(1)) else m.group(1)
                current = None
    return blobs


def _git_bytes(repo: Path, *args: str) -> bytes | None:
    proc = subprocess.run(
        ["git", *args],
        cwd=repo,
        env=series.git_env({"GIT_CEILING_DIRECTORIES": str(repo.resolve().parent)}),
        capture_output=True,
    )
    return proc.stdout if proc.returncode == 0 else None


def _merge(
    ours: bytes | None, base: bytes | None, theirs: bytes | None
) -> tuple[bytes | None, bool]:
    """git merge-file of one file: (result, clean)."""
    if ours == base or ours == theirs:
        return theirs, True
    if theirs == base:
        return ours, True
    if ours is None or base is None or theirs is None:
        return ours, False  # created or removed on one side, edited on the other
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (Path(tmp) / name).write_bytes(data)
            names.append(name)
        proc = git(Path(tmp), "merge-file", "--quiet", *names, check=False)
        return (Path(tmp) / "ours").read_bytes(), proc.returncode == 0


def _three_way(
    target: Target, patches: list[Path], current: Contents, reverse: bool
) -> tuple[Contents | None, str]:
    """Merge the series into (or, reversed, out of) the current files: base
    and other side are the release's blobs and those blobs + the series."""
    blobs = _pristine_blobs(patches)
    pristine: Contents = {}
    missing = []
    for rel in current:
        blob = blobs.get(rel)
        pristine[rel] = (
            None if blob is None else _git_bytes(target.root, "cat-file", "blob", blob)
        )
        if blob is not None and pristine[rel] is None:
            missing.append(f"{rel} ({blob[:12]})")
    if missing:
        return None, (
            f"no 3-way merge: {target.root} lacks the release's version of "
            f"{', '.join(missing)}"
        )
    patched, why = _run_patches(pristine, patches)
    if patched is None:
        raise CheckoutError(f"the series does not apply to its own release:\n{why}")
    base, other = (patched, pristine) if reverse else (pristine, patched)
    merged: Contents = {}
    conflicts = []
    for rel in current:
        merged[rel], clean = _merge(current[rel], base[rel], other[rel])
        if not clean:
            conflicts.append(rel)
    if conflicts:
        return None, f"3-way merge conflicts in: {', '.join(conflicts)}"
    return merged, ""


def _uncommitted(target: Target, rels: list[str]) -> list[str]:
    """Those of `rels` with uncommitted edits (staged or not, or untracked)."""
    if not target.is_git:
        return []
    paths = [str(target.path(rel).relative_to(target.root)) for rel in rels]
    proc = git(target.root, "status", "--porcelain", "--", *paths, check=False)
    return sorted(line[3:] for line in proc.stdout.splitlines() if line.strip())


def _advice(target: Target, rels: list[str]) -> str:
    dirty = _uncommitted(target, rels)
    if not dirty:
        return ""
    return (
        f"\nuncommitted edits in: {', '.join(dirty)}\nThey take part in the merge "
        f"as they are (nothing is staged or committed by apply/revert). If they "
        f"are what conflicts, commit them or `git stash` them, run this again, "
        f"then `git stash pop` and resolve the conflict there."
    )


# Beside the files a write changes, their contents before it: written (whole,
# by rename) before the first change and removed after the last, so a write
# that was killed (SIGKILL, a second Ctrl-C, a lost machine) is undone by the
# next apply or revert instead of leaving a half-patched tree.
UNDO_JOURNAL = ".rlsync-undo.json"


# What an apply wrote the tree with: its patches (their text) and generated
# files, so that a revert takes out exactly those, even once rlsync and its
# series have moved on; written and removed with the series' own files.
APPLIED_RECORD = f"{PACKAGE}/.rlsync-applied.json"


def _record_bytes(patches: list[Path], generated: dict[str, str]) -> bytes:
    record = {
        "patches": {patch.name: patch.read_text() for patch in patches},
        "generated": sorted(generated),
    }
    return json.dumps(record, indent=1).encode()


def _read_record(target: Target) -> dict | None:
    path = target.path(APPLIED_RECORD)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_bytes())
        if not isinstance(record["patches"], dict) or not isinstance(
            record["generated"], list
        ):
            raise TypeError("patches: a mapping, generated: a list")
        return record
    except (ValueError, KeyError, TypeError) as e:
        raise CheckoutError(
            f"{path}: an unreadable record of the series applied here ({e}); "
            "nothing was changed: reinstall SGLang"
        ) from e


def _write(target: Target, changes: Contents) -> None:
    """Write (bytes) or remove (None) files, all or nothing: every target is
    checked for write access first; the files' contents before are kept in
    the undo journal until every write is done; a write that fails anyway
    (disk full, an interrupt) puts back every file already written before
    the error is raised. Each file is replaced by a rename, never rewritten
    in place: a hard-linked copy elsewhere (an installer's cache, another
    environment) keeps its contents. Empty directories left by a removal are
    removed too, up to the sglang package."""
    paths = {rel: target.path(rel) for rel in changes}  # all mapped before writing
    refused = [rel for rel, path in sorted(paths.items()) if not _writable(path)]
    if refused:
        raise CheckoutError(
            f"cannot write {', '.join(refused)} in {target.root} (permission "
            "denied); nothing was changed: run as the tree's owner, or use a "
            "tree you can write to (for site-packages, the environment's owner)"
        )
    before = _snapshot(target, list(changes))
    journal = target.package / UNDO_JOURNAL
    _replace(journal, _journal_bytes(before))
    done: list[str] = []
    try:
        for rel, data in sorted(changes.items()):
            done.append(rel)
            _put(target, paths[rel], data)
    except BaseException as e:
        _put_back(target, {rel: before[rel] for rel in done})
        journal.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise CheckoutError(
                f"writing {done[-1]} in {target.root} failed ({e}); the files "
                "written before it were put back, nothing was changed"
            ) from e
        raise
    journal.unlink()


def _journal_bytes(before: Contents) -> bytes:
    files = {
        rel: None if data is None else base64.b64encode(data).decode()
        for rel, data in before.items()
    }
    return json.dumps({"rlsync_undo": 1, "files": files}).encode()


def _put_back(target: Target, before: Contents) -> list[str]:
    """Put each file back as it was; the ones that could not be."""
    failed = []
    for rel, data in sorted(before.items(), reverse=True):
        try:
            _put(target, target.path(rel), data)
        except OSError:
            failed.append(rel)
    return failed


def undo_interrupted_write(target: Target) -> str:
    """Put back the files of a write that was killed before it finished (its
    undo journal is still there): "" if there was none, else what was done."""
    journal = target.package / UNDO_JOURNAL
    if not journal.is_file():
        return ""
    try:
        files = json.loads(journal.read_bytes())["files"]
        before = {
            rel: None if text is None else base64.b64decode(text)
            for rel, text in files.items()
        }
    except (ValueError, KeyError, TypeError) as e:
        raise CheckoutError(
            f"{journal}: an unreadable undo journal of an interrupted apply or "
            f"revert ({e}); nothing was changed: reinstall SGLang, or remove "
            "the file if the tree is known to be whole"
        ) from e
    failed = _put_back(target, before)
    if failed:
        raise CheckoutError(
            f"an apply or revert that was interrupted left {target.root} half "
            f"written, and {', '.join(failed)} could not be put back; the undo "
            f"journal ({journal}) is kept: run as the tree's owner and try again"
        )
    journal.unlink()
    return (
        f"an apply or revert that was interrupted was undone first "
        f"({len(before)} files put back); "
    )


def _writable(path: Path) -> bool:
    """The file (or, for a new one, its nearest existing folder) can be
    written by this process."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if probe == path:
        return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    return os.access(probe, os.W_OK | os.X_OK)


def _put(target: Target, path: Path, data: bytes | None) -> None:
    if data is None:
        if path.is_file():
            path.unlink()
        parent = path.parent
        while parent != target.package and parent.is_dir():
            if any(parent.iterdir()):
                break
            parent.rmdir()
            parent = parent.parent
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _replace(path, data)


def _replace(path: Path, data: bytes) -> None:
    """`path` holds `data`, by a rename of a new file over it (keeping its
    mode): whole or not at all, and no hard link to it changes."""
    mode = path.stat().st_mode & 0o7777 if path.is_file() else None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _changed(before: Contents, after: Contents) -> Contents:
    return {rel: data for rel, data in after.items() if data != before[rel]}


# --- the commands ---------------------------------------------------------


def _prepare(
    tree: Path, pin: Pin, patches: list[Path], generated: dict[str, str] | None
) -> tuple[Target, dict[str, str], list[str], str]:
    """The checked tree, the generated modules, the files the series
    touches, and what was undone of an interrupted write: what apply and
    revert start from."""
    target = check_tree(tree, pin)
    generated = _generated_for(patches, generated)
    rels = series_files(patches)
    _check_generated(generated, rels)
    return target, generated, rels, undo_interrupted_write(target)


def apply_series(
    tree: Path,
    pin: Pin,
    patches: list[Path],
    generated: dict[str, str] | None = None,
) -> str:
    target, generated, rels, undone = _prepare(tree, pin, patches, generated)
    if not patches and not generated:
        return undone + "the series is empty; nothing to apply"
    record = _record_bytes(patches, generated)
    applied = target.path(APPLIED_RECORD)
    if applied.is_file() and applied.read_bytes() != record:
        raise CheckoutError(
            f"{target.root} carries the series as another version of rlsync "
            f"applied it ({APPLIED_RECORD.removeprefix(target.strip)} names "
            "other patches); nothing was changed: `make revert` takes out what "
            "was applied, then `make apply` applies this series"
        )
    current = _snapshot(target, rels)
    how = ""
    result, _ = _run_patches(current, list(reversed(patches)), "--reverse")
    if result is not None:
        result = current  # applied already
    else:
        result, why = _run_patches(current, patches)
    if result is None and target.is_git:
        result, why3 = _three_way(target, patches, current, reverse=False)
        why = f"{why}\n{why3}"
        how = " (3-way merge)"
    if result is None:
        no_git = "" if target.is_git else "\n(a 3-way merge needs a git checkout)"
        raise CheckoutError(
            f"the series does not apply to {target.root}; nothing was changed:\n"
            f"{why}{no_git}{_advice(target, rels)}"
        )
    changes = _changed(current, result)
    gen_changes = _changed(
        _snapshot(target, list(generated)),
        {rel: text.encode() for rel, text in generated.items()},
    )
    # The user's own edits: asked before the write, which changes every file.
    dirty = _uncommitted(target, [r for r in rels if current[r] is not None])
    record_change = _changed(
        _snapshot(target, [APPLIED_RECORD]), {APPLIED_RECORD: record}
    )
    _write(target, {**changes, **gen_changes, **record_change})
    gen_note = f"; {len(gen_changes)} generated files written" if gen_changes else ""
    if not changes:
        return undone + (
            f"the series ({len(patches)} patches) is already applied to "
            f"{target.root}{gen_note}"
        )
    kept = f"; uncommitted edits kept in {', '.join(dirty)}" if how and dirty else ""
    return undone + (
        f"applied {len(patches)} patches to {target.kind} {target.root}{how}"
        f"{gen_note}{kept}"
    )


def revert_series(
    tree: Path,
    pin: Pin,
    patches: list[Path],
    generated: dict[str, str] | None = None,
) -> str:
    target, generated, rels, undone = _prepare(tree, pin, patches, generated)
    record = _read_record(target)
    if record is None:
        return undone + _revert(target, patches, list(generated), rels)
    # Exactly what was applied, whichever series this checkout has now.
    with tempfile.TemporaryDirectory() as tmp:
        applied = []
        for name, text in record["patches"].items():
            (Path(tmp) / name).write_text(text)
            applied.append(Path(tmp) / name)
        rels = series_files(applied)
        return undone + _revert(target, applied, record["generated"], rels)


def _revert(
    target: Target, patches: list[Path], generated: list[str], rels: list[str]
) -> str:
    if not patches and not generated:
        return "the series is empty; nothing to revert"
    current = _snapshot(target, rels)
    how = ""
    result, why = _run_patches(current, list(reversed(patches)), "--reverse")
    if result is None:
        forward, _ = _run_patches(current, patches)
        if forward is not None:
            result = current  # not applied
        elif target.is_git:
            result, why3 = _three_way(target, patches, current, reverse=True)
            why = f"{why}\n{why3}"
            how = " (3-way merge)"
    if result is None:
        raise CheckoutError(
            f"the series cannot be reverted cleanly from {target.root} (files "
            f"changed since it was applied); nothing was changed:\n{why}"
            f"{_advice(target, rels)}"
        )
    changes = _changed(current, result)
    # A tree the series is not applied to keeps any file of that name.
    gen_removed = {
        rel: None for rel in generated if changes and target.path(rel).is_file()
    }
    record_removed: Contents = {}
    if target.path(APPLIED_RECORD).is_file():
        record_removed[APPLIED_RECORD] = None
    _write(target, {**changes, **gen_removed, **record_removed})
    gen_note = f"; {len(gen_removed)} generated files removed" if gen_removed else ""
    if not changes:
        return (
            f"the series is not applied to {target.root}; nothing to revert{gen_note}"
        )
    return f"reverted {len(patches)} patches from {target.root}{how}{gen_note}"


def _user_config(repo: Path, key: str) -> str:
    """git config as the user has it (global config included)."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(repo.resolve().parent))
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(name, None)
    proc = subprocess.run(
        ["git", "config", "--get", key],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def resolve_author(repo: Path, author: str | None) -> tuple[str, str]:
    """(name, mail) from `Name <mail>`, else from the checkout's git config."""
    if author is not None:
        name, mail = email.utils.parseaddr(author)
        if not (name and mail and "<" in author and "@" in mail):
            raise CheckoutError(
                f'the author must read "Name <mail>" (got {author!r}); '
                f'make pr-branch SGLANG_DIR=... AUTHOR="Name <mail>"'
            )
        return name, mail
    name, mail = _user_config(repo, "user.name"), _user_config(repo, "user.email")
    if not (name and mail):
        lacking = " and ".join(
            key
            for key, value in (("user.name", name), ("user.email", mail))
            if not value
        )
        raise CheckoutError(
            f"no author for the commits: {repo} has no git config {lacking}; pass "
            f'AUTHOR="Name <mail>" (make pr-branch) or --author, or run '
            f"`git config user.name ...` and `git config user.email ...` there"
        )
    return name, mail


def _git_now(
    cwd: Path, *args: str, env: dict[str, str], check: bool = False
) -> subprocess.CompletedProcess:
    """`git` as series.git runs it, without any fixed identity or date."""
    full = series.git_env({"GIT_CEILING_DIRECTORIES": str(cwd.resolve().parent)})
    for key in ("AUTHOR", "COMMITTER"):
        for part in ("NAME", "EMAIL", "DATE"):
            full.pop(f"GIT_{key}_{part}", None)
    full.update(env)
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=full, capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise CheckoutError(
            f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}"
        )
    return proc


def _with_author(patch: Path, dest: Path, name: str, mail: str) -> Path:
    """A copy of the patch whose `From:` header names the author."""
    head, sep, rest = patch.read_text().partition("\n\n")
    sender = email.utils.formataddr((name, mail))
    head = re.sub(
        r"^From: .*(?:\n[ \t].*)*$",
        lambda _: f"From: {sender}",
        head,
        count=1,
        flags=re.M,
    )
    out = dest / patch.name
    out.write_text(head + sep + rest)
    return out


def _commit_patches(
    scratch: Path,
    authored: list[Path],
    extras: dict[str, dict[str, bytes]],
    env: dict[str, str],
) -> subprocess.CompletedProcess:
    """`git am` each patch in turn, its extras added to its own commit; the
    first command that fails."""
    am = ["am", "--quiet", "--keep-cr", "--ignore-date", "--signoff"]
    proc = subprocess.CompletedProcess(am, 0, "", "")  # no patch: nothing failed
    for patch in authored:
        proc = _git_now(scratch, *am, str(patch), env=env)
        files = extras.get(patch.name, {})
        if proc.returncode != 0:
            break
        if not files:
            continue
        for rel, data in files.items():
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            (scratch / rel).write_bytes(data)
        git(scratch, "add", "--force", "--", *files)
        amend = ["commit", "--quiet", "--amend", "--no-edit", "--no-verify"]
        proc = _git_now(scratch, *amend, env=env)
        if proc.returncode != 0:
            break
    return proc


def pr_branch(
    tree: Path,
    pin: Pin,
    patches: list[Path],
    branch: str | None = None,
    author: str | None = None,
    generated: dict[str, str] | None = None,
    extras: dict[str, dict[str, bytes]] | None = None,
    stack: list[tuple[str, int]] | None = None,
) -> str:
    """A branch off HEAD with one commit per patch, by `author`, each signed
    off by the author and dated now; the checkout is untouched. `extras`:
    {patch file name: {path: bytes}}, files its commit adds beside the
    patch's changes (its unit tests and docs page). `stack`: the stacked
    pull requests, [(name, how many of the patches in turn it takes)]; each
    named one gets a branch `<branch>-<name>` at its last commit."""
    target = check_tree(tree, pin)
    if target.kind != "checkout" or not target.is_git:
        raise CheckoutError(
            f"{target.root}: not a git checkout of the SGLang repository "
            f"(python/sglang/ at its root); pr-branch needs one"
        )
    repo = target.root
    name, mail = resolve_author(repo, author)
    generated = _generated_for(patches, generated)
    branch = branch or f"rlsync/{pin.version}-series{pin.series}"
    pulls = [(f"{branch}-{name}", count) for name, count in stack or [] if name]
    for each in [branch] + [name for name, _ in pulls]:
        exists = git(
            repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{each}", check=False
        )
        if exists.returncode == 0:
            raise CheckoutError(
                f"branch {each} already exists in {repo}; delete it first"
            )
    # Dates are now: no GIT_*_DATE from the caller's environment either.
    env = {"GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": mail}
    with tempfile.TemporaryDirectory() as tmp:
        authored = [_with_author(p, Path(tmp), name, mail) for p in patches]
        scratch = Path(tmp) / "scratch"
        git(repo, "worktree", "add", "--quiet", "-b", branch, str(scratch), "HEAD")
        try:
            proc = _commit_patches(scratch, authored, extras or {}, env)
            if proc.returncode != 0:
                git(scratch, "am", "--abort", check=False)
                git(repo, "worktree", "remove", "--force", str(scratch), check=False)
                git(repo, "branch", "-D", branch, check=False)
                raise CheckoutError(
                    f"git am of the series on HEAD of {repo} failed, so no branch "
                    "was made: a patch that does not apply (pr-branch applies "
                    "each as it is, without a 3-way merge: start from a HEAD "
                    "without local changes to the patched lines, e.g. the "
                    "release tag) or a hook of the checkout that refused:\n"
                    f"{proc.stdout}{proc.stderr}"
                )
            if generated:
                for rel, text in generated.items():
                    (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                    (scratch / rel).write_text(text)
                git(scratch, "add", "--force", "--", *generated)
                proc = _git_now(
                    scratch,
                    "commit",
                    "--quiet",
                    "--signoff",
                    f"--author={name} <{mail}>",
                    "-m",
                    "rlsync: add the series' generated modules",
                    env=env,
                )
                if proc.returncode != 0:
                    git(
                        repo, "worktree", "remove", "--force", str(scratch), check=False
                    )
                    git(repo, "branch", "-D", branch, check=False)
                    raise CheckoutError(
                        f"committing the generated modules on {branch} failed "
                        "(a commit hook of the checkout?); the branch was "
                        f"removed:\n{proc.stdout}{proc.stderr}"
                    )
            if pulls:
                made = git(
                    scratch, "rev-list", "--reverse", f"HEAD~{len(patches)}..HEAD"
                )
                commits, end = made.stdout.split(), 0
                for pull_branch, taken in pulls:
                    end += taken
                    git(repo, "branch", pull_branch, commits[end - 1])
        finally:
            git(repo, "worktree", "remove", "--force", str(scratch), check=False)
            git(repo, "worktree", "prune", check=False)
    count = len(patches) + (1 if generated else 0)
    note = ""
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no").stdout
    if dirty.strip():
        files = ", ".join(line[3:] for line in dirty.splitlines())
        note = f"\nnote: uncommitted edits are not on the branch (it starts at HEAD): {files}"
    stacked = ""
    if pulls:
        bases = ["HEAD"] + [name for name, _ in pulls]
        stacked = "\nstacked pull requests: " + ", ".join(
            f"{each} ({n} commits, on {base})" for (each, n), base in zip(pulls, bases)
        )
    return (
        f"created branch {branch} in {repo} with {count} commits by {name} "
        f"<{mail}>{stacked}{note}"
    )
