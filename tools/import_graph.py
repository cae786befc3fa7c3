"""The import graph of spcli/ and benches/: circles, and imports made inside functions.

    python tools/import_graph.py   # every circle, layer climb and function-level import; exit 1 on a circle or climb

Every `import` and `from ... import` in a module counts, at any depth (an import inside a function still closes a
circle; it only hides it). A function-level import of spcli code is listed, so that each one's reason can be read
beside it (tests/test_import_graph.py allows those whose line or the line above says why).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spcli", "benches")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The known module a dotted name lands in (a name imported from a module maps to that module)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a known module."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = []

    def _sibling(name: str) -> str | None:
        # a script in benches/ imports its neighbours by their bare names (benches/ is on its sys.path)
        package = module.split(".")[0]
        return _resolve(f"{package}.{name}", known) if package == "benches" and name else None

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = _resolve(alias.name, known) or _sibling(alias.name)
                    if target:
                        found.append((target, child.lineno, in_function))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = module.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    target = (_resolve(f"{base}.{alias.name}", known) or _resolve(base, known)
                              or (not child.level and _sibling(base)))
                    if target:
                        found.append((target, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return [edge for edge in found if edge[0] != module]


def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {name: set() for name in known}
    for name, path in known.items():
        for target, _, _ in imports(name, path, known):
            # a package's __init__ is loaded by importing anything under it: `a.b` imports `a` too
            edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


# spcli's layers, lowest first: a module may import its own layer and those below, never one above. The longest
# matching prefix places a module (spcli.slurm.tasks, pure functions the job reads, sits below the job; the Ray Data
# processor, and the spcli.ray package that offers it, are entry points beside the API; "=name" matches name alone).
LAYERS = (
    ("spcli.errors", "spcli.config", "spcli.__init__"),
    ("spcli.models",),
    ("spcli.io", "spcli.kernels", "spcli.plan", "spcli.slurm.tasks"),
    ("spcli.stages",),
    ("spcli.engines",),
    ("spcli.job",),
    ("spcli.ray", "spcli.slurm"),
    ("spcli.evaluate", "spcli.calibrate", "spcli.benchmark", "spcli.inspect"),
    ("spcli.commands", "spcli.api", "spcli.cli", "spcli.__main__", "spcli.ray.processor", "=spcli.ray"),
)


def layer(module: str) -> int | None:
    if module == "spcli":
        module = "spcli.__init__"  # the package itself holds only its version and distribution name
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix.startswith("="):
                if module == prefix[1:]:
                    return index
                continue
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def climbs(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where a lower layer imports a higher one."""
    found = []
    for source in sorted(edges):
        for target in sorted(edges[source]):
            low, high = layer(source), layer(target)
            if low is not None and high is not None and high > low:
                found.append((source, target))
    return found


def function_imports() -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every import of spcli or benches code made inside a function."""
    known = modules()
    found = []
    for name, path in known.items():
        for target, line, in_function in imports(name, path, known):
            if in_function:
                found.append((str(path.relative_to(ROOT)), line, target))
    return found


def main() -> int:
    edges = graph()
    found = circles(edges)
    for component in found:
        print("circle:", " <-> ".join(component))
    upward = climbs(edges)
    for source, target in upward:
        print(f"layer climb: {source} (layer {layer(source)}) imports {target} (layer {layer(target)})")
    for file, line, target in function_imports():
        print(f"function-level import: {file}:{line} -> {target}")
    print(f"{len(found)} circle(s), {len(upward)} layer climb(s)")
    return 1 if found or upward else 0


if __name__ == "__main__":
    sys.exit(main())
