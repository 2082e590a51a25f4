"""The patch series against pinned SGLang: the one source of truth.

Each pin (`pins/<version>/`: `upstream.pin`, `patches/`, `overlay/`) has its
own series: `patches/series` lists, in order, `<name>.patch` files in `git
format-patch` form (named for what they do: devtools.patch_names). The overlay (`overlay/python/...`) is generated from
pristine + series and checked for drift; the modules every pin shares live
once in `common/`, and each pin's series must build them byte-identical. The
developer worktree (`build/<version>/work`) is a git repository at the pin
with the series applied as commits, exported back deterministically.

Standard library and git only.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devtools.imports import unresolved_imports
from devtools.patch_names import check_names, export_names, features
from devtools.pin import Pin, fetch_archive, read_pin, sha256_of, unpack_archive
from devtools.releases import RELEASES_FILE, SERVED, Release, read_releases, served_by

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


PINS_DIR = "pins"
# The version each pin directory is named by; the oldest is the default.
_VERSION_KEY = re.compile(r"\d+|\D+")


def version_key(version: str) -> tuple:
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in _VERSION_KEY.findall(version)
    )


def pin_versions(root: Path) -> list[str]:
    """The pins this checkout carries (pins/<version>/upstream.pin), oldest
    first."""
    found = [
        d.name for d in (root / PINS_DIR).iterdir() if (d / "upstream.pin").is_file()
    ]
    return sorted(found, key=version_key)


@dataclass(frozen=True)
class Layout:
    """Where things live in an rlsync checkout, for one pin: its pin file,
    series and overlay under pins/<version>/, its build products under
    build/<version>/. Without a version: the oldest pin.

    With `release` (another release the pin's series serves, pins/releases):
    that release's wheel is the pristine tree, its build products live under
    build/<release>/, and its series is the pin's with the patches ported to
    it (pins/<version>/releases/<release>/) in place of the pin's."""

    root: Path
    version: str = ""
    release: str = ""

    def __post_init__(self) -> None:
        if not self.version:
            versions = pin_versions(self.root)
            if not versions:
                raise SeriesError(f"{self.root / PINS_DIR}: no pins")
            object.__setattr__(self, "version", versions[0])
        elif not (self.root / PINS_DIR / self.version / "upstream.pin").is_file():
            known = ", ".join(pin_versions(self.root)) or "none"
            raise SeriesError(
                f"no pin {self.version} (pins/{self.version}/upstream.pin); "
                f"this checkout has: {known}"
            )
        if self.release == self.version:
            object.__setattr__(self, "release", "")
        if self.release:
            self._served_release()  # raises unless the map says so

    def _served_release(self) -> Release:
        found = read_releases(self.root).get(self.release)
        if found is None or found.series != self.version or found.how not in SERVED:
            raise SeriesError(
                f"pins/releases does not say that {self.version}'s series serves "
                f"{self.release}"
            )
        return found

    @property
    def pin_dir(self) -> Path:
        return self.root / PINS_DIR / self.version

    @property
    def pin_file(self) -> Path:
        return self.pin_dir / "upstream.pin"

    @property
    def patches_dir(self) -> Path:
        return self.pin_dir / "patches"

    @property
    def series_file(self) -> Path:
        return self.patches_dir / "series"

    @property
    def overlay_dir(self) -> Path:
        return self.pin_dir / "overlay"

    @property
    def common_dir(self) -> Path:
        """The version-independent modules, one copy for every pin."""
        return self.root / COMMON_DIR

    @property
    def build_dir(self) -> Path:
        return self.root / "build" / (self.release or self.version)

    @property
    def adjustments_dir(self) -> Path:
        """The patches ported to `release` (their pin patch's file names) and
        `ported-from` (the sha256 of each pin patch a port was made from)."""
        return self.pin_dir / "releases" / self.release

    @property
    def upstream_dir(self) -> Path:
        """Pristine tree: the sdist, or the wheel's package, as `python/`."""
        return self.build_dir / "upstream"

    @property
    def work_dir(self) -> Path:
        return self.build_dir / "work"

    def pin(self) -> Pin:
        """The pin, with the other releases its series serves; with
        `release`: that release, as a pin of its own."""
        pin = read_pin(self.pin_file)
        if self.release:
            return self._served_release().pin(pin.name, pin.series)
        if not (self.root / RELEASES_FILE).is_file():
            return pin
        others = [v for v in served_by(self.root, pin.version) if v != pin.version]
        return dataclasses.replace(pin, serves=tuple(others))

    def patches(self) -> list[Path]:
        patches = read_series(self.patches_dir)
        if not self.release:
            return patches
        ported = {p.name: p for p in self.adjustments_dir.glob("*.patch")}
        return [ported.get(p.name, p) for p in patches]


def find_root(start: Path | None = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for cand in (here, *here.parents):
        if (cand / PINS_DIR).is_dir() and pin_versions(cand):
            return cand
    raise SeriesError(
        f"no rlsync checkout (pins/<version>/upstream.pin) at or above {here}"
    )


# --- the series -----------------------------------------------------------


def series_names(text: str) -> list[str]:
    """The patch file names a `series` file lists, in order."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def read_series(patches_dir: Path) -> list[Path]:
    series = patches_dir / "series"
    if not series.is_file():
        raise SeriesError(f"{series}: missing")
    names = series_names(series.read_text())
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


# DEP-3 trailers a maintainer reads: where the change was sent, and the
# upstream report it fixes.
_TRAILER_VALUES = {
    "Forwarded": r"no|not-needed\b.*|https://\S+",
    "Bug": r"https://\S+",
}
_TRAILER_WANTS = {
    "Forwarded": "no, not-needed (why) or the URL of the upstream pull request",
    "Bug": "the URL of the upstream issue",
}


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
    if len(re.findall(r"^Forwarded:", body, re.M)) > 1:
        problems.append(f"{patch.name}: one 'Forwarded:' line, not several")
    for key, value in re.findall(r"^(Forwarded|Bug): *(.*?) *$", body, re.M):
        if not re.fullmatch(_TRAILER_VALUES[key], value):
            problems.append(
                f"{patch.name}: '{key}: {value}': DEP-3 wants {_TRAILER_WANTS[key]}"
            )
    if re.search(r"^# Conflicts:$", body, re.M):
        problems.append(
            f"{patch.name}: the message keeps git's '# Conflicts:' note; delete it"
        )
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


_TRAILER = re.compile(r"^(Depends|Feature): *(.*?) *$", re.M)


def placeless_diffs(text: str) -> str:
    """A patch file's diffs without what moves when an earlier patch changes
    the same file although none of this patch's lines changed: its `index`
    lines and hunk positions. Two patches with the same placeless diffs make
    the same change (`make port-export`, `make port-restamp` and the release
    smokes' record compare patches by it)."""
    start = text.find("\ndiff --git ")
    body = text[start + 1 :] if start >= 0 else ""
    body = re.sub(r"^index [0-9a-f]+\.\.[0-9a-f]+.*\n", "", body, flags=re.M)
    return re.sub(r"^@@ [^@]* @@.*$", "@@", body, flags=re.M)


def patch_message(patch: Path) -> str:
    """The commit message of a patch (between the headers and the diffstat)."""
    head = patch.read_text().partition("\ndiff --git ")[0]
    body = head.split("\n\n", 1)[1] if "\n\n" in head else ""
    return body.split("\n---\n", 1)[0]


def patch_trailers(patch: Path, key: str) -> list[str]:
    """Values of `key:` lines in a patch's message; a line may list several,
    separated by commas or spaces."""
    values: list[str] = []
    for found_key, value in _TRAILER.findall(patch_message(patch)):
        if found_key == key:
            values.extend(v for v in re.split(r"[,\s]+", value) if v)
    return values


def patch_features(patch: Path) -> list[str]:
    """The capabilities a patch adds (`Feature: <name>` lines), as its file
    name follows them (`patch_names.features`)."""
    return features(patch.read_text())


def declared_dependencies(patches: list[Path]) -> dict[str, list[Path]]:
    """Each patch's `Depends:` lines resolved to the patches they name (by
    file name, with or without `.patch`); SeriesError naming the patch when
    one names a patch not in the series, itself, or a later one."""
    index = {p.name.removesuffix(".patch"): i for i, p in enumerate(patches)}
    deps: dict[str, list[Path]] = {}
    problems = []
    for i, patch in enumerate(patches):
        deps[patch.name] = []
        for name in patch_trailers(patch, "Depends"):
            j = index.get(name.removesuffix(".patch"))
            if j is None:
                problems.append(
                    f"{patch.name}: Depends: {name}: no such patch in the series"
                )
            elif j >= i:
                problems.append(
                    f"{patch.name}: Depends: {name}: not earlier in the series "
                    f"(a patch may only depend on patches before it)"
                )
            else:
                deps[patch.name].append(patches[j])
    if problems:
        raise SeriesError("\n".join(problems))
    return deps


def with_dependencies(
    patch: Path, patches: list[Path], deps: dict[str, list[Path]]
) -> list[Path]:
    """`patch` and everything it declares it needs, transitively, in series
    order."""
    need = {patch.name}
    stack = [patch]
    while stack:
        for dep in deps[stack.pop().name]:
            if dep.name not in need:
                need.add(dep.name)
                stack.append(dep)
    return [p for p in patches if p.name in need]


_IMPORT_STATEMENT = re.compile(
    r"^from (sglang[\w.]*) import (?:\(([^)]*)\)|([\w, ]+)$)", re.M
)


def added_imports(patch: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from sglang... import name` statement a
    patch adds."""
    added = "\n".join(
        line[1:]
        for line in patch.read_text().splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )
    found = []
    for m in _IMPORT_STATEMENT.finditer(added):
        names = (m.group(2) or m.group(3) or "").replace(",", " ").split()
        found.extend((m.group(1), name.strip()) for name in names if name != "as")
    return found


def _defines(tree: Path, pristine: Path, module: str, name: str) -> bool:
    """Whether `module` in `tree` (else in the pristine tree) defines `name`
    (or `name` is a submodule of it): a plain text test, enough to tell a
    module or function a patch adds from one upstream has."""
    rel = Path("python", *module.split("."))
    for base in (tree, pristine):
        for path in (rel.with_suffix(".py"), rel / "__init__.py"):
            if (base / path).is_file():
                text = (base / path).read_text(errors="replace")
                if re.search(
                    rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b"
                    rf"|^\s*{name}\s*[:=]|import[^\n]*\b{name}\b"
                    rf"|^\s+{name},?\s*$",
                    text,
                    re.M,
                ):
                    return True
                break
        if (base / rel / name).is_dir() or (base / rel / f"{name}.py").is_file():
            return True
    return False


def check_patch_alone(
    layout: Layout, patch: Path, needed: list[Path], dest: Path
) -> list[str]:
    """Apply `needed` (the patch and its declared dependencies) to a scratch
    copy of the pristine files they touch; every `from sglang... import`
    the patch adds must then resolve."""
    try:
        patched_tree(layout, dest, needed)
    except SeriesError as e:
        return [
            f"{patch.name}: does not apply on its own with its declared "
            f"dependencies ({', '.join(p.name for p in needed[:-1]) or 'none'}); "
            f"add the patch it needs as a 'Depends:' line\n{e}"
        ]
    pristine = layout.upstream_dir
    return [
        f"{patch.name}: imports {name} from {module}, which neither the pristine "
        f"tree nor its declared dependencies define; add the patch that adds it "
        f"as a 'Depends:' line"
        for module, name in added_imports(patch)
        if not _defines(dest, pristine, module, name)
    ]


def check_each_patch_alone(layout: Layout, patches: list[Path]) -> list[str]:
    """Every patch applies to the pristine tree with only its declared
    dependencies (transitively), in parallel scratch trees."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        deps = declared_dependencies(patches)
    except SeriesError as e:
        return str(e).splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for i, patch in enumerate(patches):
            dest = Path(tmp) / str(i)
            dest.mkdir()
            needed = with_dependencies(patch, patches, deps)
            jobs.append((patch, needed, dest))
        with ThreadPoolExecutor(max_workers=min(8, len(jobs) or 1)) as pool:
            results = pool.map(lambda job: check_patch_alone(layout, *job), jobs)
            return [problem for found in results for problem in found]


# --- generated modules ------------------------------------------------------

# What the server reports at /rlsync_info: written into every tree the series
# is built into (overlay, wheel, `make apply`, the worktree), never patched.
SERIES_MODULE = "python/sglang/srt/weight_sync/_series.py"


def series_features(patches: list[Path]) -> list[str]:
    """Every patch's `Feature:` names, in series order."""
    return [name for patch in patches for name in patch_features(patch)]


def series_module_text(layout: Layout, patches: list[Path] | None = None) -> str:
    """`SERIES_MODULE`: the pin's series number and release, and the
    features of the series, formatted as black formats them."""
    pin = layout.pin()
    patches = layout.patches() if patches is None else patches
    features = "".join(f"    {json.dumps(n)},\n" for n in series_features(patches))
    return (
        '"""The weight-sync series built into this tree: generated from the\n'
        'series and its pin (each patch names its feature); do not edit."""\n'
        "\n"
        f"SERIES = {int(pin.series)}\n"
        f'PIN = {{"name": {json.dumps(pin.name)}, "version": {json.dumps(pin.version)}}}\n'
        f"FEATURES = ({chr(10) + features if features else ''})\n"
    )


def generated_files(layout: Layout) -> dict[str, str]:
    """Files that are not patched but written into every tree the series is
    built into, by path relative to the repository root of the tree (the
    overlay, the wheel, an applied checkout): {relpath: text}."""
    return {SERIES_MODULE: series_module_text(layout)}


def write_generated(layout: Layout, tree: Path) -> list[str]:
    """Write `generated_files` into `tree` (a checkout's root, holding
    python/sglang)."""
    written = []
    for rel, text in generated_files(layout).items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
        written.append(rel)
    return written


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
    """Unpack the verified pinned archive as build/<version>/upstream/python
    (once)."""
    pin = layout.pin()
    stamp = layout.upstream_dir / ".archive-sha256"
    if stamp.is_file() and stamp.read_text().strip() == pin.sha256:
        return layout.upstream_dir
    archive = fetch_archive(pin)
    if layout.upstream_dir.exists():
        shutil.rmtree(layout.upstream_dir)
    layout.upstream_dir.mkdir(parents=True)
    unpack_archive(pin, archive, layout.upstream_dir / "python")
    stamp.write_text(sha256_of(archive) + "\n")
    return layout.upstream_dir


# --- overlay --------------------------------------------------------------


def regenerate_overlay(layout: Layout) -> list[str]:
    """The pin's overlay from pristine + series; the modules every pin shares
    are written to common/ instead (this pin's series is where they were
    edited: `make check` then shows the other pins that must follow)."""
    common = set(common_files(layout))
    with tempfile.TemporaryDirectory() as tmp:
        files = patched_tree(layout, Path(tmp))
        if layout.overlay_dir.exists():
            shutil.rmtree(layout.overlay_dir)
        for rel in files:
            base = layout.common_dir if rel in common else layout.overlay_dir
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / rel, base / rel)
    write_generated(layout, layout.overlay_dir)
    regenerate_vendored(layout)
    return files


# --- modules every pin shares ---------------------------------------------

# The version-independent modules of the series (receiver, digest, checksum,
# health tracking, redaction, ...): one copy under common/, by series path.
# Each pin's series adds them (a pull request must be whole); `make check`
# fails when a pin's series builds a different file.
COMMON_DIR = "common"


def common_files(layout: Layout) -> list[str]:
    if not layout.common_dir.is_dir():
        return []
    return sorted(
        p.relative_to(layout.common_dir).as_posix()
        for p in layout.common_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def check_common(layout: Layout, built: Path, files: list[str]) -> list[str]:
    """Every shared module this pin's series builds is byte-identical to
    common/ (`built`: pristine + series for `files`)."""
    problems = []
    for rel in sorted(set(files) & set(common_files(layout))):
        expected = (built / rel).read_bytes()
        actual = (layout.common_dir / rel).read_bytes()
        if expected != actual:
            problems.append(
                f"{COMMON_DIR}/{rel}: differs from what the {layout.version} series "
                f"builds (a shared module is the same on every pin: bring the "
                f"series to it in build/{layout.version}/work, or regenerate it "
                f"with `make PIN={layout.version} overlay` and update the other "
                f"pins)\n" + _first_difference(rel, expected, actual, COMMON_DIR)
            )
    return problems


# Modules of the series that the trainer library carries as generated copies
# (standard library and torch only): copy -> overlay source. `make overlay`
# writes them; `make check` fails on drift. Edit the source in
# build/<version>/work, never the copy.
VENDORED = {
    "python/rlsync/bucket_header.py": "python/sglang/srt/weight_sync/bucket_header.py",
    "python/rlsync/digest.py": "python/sglang/srt/weight_sync/digest.py",
    "python/rlsync/update_group_net.py": (
        "python/sglang/srt/weight_sync/update_group_net.py"
    ),
}


def vendored_text(layout: Layout, source: str) -> str:
    header = f"# Generated from {COMMON_DIR}/{source} by `make overlay`; do not edit.\n"
    return header + (layout.common_dir / source).read_text()


def regenerate_vendored(layout: Layout) -> list[str]:
    for copy, source in VENDORED.items():
        (layout.root / copy).parent.mkdir(parents=True, exist_ok=True)
        (layout.root / copy).write_text(vendored_text(layout, source))
    return sorted(VENDORED)


def check_vendored(layout: Layout) -> list[str]:
    problems = []
    for copy, source in VENDORED.items():
        path = layout.root / copy
        if not (layout.common_dir / source).is_file():
            problems.append(f"{copy}: its source {COMMON_DIR}/{source} is missing")
        elif not path.is_file() or path.read_text() != vendored_text(layout, source):
            problems.append(
                f"{copy}: differs from {COMMON_DIR}/{source} (edit "
                f"build/<version>/work, then `make patches overlay`)"
            )
    return problems


def built_file(layout: Layout, rel: str) -> Path:
    """Where a file the series builds is kept: common/ for the modules every
    pin shares, else the pin's overlay."""
    shared = layout.common_dir / rel
    return shared if shared.is_file() else layout.overlay_dir / rel


def overlay_files(layout: Layout) -> list[str]:
    if not layout.overlay_dir.is_dir():
        return []
    return sorted(
        p.relative_to(layout.overlay_dir).as_posix()
        for p in layout.overlay_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def _first_difference(
    rel: str, expected: bytes, actual: bytes, where: str = "overlay"
) -> str:
    exp = expected.decode(errors="replace").splitlines(keepends=True)
    act = actual.decode(errors="replace").splitlines(keepends=True)
    diff = list(
        difflib.unified_diff(exp, act, f"pristine+series/{rel}", f"{where}/{rel}", n=1)
    )
    return "".join(diff[:12]).rstrip() or "(differs only in line endings or bytes)"


def _shown(layout: Layout, path: Path) -> str:
    return path.relative_to(layout.root).as_posix()


def check(layout: Layout) -> list[str]:
    """Every way the series, the pristine tree and the overlay can disagree."""
    try:
        patches = layout.patches()
    except SeriesError as e:
        return [str(e)]
    problems: list[str] = []
    overlay = _shown(layout, layout.overlay_dir)
    for patch in patches:
        problems.extend(lint_patch(patch))
    problems.extend(check_names(patches))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = patched_tree(layout, Path(tmp), patches)
        except SeriesError as e:
            return problems + [str(e)]
        present = set(overlay_files(layout))
        common = set(common_files(layout))
        problems.extend(check_common(layout, Path(tmp), files))
        for rel in sorted(present & common):
            problems.append(
                f"{overlay}/{rel}: a shared module; it lives in {COMMON_DIR}/ only"
            )
        for rel in files:
            if rel in common:
                continue
            if rel not in present:
                problems.append(
                    f"{overlay}/{rel}: missing (a patch touches it; run `make overlay`)"
                )
                continue
            expected = (Path(tmp) / rel).read_bytes()
            actual = (layout.overlay_dir / rel).read_bytes()
            if expected != actual:
                problems.append(
                    f"{overlay}/{rel}: differs from pristine + series (edit "
                    f"{_shown(layout, layout.work_dir)} and run `make patches overlay`)\n"
                    + _first_difference(rel, expected, actual)
                )
        write_generated(layout, Path(tmp))
        for rel, line, module, name in unresolved_imports(
            Path(tmp), layout.upstream_dir, files
        ):
            problems.append(
                f"{overlay}/{rel}:{line}: imports {name} from {module}, which "
                "pristine + series no longer defines"
            )
        generated = generated_files(layout)
        for rel in sorted(present - set(files) - set(generated)):
            problems.append(f"{overlay}/{rel}: no patch touches this file")
    problems.extend(check_generated(layout))
    problems.extend(check_message_files(layout, patches))
    problems.extend(check_each_patch_alone(layout, patches))
    problems.extend(check_library_version(layout))
    problems.extend(check_features(layout))
    problems.extend(check_vendored(layout))
    return problems


# A file a message names: a path or a file name with an extension.
_NAMED_FILE = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*"
    r"\.(?:py|md|txt|toml|json|sh|yaml|yml|cfg|ini|pin|patch))(?![\w/])"
)


def check_message_files(layout: Layout, patches: list[Path]) -> list[str]:
    """Every file a patch's message names exists: in the upstream tree, among
    the files the series adds, or in this repository (its tests), named by
    its path or by a tail of it (`weight_checker.py`, `srt/utils/...`). A
    reviewer cannot follow a message to a file that is nowhere."""
    paths = [
        p.relative_to(layout.upstream_dir).as_posix()
        for p in layout.upstream_dir.rglob("*")
        if p.is_file()
    ]
    for root in {layout.root, Path(__file__).resolve().parents[1]}:
        listed = subprocess.run(
            ["git", "ls-files"], cwd=root, capture_output=True, text=True
        )
        paths += listed.stdout.split()
    for patch in patches:
        paths += re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)
    tails = set()
    for path in paths:
        parts = path.split("/")
        tails.update("/".join(parts[i:]) for i in range(len(parts)))
    problems = []
    for patch in patches:
        for named in sorted(set(_NAMED_FILE.findall(patch_message(patch)))):
            if named.lstrip("./") not in tails:
                problems.append(
                    f"{patch.name}: its message names {named}, which is neither "
                    "upstream's, the series' nor this repository's"
                )
    return problems


def check_generated(layout: Layout) -> list[str]:
    """The overlay holds the generated modules as the series and the pin
    say now (the series number /rlsync_info reports is the pin's)."""
    problems = []
    overlay = _shown(layout, layout.overlay_dir)
    for rel, text in generated_files(layout).items():
        path = layout.overlay_dir / rel
        if not path.is_file():
            problems.append(f"{overlay}/{rel}: missing (generated; run `make overlay`)")
        elif path.read_text() != text:
            problems.append(
                f"{overlay}/{rel}: differs from what the series and upstream.pin "
                f"generate (run `make overlay`)\n"
                + _first_difference(rel, text.encode(), path.read_bytes())
            )
    return problems


LIBRARY_SENDER = "python/rlsync/sender.py"
_FEATURE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def check_features(layout: Layout) -> list[str]:
    """Feature names are identifiers, each declared once, and every feature
    the trainer library requires (`REQUIRED_FEATURES` in its sender) is one
    the series declares: a renamed feature would make every sender refuse
    every server of the series."""
    patches = layout.patches()
    problems = []
    seen: dict[str, str] = {}
    for patch in patches:
        for name in patch_features(patch):
            if not _FEATURE_NAME.fullmatch(name):
                problems.append(
                    f"{patch.name}: Feature: {name!r} is not a lowercase identifier"
                )
            if name in seen:
                problems.append(
                    f"{patch.name}: Feature: {name} is declared by {seen[name]} too"
                )
            seen.setdefault(name, patch.name)
    required = required_features(layout.root / LIBRARY_SENDER)
    if required is None:
        problems.append(
            f"{LIBRARY_SENDER}: no REQUIRED_FEATURES = (...) of feature names at "
            "module level: the features the library requires cannot be checked"
        )
    for name in required or ():
        if name not in seen:
            problems.append(
                f"{LIBRARY_SENDER}: requires feature {name!r}, which no "
                "patch declares (a 'Feature:' line)"
            )
    return problems


def required_features(sender: Path) -> tuple[str, ...] | None:
    """The trainer library's REQUIRED_FEATURES, read from its source (the
    library imports torch; devtools does not), or None where the module has
    no such tuple of strings."""
    if not sender.is_file():
        return None
    for node in ast.parse(sender.read_text()).body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if not any(
            isinstance(t, ast.Name) and t.id == "REQUIRED_FEATURES" for t in targets
        ):
            continue
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError):
            return None
        if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            return value
        return None
    return None


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


def make_worktree(layout: Layout, patches: list[Path] | None = None) -> Path:
    """build/<version>/work: a git repository at the pin, one commit per
    patch (the series', or `patches`)."""
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
    kind = "wheel" if pin.wheel else "sdist"
    message = f"{pin.name} {pin.version} (pristine {kind} {pin.sha256[:12]})"
    git(
        work,
        "commit",
        "--quiet",
        "--no-verify",
        "-m",
        message,
        env={**IDENTITY, **dates},
    )
    git(work, "tag", "upstream")
    # Generated, never committed: a tree to run servers from
    # (RLSYNC_SGLANG_TREE=build/<version>/work/python) needs them.
    (work / ".git" / "info").mkdir(parents=True, exist_ok=True)
    (work / ".git" / "info" / "exclude").write_text(
        "".join(f"/{rel}\n" for rel in generated_files(layout))
    )
    patches = layout.patches() if patches is None else patches
    if patches:
        am = ["am", "--quiet", "--keep-cr", "--committer-date-is-author-date"]
        git(work, *am, *map(str, patches), env=IDENTITY)
    write_generated(layout, work)
    return work


# Deterministic: an unchanged series exports byte-identical files.
FORMAT_PATCH = (
    *("format-patch", "--quiet", "--zero-commit", "--full-index", "--no-signature"),
    *("--no-numbered", "--no-stat", "--no-renames", "--no-binary"),
    "--diff-algorithm=myers",
)


def export_patches(layout: Layout) -> list[Path]:
    """Re-export build/<version>/work's commits since the pin as the series."""
    work = layout.work_dir
    if not (work / ".git").is_dir():
        raise SeriesError(f"{work}: no worktree; run `make worktree` first")
    dirty = git(work, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if dirty:
        raise SeriesError(f"{work}: uncommitted changes; commit them first:\n{dirty}")
    with tempfile.TemporaryDirectory() as tmp:
        git(work, *FORMAT_PATCH, "--output-directory", tmp, "upstream..HEAD")
        texts = []
        for path in sorted(Path(tmp).glob("*.patch")):
            with open(path, newline="") as f:  # keep a CR a file has
                text = f.read()
            texts.append(re.sub(r"^Date: .*$", f"Date: {PATCH_DATE}", text, 1, re.M))
    current = read_series(layout.patches_dir) if layout.series_file.is_file() else []
    try:
        names = export_names(texts, current)
    except ValueError as e:
        raise SeriesError(f"{work}: {e}") from e
    for old in layout.patches_dir.glob("*.patch"):
        old.unlink()
    for name, text in zip(names, texts):
        with open(layout.patches_dir / name, "w", newline="") as f:
            f.write(text)
    layout.series_file.write_text("".join(name + "\n" for name in names))
    write_generated(layout, work)
    return [layout.patches_dir / name for name in names]
