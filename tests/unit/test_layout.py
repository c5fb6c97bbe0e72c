"""The package's layering, read from the source with the AST: no import cycle between its
subpackages (lazy imports inside functions count too), the ground modules below everything,
and no module over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "specpilot"
GROUND = {"config", "types", "tree", "sampling", "errors", "files", "prompts"}
"""Top-level modules every layer may use; they count as one layer, `ground`, below the rest."""
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = ("specpilot", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(SRC.rglob("*.py"))}


def layer(module: str) -> str:
    """`drafting` for specpilot.drafting.eagle; `ground` for specpilot.config; `api` for
    specpilot.api; `specpilot` for the package's own __init__."""
    parts = module.split(".")
    if len(parts) == 1:
        return "specpilot"
    return "ground" if parts[1] in GROUND else parts[1]


def imported(module: str, tree: ast.Module) -> list[tuple[str, int]]:
    """The specpilot modules `module` imports, anywhere in it, with their line."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from package import module` imports that module
                name = f"{base}.{alias.name}"
                found.append((name if name in MODULES else base, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "specpilot"]


def layer_imports() -> dict[tuple[str, str], list[str]]:
    """(importing layer, imported layer) → where (`module:line`), for distinct layers."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in MODULES.items():
        for name, line in imported(module, ast.parse(path.read_text())):
            edge = (layer(module), layer(name))
            if edge[0] != edge[1]:
                edges.setdefault(edge, []).append(f"{module}:{line}")
    return edges


def cycles(edges) -> list[list[str]]:
    """The strongly connected groups of more than one layer (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_scan_sees_the_package():
    edges = layer_imports()
    assert ("engine", "drafting") in edges and ("drafting", "policies") in edges
    assert imported("specpilot.api", ast.parse("def f():\n    from specpilot.bench import x\n"))


def test_ground_modules_import_only_ground():
    upward = {edge: where for edge, where in layer_imports().items() if edge[0] == "ground"}
    assert upward == {}


def test_no_import_cycle_between_subpackages():
    edges = layer_imports()
    found = cycles(edges)
    detail = [
        f"{a} → {b}: {', '.join(sorted(set(where)))}"
        for group in found
        for (a, b), where in sorted(edges.items())
        if a in group and b in group
    ]
    assert found == [], "\n".join(detail)


def test_no_module_over_400_lines():
    long = {
        path.relative_to(SRC).as_posix(): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
