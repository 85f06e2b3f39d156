"""The engine's package layout holds: no import circles between its modules, and nodes/ and the
server-side packages import none of the rank-only ones (train, memory, patches, models).
tests/with_comfy/test_server_imports.py checks the same in ComfyUI's own custom-node loader."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "engine"
RANK_ONLY = ("train", "memory", "patches", "models")  # the packages only a training process imports


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules() -> dict[str, Path]:
    return {module_name(p): p for p in ENGINE.rglob("*.py")}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The engine modules `name` imports anywhere in its file (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from . import x` imports the module x
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_engine():
    modules = engine_modules()
    graph = {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the graph really was read
    assert cycles(graph) == []


def test_rank_only_packages_are_never_imported_by_nodes_or_shared_modules():
    """nodes/ and the engine's server-side modules import no rank-only package, not even lazily
    (engine/__main__.py is the ranks' entry point and may)."""
    modules = engine_modules()
    known = set(modules)
    sources = {n: p for n, p in modules.items() if n != "engine" and n.split(".")[1] not in (*RANK_ONLY, "__main__")}
    sources |= {module_name(p): p for p in (REPO / "nodes").glob("*.py")}
    offenders = [f"{name} -> {target}" for name, path in sorted(sources.items())
                 for target in sorted(imported_modules(name, path, known)) if target.split(".")[1] in RANK_ONLY]
    assert len(sources) > 30
    assert offenders == []
