"""The declared seam between the two-phase update's release-independent
mixins and each release's hooks, checked for every pin and every release
it serves (`make check`).

`two_phase_update_protocols.py` (a shared module) declares, as Protocols,
the methods a release's `SchedulerTwoPhaseUpdateHooks` and
`TokenizerTwoPhaseUpdateHooks` define, and the public members of upstream's
classes the mixins read. A release's hooks that lack a declared method, a
mixin that reads of `self` what neither Protocol declares, a declared
upstream member that is private, or a shared module that reads another
object's private attribute is a problem. The files are all the series' own,
so each release's are built from its patches alone (no release tree).
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import dataclass
from pathlib import Path

from devtools.releases import RELEASES_FILE, adjusted
from devtools.series import COMMON_DIR, Layout, git

MANAGERS = "python/sglang/srt/managers"
PROTOCOLS = f"{MANAGERS}/two_phase_update_protocols.py"


@dataclass(frozen=True)
class Side:
    name: str  # "scheduler" or "tokenizer"

    @property
    def title(self) -> str:
        return self.name.capitalize()

    @property
    def hooks_file(self) -> str:
        return f"{MANAGERS}/{self.name}_two_phase_update_hooks.py"

    @property
    def hooks_class(self) -> str:
        return f"{self.title}TwoPhaseUpdateHooks"

    @property
    def mixin_file(self) -> str:
        return f"{MANAGERS}/{self.name}_two_phase_update_mixin.py"

    @property
    def hooks_protocol(self) -> str:
        return f"{self.title}TwoPhaseUpdateHooksProtocol"

    @property
    def members_protocol(self) -> str:
        return f"{self.title}Members"


SIDES = (Side("scheduler"), Side("tokenizer"))
SEAM_FILES = (PROTOCOLS, *(f for s in SIDES for f in (s.hooks_file, s.mixin_file)))


def class_members(module: ast.Module, name: str) -> set[str] | None:
    """The methods and annotated attributes class `name` defines; None if the
    module has no such class."""
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return _members(node)
    return None


def _members(node: ast.ClassDef) -> set[str]:
    members = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.add(item.target.id)
    return members


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def self_reads(module: ast.Module) -> dict[str, int]:
    """Each attribute the module reads of `self` that its own classes neither
    define nor assign, with the first line reading it."""
    own: set[str] = set()
    reads: dict[str, int] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef):
            own |= _members(node)
            own |= {
                t.id
                for item in node.body
                if isinstance(item, ast.Assign)
                for t in item.targets
                if isinstance(t, ast.Name)
            }
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            if isinstance(node.ctx, ast.Load):
                reads.setdefault(node.attr, node.lineno)
            else:
                own.add(node.attr)
    return {name: line for name, line in reads.items() if name not in own}


def foreign_private_reads(module: ast.Module) -> list[tuple[int, str]]:
    """`x._name` where `x` is not `self` or `cls`: another object's private
    state."""
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                found.append((node.lineno, node.attr))
    return sorted(found)


def check_tree(tree: Path, label: str) -> list[str]:
    """The seam in `tree` (a series applied, or its seam files alone)."""
    if not (tree / PROTOCOLS).is_file():
        return [f"{label}: {PROTOCOLS}: missing (the declared hooks)"]
    protocols = ast.parse((tree / PROTOCOLS).read_text())
    problems = []
    for side in SIDES:
        declared_hooks = class_members(protocols, side.hooks_protocol)
        members = class_members(protocols, side.members_protocol)
        if declared_hooks is None or members is None:
            problems.append(
                f"{label}: {PROTOCOLS}: declares no {side.hooks_protocol} "
                f"or {side.members_protocol}"
            )
            continue
        problems += [
            f"{label}: {PROTOCOLS}: {side.members_protocol}.{name} is private "
            "upstream state: read it through a hook"
            for name in sorted(members)
            if _is_private(name)
        ]
        hooks = class_members(
            ast.parse((tree / side.hooks_file).read_text()), side.hooks_class
        )
        if hooks is None:
            problems.append(f"{label}: {side.hooks_file}: no {side.hooks_class}")
            continue
        problems += [
            f"{label}: {side.hooks_file}: {side.hooks_class} lacks {name}, "
            f"which {side.hooks_protocol} declares"
            for name in sorted(declared_hooks - hooks)
        ]
        mixin = ast.parse((tree / side.mixin_file).read_text())
        problems += [
            f"{label}: {side.mixin_file}:{line}: reads self.{name}, which "
            f"neither {side.hooks_protocol} nor {side.members_protocol} declares"
            for name, line in sorted(self_reads(mixin).items())
            if name not in declared_hooks | members
        ]
    return problems


# torch's own, not a release's: torch.nn.Module's (a model's parameters,
# buffers, which of them a checkpoint holds, and submodules as torch keeps
# them), torch.distributed's (a group's collective timeout, which no
# public call gives) and a tensor's version counter (whether it was written).
TORCH_PRIVATE = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_make_subclass",
        "_non_persistent_buffers_set",
        "_get_backend",
        "_timeout",
        "_version",
    }
)
# Upstream private state a shared module still reads directly: upstream's
# RWLock does not wake the readers queued behind a writer whose wait was
# cancelled (a fix for utils/aio_rwlock.py is due). Only shrinks, to none.
STILL_READ = frozenset(
    {
        ("sglang/srt/weight_sync/two_phase_requests.py", "_lock"),
        ("sglang/srt/weight_sync/two_phase_requests.py", "_cond"),
    }
)


def check_shared_modules(layout: Layout) -> list[str]:
    """No shared module reads another object's private attribute (torch's
    modules' and STILL_READ aside)."""
    problems = []
    python = layout.root / COMMON_DIR / "python"
    for path in sorted(python.rglob("*.py")):
        rel = path.relative_to(python).as_posix()
        for line, name in foreign_private_reads(ast.parse(path.read_text())):
            if name in TORCH_PRIVATE or (rel, name) in STILL_READ:
                continue
            problems.append(
                f"{COMMON_DIR}/python/{rel}:{line}: reads another object's "
                f"private {name}: "
                "upstream state is read through a hook"
            )
    return problems


def seam_files_of(layout: Layout, dest: Path) -> None:
    """Write the seam files `layout`'s series builds (they are all the
    series' own) into `dest`."""
    git(dest, "init", "-q")
    for patch in layout.patches():
        includes = [f"--include={f}" for f in SEAM_FILES]
        git(dest, "apply", "--whitespace=nowarn", *includes, str(patch))


def check_series(layout: Layout) -> list[str]:
    """The seam on the pin `layout` and on every release its series serves."""
    problems = check_shared_modules(layout)
    mapped = (layout.root / RELEASES_FILE).is_file()
    for release in ["", *(adjusted(layout.root, layout.version) if mapped else [])]:
        with tempfile.TemporaryDirectory() as tmp:
            seam_files_of(Layout(layout.root, layout.version, release), Path(tmp))
            problems += check_tree(Path(tmp), release or layout.version)
    return problems
