"""The pull-request series: the patch series cut into commits none of which
rewrites another's lines.

The patch series is the fork's history: a feature's later patch often
rewrites lines an earlier one added (`make rewrites`). A maintainer should
read each line once, in the form that ships. `make pr-branch` therefore does
not commit the patches as they are; it cuts the series' final diff into
commits (`line_origins`): each commit adds lines of the final tree and
removes pristine lines, nothing else, so no commit rewrites another's. A
line belongs to the patch that first wrote its slot, in its final form.

`pr/series` lists the commits, in order; each line is one of:

    drop <patch>
        the patch is the fork's own (it does not go upstream): its lines are
        left out and the pristine lines it removed stay;
    set <name> = <patch> [<patch> ...]
        a name for several patches (`@<name>` in a selector);
    commit <name> <selector> [<selector> ...]
        a selector is `<patch>` or `@<set>`, optionally `:<path glob>`, and
        after that optionally `::<name glob>`: the first commit with a
        selector matching (patch, file) takes that patch's lines in that
        file, or, with a name glob, only its lines in the file's top-level
        definitions (def, class) of a matching name, `(module)` naming
        the lines outside any; every line must match one;
    pr <name>
        the commits below it, to the next `pr` line, are one pull request
        (stacked: each on the one above); its description is
        `pr/pulls/<name>.md`. With no `pr` line the commits are one.

A commit's message is `pr/messages/<commit>` where there is one, else its
patch's (a commit named as a patch), less the series' own trailers
(`Depends:`, `Feature:`, `Forwarded:`).

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import fnmatch
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from devtools.imports import unbound_names, unresolved_imports
from devtools.line_origins import (
    UPSTREAM,
    Line,
    file_diffs,
    line_origins,
    pristine_texts,
)
from devtools.pr_files import MESSAGES_DIR, PR_DIR, PULLS_DIR
from devtools.series import IDENTITY, Layout, SeriesError, ensure_upstream, git

PLAN_FILE = "series"
# How a selector's name glob names the lines outside any definition.
MODULE_LEVEL = "(module)"
# Trailers of the fork's series that mean nothing upstream.
_FORK_TRAILER = re.compile(r"^(Depends|Feature|Forwarded): .*\n", re.M)


@dataclass
class Plan:
    """`drop <patch>` lines and `commit <name> <selector>...` lines, in
    order; a selector is (patch, path glob, definition name glob or None)."""

    drops: set[str] = field(default_factory=set)
    commits: list[tuple[str, list[tuple[str, str, str | None]]]] = field(
        default_factory=list
    )
    # The stacked pull requests: (name, its commits' names), in order.
    pulls: list[tuple[str, list[str]]] = field(default_factory=list)

    def commit_of(
        self, patch: str, path: str, definition: str | None = None
    ) -> str | None:
        """The commit that takes `patch`'s lines in `path`, those in the
        top-level `definition` where one is given (None: dropped)."""
        if patch in self.drops:
            return None
        for name, selectors in self.commits:
            for selected, glob, names in selectors:
                if selected != patch or not fnmatch.fnmatchcase(path, glob):
                    continue
                if names is None or fnmatch.fnmatchcase(
                    definition or MODULE_LEVEL, names
                ):
                    return name
        where = f" (in {definition})" if definition else ""
        raise SeriesError(
            f"{PR_DIR}/{PLAN_FILE}: no commit takes {patch}'s lines in {path}{where}"
        )


@dataclass
class Commit:
    """One commit of the pull-request series."""

    name: str
    message: str  # subject line, blank line, body
    files: dict[str, str | None]  # {path: text after it, None: no such file}


def read_plan(root: Path) -> Plan:
    path = root / PR_DIR / PLAN_FILE
    plan = Plan()
    if not path.is_file():
        return plan
    names: set[str] = set()
    pulls: set[str] = set()
    sets: dict[str, list[str]] = {}
    text = path.read_text()
    stacked = bool(pulls_named(text))
    for lineno, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        where = f"{PR_DIR}/{PLAN_FILE}:{lineno}"
        if not words:
            continue
        if words[0] == "drop" and len(words) == 2:
            plan.drops.add(words[1])
        elif words[0] == "set" and len(words) >= 4 and words[2] == "=":
            sets[words[1]] = words[3:]
        elif words[0] == "commit" and len(words) >= 3 and words[1] not in names:
            names.add(words[1])
            selectors = []
            for word in words[2:]:
                word, _, defined = word.partition("::")
                patch, _, glob = word.partition(":")
                if patch.startswith("@") and patch[1:] not in sets:
                    raise SeriesError(f"{where}: no 'set {patch[1:]} = ...' above")
                for each in sets[patch[1:]] if patch.startswith("@") else [patch]:
                    selectors.append((each, glob or "*", defined or None))
            plan.commits.append((words[1], selectors))
            if plan.pulls:
                plan.pulls[-1][1].append(words[1])
            elif stacked:
                raise SeriesError(
                    f"{where}: commit {words[1]} is in no pull request (a 'pr "
                    "<name>' line above every commit, once there is one)"
                )
        elif words[0] == "pr" and len(words) == 2 and words[1] not in pulls:
            pulls.add(words[1])
            plan.pulls.append((words[1], []))
        else:
            raise SeriesError(
                f"{where}: expected 'drop <patch>', 'set <name> = <patch>...', "
                "'commit <name> <patch or @set>[:<path glob>][::<name glob>]...' "
                "or 'pr <name>' "
                "(each commit and pull request named once)"
            )
    return plan


def pulls_named(text: str) -> list[str]:
    """The names of a plan's `pr` lines, in order."""
    found = (line.split("#", 1)[0].split() for line in text.splitlines())
    return [words[1] for words in found if len(words) == 2 and words[0] == "pr"]


def stacked_pulls(plan: Plan, commits: list[Commit]) -> list[tuple[str, int]]:
    """(pull request, how many of `commits` it takes), in order: the pull
    requests with a commit on this pin; one, unnamed (""), without `pr`
    lines."""
    if not plan.pulls:
        return [("", len(commits))]
    present = {commit.name for commit in commits}
    counts = [(name, sum(n in present for n in names)) for name, names in plan.pulls]
    return [(name, count) for name, count in counts if count]


def check_pull_descriptions(root: Path) -> list[str]:
    """Each pull request of `pr/series` has its description, a title line
    and a body, and each description names one."""
    plan_file = root / PR_DIR / PLAN_FILE
    if not plan_file.is_file():
        return []
    names = pulls_named(plan_file.read_text())
    folder = root / PR_DIR / PULLS_DIR
    problems = []
    for name in names:
        path = folder / f"{name}.md"
        where = path.relative_to(root)
        if not path.is_file():
            problems.append(f"{where}: pull request {name} has no description")
            continue
        title, _, body = path.read_text().partition("\n\n")
        if "\n" in title.strip() or not title.strip() or not body.strip():
            problems.append(f"{where}: a title line, a blank line, then the body")
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if path.suffix != ".md" or path.stem not in names:
                problems.append(
                    f"{path.relative_to(root)}: no 'pr {path.stem}' line in "
                    f"{PR_DIR}/{PLAN_FILE}"
                )
    return problems


_DEFINITION = re.compile(r"(?:async\s+)?(?:def|class)\s+(\w+)")


def definitions(lines: list[Line]) -> list[str | None]:
    """The top-level definition (def or class) each line of a file is in,
    None at module level. A blank line and a removed line go with the line
    before them where that has their origin (the blank lines a definition
    ends with), else with the line after them; a decorator and a comment
    at the margin go with the line after them (what they precede)."""
    found: list[str | None] = []
    floating: list[int] = []
    current: str | None = None
    for i, line in enumerate(lines):
        text = line.text
        if line.removed_by or not text.strip() or text.startswith(("#", "@")):
            floating.append(i)
            found.append(None)
            continue
        match = _DEFINITION.match(text)
        if match:
            current = match.group(1)
        elif not text[0].isspace() and not text.startswith((")", "]", "}")):
            current = None
        found.append(current)
    # For each line, the nearest line before and after it that is not floating.
    floats = set(floating)
    before_of: list[int | None] = []
    nearest = None
    for i in range(len(lines)):
        before_of.append(nearest)
        nearest = nearest if i in floats else i
    after_of: list[int | None] = [None] * len(lines)
    nearest = None
    for i in reversed(range(len(lines))):
        after_of[i] = nearest
        nearest = nearest if i in floats else i
    for i in floating:
        before, after = before_of[i], after_of[i]
        leads = lines[i].text.startswith(("#", "@")) and not lines[i].removed_by
        if before is not None and (
            after is None or (not leads and lines[before].origin == lines[i].origin)
        ):
            found[i] = found[before]
        elif after is not None:
            found[i] = found[after]
    return found


def _stage_text(lines: list[Line], upto: int, commits: list[int | None]) -> list[str]:
    """A file's lines once the commits before `upto` (an index) are made;
    `commits`: the index of the commit that adds each line (or removes it,
    for a pristine line), None: never."""
    out = []
    for line, commit in zip(lines, commits):
        if line.origin == UPSTREAM:
            if not line.removed_by or commit is None or commit >= upto:
                out.append(line.text)
        elif commit is not None and commit < upto:
            out.append(line.text)
    return out


def _message(root: Path, layout: Layout, plan: Plan, name: str) -> str:
    """A commit's message: its own for a split commit, else its patch's
    without the series' trailers."""
    path = root / PR_DIR / MESSAGES_DIR / name
    if path.is_file():
        return path.read_text().strip() + "\n"
    if not (layout.patches_dir / f"{name}.patch").is_file():
        raise SeriesError(
            f"{path.relative_to(root)}: the message of a commit no patch names"
        )
    text = (layout.patches_dir / f"{name}.patch").read_text()
    head, _, rest = text.partition("\n\n")
    subject = re.search(r"^Subject: (?:\[PATCH[^\]]*\] )?(.*(?:\n .*)*)", head, re.M)
    if not subject:
        raise SeriesError(f"{name}.patch: no Subject")
    title = " ".join(subject.group(1).split())
    body = rest.partition("\ndiff --git ")[0]
    body = _FORK_TRAILER.sub("", body.rstrip() + "\n").strip()
    return f"{title}\n\n{body}\n" if body else f"{title}\n"


def cut(layout: Layout) -> list[Commit]:
    """The pull request's commits for `layout`'s series (see the module's
    docstring), each with every file it changes as it leaves it."""
    plan = read_plan(layout.root)
    patches = [(p.name.removesuffix(".patch"), p.read_text()) for p in layout.patches()]
    names = [name for name, _ in patches]
    order = [name for name, _ in plan.commits]
    position = {name: i for i, name in enumerate(order)}
    paths = {path for _, text in patches for path, _ in file_diffs(text)}
    pristine = pristine_texts(layout, paths)
    files = line_origins(patches, pristine)
    # {path: the index of the commit each line goes to, None: none}.
    index: dict[str, list[int | None]] = {}
    touched: dict[int, set[str]] = {}
    for path, lines in files.items():
        index[path] = []
        taken: dict[tuple[str, str | None], int | None] = {}
        for line, definition in zip(lines, definitions(lines)):
            patch = line.removed_by or line.origin
            if patch == UPSTREAM:
                index[path].append(None)
                continue
            if (patch, definition) not in taken:
                commit = plan.commit_of(patch, path, definition)
                taken[patch, definition] = None if commit is None else position[commit]
            at = taken[patch, definition]
            index[path].append(at)
            if at is not None:
                touched.setdefault(at, set()).add(path)
    commits = []
    for i, name in enumerate(order):
        changed: dict[str, str | None] = {}
        for path in sorted(touched.get(i, ())):
            lines = _stage_text(files[path], i + 1, index[path])
            if not lines and pristine[path] is None:
                changed[path] = None
            else:
                changed[path] = "\n".join(lines) + "\n"
        if not changed:
            continue  # none of its patches is in this pin's series
        message = _message(layout.root, layout, plan, name)
        commits.append(Commit(name, message, changed))
    return commits


def write_patches(layout: Layout, commits: list[Commit], dest: Path) -> list[Path]:
    """The commits as `git format-patch` files in `dest` (`<name>.patch`, in
    order), made in a scratch repository holding the pristine files."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        git(repo, "init", "--quiet")
        paths = {path for commit in commits for path in commit.files}
        for path, text in pristine_texts(layout, paths).items():
            if text is not None:
                (repo / path).parent.mkdir(parents=True, exist_ok=True)
                (repo / path).write_text(text)
        _commit_all(repo, "pristine")
        for commit in commits:
            for path, text in commit.files.items():
                target = repo / path
                if text is None:
                    target.unlink(missing_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
            _commit_all(repo, commit.message)
        written = []
        for i, commit in enumerate(commits):
            text = git(
                repo,
                "format-patch",
                "--stdout",
                "--no-signature",
                "--full-index",
                "-1",
                f"HEAD~{len(commits) - 1 - i}",
            ).stdout
            out = dest / f"{commit.name}.patch"
            out.write_text(text)
            written.append(out)
    return written


def stage_problems(layout: Layout, commits: list[Commit]) -> list[str]:
    """What breaks a reviewer's checkout of a commit: a Python file it
    changes that does not compile there, reads a name it binds nowhere, or
    has a `from sglang... import` the tree at that commit does not bind (a
    line whose final form leans on a later commit)."""
    pristine = ensure_upstream(layout)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        for commit in commits:
            compiled = []
            for path, text in commit.files.items():
                target = tree / path
                if text is None:
                    target.unlink(missing_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
                if not path.endswith(".py"):
                    continue
                try:
                    compile(text, path, "exec")
                except SyntaxError as e:
                    problems.append(f"{commit.name}: {path}:{e.lineno}: {e.msg}")
                    continue
                compiled.append(path)
                known = _unbound_in_pristine(pristine, path)
                for line, name in unbound_names(text):
                    if name not in known:
                        problems.append(
                            f"{commit.name}: {path}:{line}: reads {name}, which "
                            "the file does not define at this commit"
                        )
            for path, line, module, name in unresolved_imports(
                tree, pristine, compiled
            ):
                problems.append(
                    f"{commit.name}: {path}:{line}: imports {name} from {module}, "
                    "which the tree at this commit does not define"
                )
    return problems


def _unbound_in_pristine(pristine: Path, path: str) -> set[str]:
    """Names the pristine file reads without binding them (its own way of
    defining them, which a commit did not break)."""
    source = pristine / path
    if not source.is_file():
        return set()
    return {name for _, name in unbound_names(source.read_text())}


def _commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "--all", "--force")
    git(repo, "commit", "--quiet", "--allow-empty", "-m", message, env=IDENTITY)


def check(layout: Layout) -> tuple[list[Commit], list[str]]:
    """The pin's pull-request series and what is wrong with it (a patch no
    commit takes, a commit a reviewer cannot check out); nothing where the
    checkout has no `pr/series`."""
    if not (layout.root / PR_DIR / PLAN_FILE).is_file():
        return [], []
    try:
        commits = cut(layout)
    except SeriesError as e:
        return [], [str(e)]
    return commits, stage_problems(layout, commits)
