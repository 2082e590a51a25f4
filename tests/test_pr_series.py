"""The cut of a series into pull-request commits (devtools.line_origins,
devtools.pr_series) on small made-up series: which commit a line lands in,
what a dropped patch leaves, and that no commit rewrites another's."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import pr_series, rewrites
from devtools.line_origins import UPSTREAM, line_origins
from devtools.series import SeriesError

PRISTINE = "a\nb\nc\n"


def patch(path: str, hunk: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n{hunk}"


# A adds two lines after b; B changes one of them and inserts one; C, the
# fork's own, replaces c.
A = patch("f.py", "@@ -1,3 +1,5 @@\n a\n b\n+x = 1\n+y = 2\n c\n")
B = patch("f.py", "@@ -2,3 +2,4 @@\n b\n x = 1\n-y = 2\n+y = 3\n+z = 4\n c\n")
C = patch("f.py", "@@ -4,3 +4,3 @@\n y = 3\n z = 4\n-c\n+c2\n")


def origins(*patches: tuple[str, str]) -> list[tuple[str, str, str]]:
    (lines,) = line_origins(list(patches), {"f.py": PRISTINE}).values()
    return [(line.text, line.origin, line.removed_by) for line in lines]


def test_a_changed_line_belongs_to_the_patch_that_first_wrote_it_in_its_final_form():
    assert origins(("A", A), ("B", B)) == [
        ("a", UPSTREAM, ""),
        ("b", UPSTREAM, ""),
        ("x = 1", "A", ""),
        ("y = 3", "A", ""),  # B changed A's line: A ships it as it ends
        ("z = 4", "B", ""),  # B's own new line
        ("c", UPSTREAM, ""),
    ]


def test_a_removed_pristine_line_stays_as_its_removers_tombstone():
    assert origins(("A", A), ("B", B), ("C", C))[-2:] == [
        ("c", UPSTREAM, "C"),
        ("c2", "C", ""),
    ]


def stages(
    plan: pr_series.Plan, *patches: tuple[str, str], pristine: str = PRISTINE
) -> list[str]:
    (lines,) = line_origins(list(patches), {"f.py": pristine}).values()
    order = [name for name, _ in plan.commits]
    index = []
    for line, definition in zip(lines, pr_series.definitions(lines)):
        owner = line.removed_by or line.origin
        commit = None
        if owner != UPSTREAM:
            commit = plan.commit_of(owner, "f.py", definition)
        index.append(None if commit is None else order.index(commit))
    return [
        "".join(f"{t}\n" for t in pr_series._stage_text(lines, i + 1, index))
        for i in range(len(order))
    ]


def test_each_commit_adds_final_lines_only_and_a_dropped_patch_leaves_none():
    plan = pr_series.Plan(
        drops={"C"}, commits=[("A", [("A", "*", None)]), ("B", [("B", "*", None)])]
    )
    first, second = stages(plan, ("A", A), ("B", B), ("C", C))
    assert first == "a\nb\nx = 1\ny = 3\nc\n"
    assert second == "a\nb\nx = 1\ny = 3\nz = 4\nc\n"  # c stays: C is dropped
    diffs = [
        ("A", patch("f.py", "@@ -2,2 +2,4 @@\n b\n+x = 1\n+y = 3\n c\n")),
        ("B", patch("f.py", "@@ -4,2 +4,3 @@\n y = 3\n+z = 4\n c\n")),
    ]
    assert rewrites.rewrites_of(diffs, {"f.py": PRISTINE}) == {}
    assert rewrites.rewrites_of([("A", A), ("B", B)], {"f.py": PRISTINE}) == {
        ("B", "A"): 1
    }


# D adds a class and, above it, the helpers it calls, each with its blank
# lines and the helper's decorator.
MODULE = "import os\n\n\nclass Old:\n    pass\n"
D = patch(
    "f.py",
    "@@ -1,5 +1,17 @@\n import os\n \n \n"
    "+@cache\n+def check_a(x):\n+    return x\n+\n+\n"
    "+class New:\n+    a = check_a(1)\n+\n+\n"
    "+# The old one.\n"
    " class Old:\n     pass\n",
)


def test_a_definition_glob_takes_a_patchs_top_level_definitions_of_that_name():
    plan = pr_series.Plan(
        commits=[("checks", [("D", "f.py", "check_*")]), ("rest", [("D", "*", None)])]
    )
    checks, rest = stages(plan, ("D", D), pristine=MODULE)
    assert checks == (
        "import os\n\n\n@cache\ndef check_a(x):\n    return x\n\n\n"
        "class Old:\n    pass\n"
    )
    assert rest == (
        "import os\n\n\n@cache\ndef check_a(x):\n    return x\n\n\n"
        "class New:\n    a = check_a(1)\n\n\n# The old one.\nclass Old:\n    pass\n"
    )
    (lines,) = line_origins([("D", D)], {"f.py": MODULE}).values()
    found = pr_series.definitions(lines)
    assert found[3:13] == ["check_a"] * 5 + ["New"] * 4 + ["Old"]
    assert found[:3] == [None] * 3
    with pytest.raises(SeriesError, match="lines in f.py \\(in New\\)"):
        plan = pr_series.Plan(commits=[("c", [("D", "*", "check_*")])])
        stages(plan, ("D", D), pristine=MODULE)


def test_a_plan_takes_every_patch_and_file_or_names_what_it_misses(tmp_path: Path):
    (tmp_path / "pr").mkdir()
    (tmp_path / "pr" / "series").write_text(
        "drop C\nset both = A B\ncommit defs A:*.py::check_*\n"
        "commit core @both:*.py\ncommit rest A\n"
    )
    plan = pr_series.read_plan(tmp_path)
    assert plan.commits[0] == ("defs", [("A", "*.py", "check_*")])
    assert plan.commit_of("A", "f.py", "check_a") == "defs"
    assert plan.commit_of("A", "f.py", "other") == "core"
    assert plan.commit_of("A", "f.py") == "core"
    assert plan.commit_of("B", "f.py") == "core"
    assert plan.commit_of("A", "doc.md") == "rest"
    assert plan.commit_of("C", "f.py") is None
    with pytest.raises(SeriesError, match="no commit takes B's lines in doc.md"):
        plan.commit_of("B", "doc.md")
    (tmp_path / "pr" / "series").write_text("commit imports A::(module)\ncommit a A\n")
    plan = pr_series.read_plan(tmp_path)
    assert plan.commit_of("A", "f.py") == "imports"
    assert plan.commit_of("A", "f.py", "check_a") == "a"
    (tmp_path / "pr" / "series").write_text("commit core @nothing\n")
    with pytest.raises(SeriesError, match="no 'set nothing"):
        pr_series.read_plan(tmp_path)
    (tmp_path / "pr" / "series").write_text("commit core A\ncommit core B\n")
    with pytest.raises(SeriesError, match="each commit and pull request named once"):
        pr_series.read_plan(tmp_path)


def test_pr_lines_stack_the_commits_into_pull_requests(tmp_path: Path):
    (tmp_path / "pr").mkdir()
    series = tmp_path / "pr" / "series"
    series.write_text("pr one\ncommit a A\ncommit b B\npr two\ncommit c C\n")
    plan = pr_series.read_plan(tmp_path)
    assert plan.pulls == [("one", ["a", "b"]), ("two", ["c"])]
    commits = [pr_series.Commit(name, "m\n", {}) for name in ("a", "c")]
    # A pin whose series lacks B: one still takes a; a pull request with no
    # commit on the pin is left out.
    assert pr_series.stacked_pulls(plan, commits) == [("one", 1), ("two", 1)]
    assert pr_series.stacked_pulls(plan, commits[:1]) == [("one", 1)]
    series.write_text("commit a A\ncommit b B\n")
    assert pr_series.stacked_pulls(pr_series.read_plan(tmp_path), commits) == [("", 2)]
    series.write_text("commit a A\npr one\ncommit b B\n")
    with pytest.raises(SeriesError, match="commit a is in no pull request"):
        pr_series.read_plan(tmp_path)
    series.write_text("pr one\ncommit a A\npr one\ncommit b B\n")
    with pytest.raises(SeriesError, match="pull request named once"):
        pr_series.read_plan(tmp_path)


def test_each_pull_request_has_a_description_and_each_description_one(
    tmp_path: Path,
):
    (tmp_path / "pr" / "pulls").mkdir(parents=True)
    (tmp_path / "pr" / "series").write_text("pr one\ncommit a A\npr two\n")
    (tmp_path / "pr" / "pulls" / "one.md").write_text("Title\n\nBody.\n")
    (tmp_path / "pr" / "pulls" / "three.md").write_text("Title\n\nBody.\n")
    assert pr_series.check_pull_descriptions(tmp_path) == [
        "pr/pulls/two.md: pull request two has no description",
        "pr/pulls/three.md: no 'pr three' line in pr/series",
    ]
    (tmp_path / "pr" / "pulls" / "three.md").unlink()
    (tmp_path / "pr" / "pulls" / "two.md").write_text("Title\nno blank line\n")
    assert pr_series.check_pull_descriptions(tmp_path) == [
        "pr/pulls/two.md: a title line, a blank line, then the body"
    ]


def test_a_name_a_commit_reads_but_never_binds_is_found():
    """What broke four commits of a cut once: a field typed by a name the
    file imports only at a later commit, and a lambda's parameter whose
    lambda a later commit writes."""
    from devtools.imports import unbound_names

    source = (
        "from typing import Optional\n"
        "import os\n"
        "class Req:\n"
        "    timeout: Optional[StrictFloat] = None\n"
        "def f(x, *args, **kw):\n"
        "    try:\n"
        "        return g(init_timeout=left, y=[i for i in args], z=os.sep)\n"
        "    except OSError as e:\n"
        "        return e, x, kw, __file__, len\n"
    )
    assert unbound_names(source) == [(4, "StrictFloat"), (7, "g"), (7, "left")]
    assert unbound_names("from os import *\nprint(anything)\n") == []
