"""The global names a module uses but never binds: what a 3-way merge leaves
behind when it brings a call into a module whose import line it does not
touch (a NameError only when that line runs, which compiling and resolving
imports do not see). Standard library only (`symtable`).
"""

from __future__ import annotations

import builtins
import re
import symtable

# Bound in every module without a statement binding them.
_MODULE_NAMES = frozenset(
    {
        "__annotations__",
        "__builtins__",
        "__cached__",
        "__doc__",
        "__file__",
        "__loader__",
        "__name__",
        "__package__",
        "__path__",
        "__spec__",
    }
)


def unbound_globals(source: str, filename: str = "<module>") -> set[str]:
    """Names the module's code looks up as globals that no statement of the
    module binds and that are no builtins; empty for a module with a star
    import (it may bind anything)."""
    top = symtable.symtable(source, filename, "exec")
    if re.search(r"^\s*from\s+\S+\s+import\s+\*", source, re.M):
        return set()
    bound = set(_MODULE_NAMES) | set(dir(builtins))
    used: set[str] = set()

    def visit(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if table is top:
                if symbol.is_assigned() or symbol.is_imported():
                    bound.add(name)
                elif symbol.is_referenced():
                    used.add(name)
            elif symbol.is_declared_global() and symbol.is_assigned():
                bound.add(name)  # `global x; x = ...` in a function
            elif symbol.is_global() and symbol.is_referenced():
                used.add(name)
        for child in table.get_children():
            visit(child)

    visit(top)
    return used - bound
