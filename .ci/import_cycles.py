"""No import cycle between any two modules of graphkernel or bench, package __init__ modules
included.

import-linter's `acyclic_siblings` contract (pyproject.toml) checks the siblings of each package;
it does not see a cycle through a package's own __init__ (graphkernel/__init__.py imports the
frontend; a module below importing `graphkernel` closes a circle). This checks the whole module
graph with grimp, import-linter's graph library, leaving out the imports the `acyclic` contract
ignores. Run from the repository root: python .ci/import_cycles.py
"""
from __future__ import annotations

import sys
import tomllib

import grimp

PACKAGES = ("graphkernel", "bench")


def ignored_imports() -> list[tuple[str, str]]:
    with open("pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    acyclic = next(c for c in contracts if c["id"] == "acyclic")
    pairs = (line.split("->") for line in acyclic.get("ignore_imports", []))
    return [(a.strip(), b.strip()) for a, b in pairs]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            module, i = work.pop()
            if i == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            if i < len(edges[module]):
                work.append((module, i + 1))
                nxt = edges[module][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
                continue
            if work:  # back in the caller: propagate the low link
                caller = work[-1][0]
                low[caller] = min(low[caller], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main() -> int:
    graph = grimp.build_graph(*PACKAGES)
    for importer, imported in ignored_imports():
        graph.remove_import(importer=importer, imported=imported)
    found = cycles(graph)
    for component in found:
        print(f"import cycle between {len(component)} modules:")
        members = set(component)
        for module in component:
            for imported in sorted(graph.find_modules_directly_imported_by(module) & members):
                lines = [d["line_number"] for d in
                         graph.get_import_details(importer=module, imported=imported)]
                print(f"  {module} -> {imported} (l.{', l.'.join(map(str, lines))})")
    if not found:
        print(f"no import cycles between the {len(graph.modules)} modules of "
              f"{' and '.join(PACKAGES)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
