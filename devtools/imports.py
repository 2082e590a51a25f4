"""Every `from sglang... import name` in the files a series touches still
resolves once the whole series is applied.

A patch that moves a name out of a module breaks every file importing it,
including files the patch itself does not touch; the per-patch check only
sees the imports a patch adds. This reads the patched files (else the
pristine ones) with `ast` and names each import whose module no longer
binds the name. Standard library only.
"""

from __future__ import annotations

import ast
from pathlib import Path


def _module_file(trees: tuple[Path, ...], module: str) -> Path | None:
    """The file of `module` in the first tree that has it."""
    rel = Path("python", *module.split("."))
    for base in trees:
        for path in (rel.with_suffix(".py"), rel / "__init__.py"):
            if (base / path).is_file():
                return base / path
    return None


def _exists_otherwise(trees: tuple[Path, ...], module: str) -> bool:
    """A module without a .py file: a namespace package or an extension."""
    rel = Path("python", *module.split("."))
    return any((base / rel).is_dir() or any(base.glob(f"{rel}.*.so")) for base in trees)


def _is_package_member(trees: tuple[Path, ...], module: str, name: str) -> bool:
    rel = Path("python", *module.split("."))
    return any(
        (base / rel / name).is_dir() or (base / rel / f"{name}.py").is_file()
        for base in trees
    )


def _top_level_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, descending into if/try/with blocks."""
    found: list[ast.stmt] = []
    for node in body:
        found.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                found.extend(_top_level_statements(getattr(node, block, [])))
            for handler in getattr(node, "handlers", []):
                found.extend(_top_level_statements(handler.body))
    return found


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _target_names(elt)]
    return []


def bound_names(path: Path) -> set[str] | None:
    """Names a module binds at its top level; None when it cannot tell
    (a star import, a module `__getattr__`, or source that does not parse:
    the compile check names that)."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), str(path))
    except SyntaxError:
        return None
    names: set[str] = set()
    for node in _top_level_statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(n for t in node.targets for n in _target_names(t))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            names.update(_target_names(node.target))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
    return None if "__getattr__" in names else names


def unresolved_imports(
    patched: Path, pristine: Path, files: list[str]
) -> list[tuple[str, int, str, str]]:
    """(file, line, module, name) of each `from sglang... import name` in
    `files` (relative to `patched`), at any depth (a lazy import in a function
    too), that the patched tree, else the pristine one, does not bind, or
    whose module neither has; an import inside a `try` is optional."""
    trees = (patched, pristine)
    cache: dict[Path, set[str] | None] = {}
    missing = []
    for rel in files:
        if not rel.endswith(".py") or not (patched / rel).is_file():
            continue
        tree = ast.parse((patched / rel).read_text(errors="replace"), rel)
        guarded = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.Try)
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level:
                continue
            module = node.module or ""
            if not module.startswith("sglang"):
                continue
            source = _module_file(trees, module)
            if source is None:
                # A module neither tree has: an error, unless the import is
                # tried (an optional dependency) or the module is no .py file.
                if id(node) not in guarded and not _exists_otherwise(trees, module):
                    missing.extend(
                        (rel, node.lineno, module, a.name) for a in node.names
                    )
                continue
            if source not in cache:
                cache[source] = bound_names(source)
            names = cache[source]
            if names is None or id(node) in guarded:
                continue  # unknowable, or tried (an optional extension)
            for alias in node.names:
                if (
                    alias.name == "*"
                    or alias.name in names
                    or _is_package_member(trees, module, alias.name)
                ):
                    continue
                missing.append((rel, node.lineno, module, alias.name))
    return missing


_MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__path__"}
_MODULE_NAMES |= {"__package__", "__loader__", "__builtins__", "__annotations__"}


def unbound_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of each name `source` reads that it binds nowhere (no
    assignment, parameter, definition, import or handler of that name
    anywhere in the file) and that is no builtin: a NameError waiting.
    Scopes are not told apart, so a name bound in one function hides its
    use in another; a star import hides everything."""
    import builtins

    tree = ast.parse(source)
    bound = set(dir(builtins)) | _MODULE_NAMES
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return []
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return sorted(
        (node.lineno, node.id)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name)
        and isinstance(node.ctx, ast.Load)
        and node.id not in bound
    )
