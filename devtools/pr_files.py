"""What a pull-request branch adds beside the series: each feature's tests in
upstream's own layout, and its page in upstream's docs.

`pr/<commit name>/<path in the SGLang repository>`, e.g.
`pr/secret-redaction/test/registered/unit/utils/test_redaction.py`: `make
pr-branch` adds these files to that commit of the pull-request series
(`pr_series`, `pr/series`), so each commit carries
the unit tests upstream's CI would run for it (CPU-only, no server, as
upstream's `test/registered/unit/README.md` asks) and its documentation.
They are not part of the series: the forked wheel and an applied tree never
carry them (upstream's wheel has no `test/` or `docs/`). One copy serves
every pin whose pull-request series has the commit.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import re
from pathlib import Path

PR_DIR = "pr"
# The messages of the pull-request series' own commits (`pr_series`).
MESSAGES_DIR = "messages"
# The descriptions of its stacked pull requests (`pr_series`).
PULLS_DIR = "pulls"
# Where upstream keeps what a pull request adds beside the code.
UNIT_TESTS = "test/registered/unit/"
DOCS = "docs/"


def pr_files(root: Path, patch_name: str) -> dict[str, bytes]:
    """{path in the SGLang repository: bytes} that the commit named
    `patch_name` (its patch file's name, with or without `.patch`) adds."""
    folder = root / PR_DIR / patch_name.removesuffix(".patch")
    if not folder.is_dir():
        return {}
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def pr_files_of(root: Path, patches: list[Path]) -> dict[str, dict[str, bytes]]:
    """{patch file name: its pr_files} for the patches that have some."""
    found = {patch.name: pr_files(root, patch.name) for patch in patches}
    return {name: files for name, files in found.items() if files}


def is_unit_test(rel: str) -> bool:
    return rel.startswith(UNIT_TESTS) and bool(re.search(r"/test_[^/]*\.py$", rel))


def unit_test_modules(files: dict[str, bytes]) -> list[str]:
    """The unit-test modules among a commit's pr_files."""
    return sorted(rel for rel in files if is_unit_test(rel))


def check_pr_files(root: Path, commits: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Each folder names a commit of some pin's pull-request series
    (`commits`: {pin: [(commit name, its message)]}, `pr_series.cut`);
    each file is a unit test registered for upstream's CPU CI, or a docs
    page; each commit's message names the unit tests it adds."""
    top = root / PR_DIR
    if not top.is_dir():
        return []
    names = {name for each in commits.values() for name, _ in each}
    problems = []
    added: dict[str, str] = {}
    for folder in sorted(p for p in top.iterdir() if p.is_dir()):
        if folder.name in (MESSAGES_DIR, PULLS_DIR):
            continue
        where = f"{PR_DIR}/{folder.name}"
        if folder.name not in names:
            problems.append(
                f"{where}: no commit of a pin's pull-request series has that name"
            )
        for rel, data in pr_files(root, folder.name).items():
            first = added.setdefault(rel, folder.name)
            if first != folder.name:
                problems.append(
                    f"{where}/{rel}: {PR_DIR}/{first} adds it too; one commit "
                    "adds a file"
                )
            if rel.startswith(UNIT_TESTS) and rel.endswith(".py"):
                if is_unit_test(rel) and b"register_cpu_ci(" not in data:
                    problems.append(
                        f"{where}/{rel}: a unit test registers itself for "
                        "upstream's CPU CI (register_cpu_ci)"
                    )
            elif not (rel.startswith(DOCS) and rel.endswith(".md")):
                problems.append(
                    f"{where}/{rel}: a pull request adds unit tests under "
                    f"{UNIT_TESTS} and pages under {DOCS} here; the code "
                    "belongs in the commit"
                )
    for version, each in commits.items():
        for name, message in each:
            message = " ".join(message.split())
            for rel in unit_test_modules(pr_files(root, name)):
                if rel not in message:
                    problems.append(
                        f"{version}: {name}: its message does not name {rel}, "
                        "the unit tests its commit adds"
                    )
    return problems
