"""Overlay code is formatted as upstream formats it (black 24.10.0; isort with
profile black and sglang first-party) and our package is black-clean too."""

from __future__ import annotations

import ast
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from devtools import series

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = series.Layout(ROOT)


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True
    )


def test_black_version_is_upstreams():
    assert "black, 24.10.0" in run("black", "--version").stdout


PIN_LAYOUTS = [series.Layout(ROOT, v) for v in series.pin_versions(ROOT)]


def built_python_files() -> list[tuple[series.Layout, str]]:
    """Every Python file the series builds: each pin's overlay, and the
    shared modules once."""
    files = [
        (layout, rel)
        for layout in PIN_LAYOUTS
        for rel in series.overlay_files(layout)
        if rel.endswith(".py")
    ]
    files += [
        (LAYOUT, rel) for rel in series.common_files(LAYOUT) if rel.endswith(".py")
    ]
    return files


def test_overlay_is_black_clean():
    """black 24.10.0 passes on every built file whose pristine version passes;
    where upstream is formatted otherwise (0.5.23 uses a newer black), the
    patched file differs from black 24.10.0 exactly where the pristine does."""
    files = built_python_files()
    pristine = {}
    for layout, rel in files:
        path = series.ensure_upstream(layout) / rel
        if path.is_file():
            pristine[(layout.version, rel)] = path
    proc = run("black", "--check", *map(str, pristine.values()))
    unformatted = set(re.findall(r"^would reformat (.+)$", proc.stderr, re.M))
    plain, bad = [], []
    for layout, rel in files:
        built = series.built_file(layout, rel)
        upstream = pristine.get((layout.version, rel))
        if upstream is None or str(upstream) not in unformatted:
            plain.append(str(built))
        elif not _black_clean_where_changed(upstream, built):
            bad.append(f"{layout.version}: {rel}")
    proc = run("black", "--check", *plain)
    bad += re.findall(r"^would reformat (.+)$", proc.stderr, re.M)
    assert not bad, f"not formatted as black 24.10.0 formats them: {bad}"


def _black_clean_where_changed(pristine: Path, built: Path) -> bool:
    """black 24.10.0 would change no line of `built` that differs from
    `pristine` (upstream's own formatting elsewhere is upstream's)."""
    ours = built.read_text().splitlines()
    matcher = difflib.SequenceMatcher(
        None, pristine.read_text().splitlines(), ours, autojunk=False
    )
    ranges = [
        f"--line-ranges={j1 + 1}-{j2}"
        for tag, _, _, j1, j2 in matcher.get_opcodes()
        if tag in ("replace", "insert")
    ]
    if not ranges:
        return True
    with tempfile.TemporaryDirectory() as cache:
        # black caches a file checked in ranges as formatted whole: keep that
        # out of the cache the other checks read.
        proc = subprocess.run(
            [sys.executable, "-m", "black", "--check", "-q", *ranges, str(built)],
            env={**os.environ, "BLACK_CACHE_DIR": cache},
            capture_output=True,
            text=True,
        )
    return proc.returncode == 0


def test_overlay_imports_sorted_where_upstream_was():
    """isort must pass on every built file whose pristine version passes
    (isort's API with the settings of `isort --profile black -p sglang`)."""
    import isort

    config = isort.Config(profile="black", known_first_party=["sglang"], quiet=True)
    bad = []
    for layout, rel in built_python_files():
        series.ensure_upstream(layout)
        pristine = layout.upstream_dir / rel
        if pristine.is_file() and not isort.check_code(
            pristine.read_text(), config=config
        ):
            continue  # upstream itself is not isort-clean here; keep its style
        built = series.built_file(layout, rel)
        if not isort.check_code(built.read_text(), config=config):
            bad.append(f"{layout.version}: {rel}")
    assert not bad, f"imports not sorted as upstream sorts them: {bad}"


def test_our_code_is_black_clean():
    proc = run(
        "black",
        "--check",
        "--quiet",
        *("python", "devtools", "harness", "tests", "bench", "examples", "setup.py"),
        "pr",
    )
    assert proc.returncode == 0, f"run `make format`:\n{proc.stderr}"


def test_the_pull_request_tests_are_formatted_as_upstream_formats():
    """pr/ is upstream code: black 24.10.0, and isort with sglang first-party."""
    import isort

    config = isort.Config(profile="black", known_first_party=["sglang"], quiet=True)
    files = sorted((ROOT / "pr").rglob("*.py"))
    assert files
    bad = [f for f in files if not isort.check_code(f.read_text(), config=config)]
    assert not bad, f"isort --profile black -p sglang: {bad}"


def test_every_generated_file_is_marked_generated_for_review_tools():
    """The overlays, common/ and the library's generated copies are written
    by `make overlay`: .gitattributes marks each so (and the overlays
    without a diff), so that a review reads the series instead."""
    generated = [
        p.relative_to(ROOT).as_posix()
        for p in sorted(ROOT.glob("pins/*/overlay/**/*.py"))
        + sorted((ROOT / "common").rglob("*.py"))
        + sorted((ROOT / "python" / "rlsync").glob("*.py"))
        if not p.is_relative_to(ROOT / "python")
        or p.read_text().startswith("# Generated from")
    ]
    assert any(p.startswith("python/rlsync/") for p in generated)
    out = subprocess.run(
        ["git", "check-attr", "linguist-generated", "diff", "--stdin"],
        input="\n".join(generated),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    attrs: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        path, name, value = line.split(": ")
        attrs.setdefault(path, {})[name] = value
    unmarked = [p for p in generated if attrs[p]["linguist-generated"] != "true"]
    assert not unmarked, f"not marked generated in .gitattributes: {unmarked}"
    overlays = [p for p in generated if "/overlay/" in p]
    with_diff = [p for p in overlays if attrs[p]["diff"] != "unset"]
    assert overlays and not with_diff, f"overlay files with a diff: {with_diff}"


def test_the_library_checks_public_arguments_with_exceptions_not_asserts():
    """`python -O` drops asserts: a public function or method of the library
    raises ValueError / TypeError / RuntimeError for a bad argument or call.
    Asserts stay only in private helpers (internal invariants) and in the
    generated copies of series modules (their source is the series')."""
    found = []
    for path in sorted((ROOT / "python" / "rlsync").rglob("*.py")):
        text = path.read_text()
        if text.startswith("# Generated from"):
            continue

        def visit(node: ast.AST, names: list[str]) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                ):
                    visit(child, names + [child.name])
                elif isinstance(child, ast.Assert):
                    if not any(name.startswith("_") for name in names):
                        where = f"{path.relative_to(ROOT)}:{child.lineno}"
                        found.append(f"{where} ({'.'.join(names) or 'module'})")
                else:
                    visit(child, names)

        visit(ast.parse(text), [])
    assert found == [], "asserts in public code:\n" + "\n".join(found)


def library_imports() -> dict[str, set[str]]:
    """Each module of the library and the library modules it imports,
    anywhere in it (in functions and under TYPE_CHECKING too)."""
    package = ROOT / "python"
    modules = {
        ".".join(p.relative_to(package).with_suffix("").parts).removesuffix(
            ".__init__"
        ): p
        for p in (package / "rlsync").rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                parent = base
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                stem = (
                    node.module
                    if not node.level
                    else ".".join(p for p in (parent, node.module) if p)
                )
                found.add(stem)
                found |= {f"{stem}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_the_library_has_no_import_circle():
    graph = library_imports()
    assert (
        "rlsync.services.router" in graph["rlsync.cli"]
    )  # the graph sees lazy imports
    circles = []

    def visit(module: str, path: list[str]) -> None:
        for nxt in sorted(graph[module]):
            if nxt in path:
                circles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif len(path) < len(graph):
                visit(nxt, path + [nxt])

    for module in sorted(graph):
        visit(module, [module])
    assert circles == [], "import circles:\n" + "\n".join(sorted(set(circles)))


def test_no_assert_validates_a_public_functions_argument_in_the_library():
    """A caller's bad argument gets a ValueError or TypeError: `python -O`
    drops asserts. An assert in a public function of python/rlsync may check
    the code's own invariants, never a parameter."""
    found = []
    for path in sorted((ROOT / "python" / "rlsync").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_"):
                continue
            params = {a.arg for a in node.args.args + node.args.kwonlyargs}
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assert):
                    names = {
                        n.id for n in ast.walk(inner.test) if isinstance(n, ast.Name)
                    }
                    if names & (params - {"self", "cls"}):
                        rel = path.relative_to(ROOT)
                        found.append(f"{rel}:{inner.lineno} in {node.name}")
    assert found == [], "asserts on arguments:\n" + "\n".join(found)
