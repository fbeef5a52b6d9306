"""No import cycle among the modules of app/sglang_rvv: lower layers never call back up.

Every import counts, wherever it is written: at the top, inside a function (a lazy import
still ties the two modules together) and under ``if TYPE_CHECKING:``. The imports are read
from the source, so nothing is imported to check them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from image_support import REPO

APP = REPO / "app"
PACKAGE = "sglang_rvv"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((APP / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(APP).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``module`` imports (a package's own submodules count, its parents do not)."""
    found = set()
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_checker_reads_relative_and_lazy_imports():
    modules = _modules()
    assert "sglang_rvv.routing" in _imports("sglang_rvv.srt.methods", modules["sglang_rvv.srt.methods"], modules)
    assert "sglang_rvv.policy" in _imports("sglang_rvv.srt.plugin", modules["sglang_rvv.srt.plugin"], modules)


def test_no_import_cycle_among_the_apps_modules():
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    assert _cycles(graph) == []


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    reached, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    return reached


def test_the_policy_reaches_nothing_of_sglangs_side():
    """The runtime core (the policy and everything it imports) never imports sglang_rvv.srt: SGLang's
    side registers its adapter with the core (sglang_rvv.srt.adapter), not the other way round."""
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    reached = _reached(graph, "sglang_rvv.policy")
    assert {"sglang_rvv.adapters", "sglang_rvv.routing", "sglang_rvv.packed_state"} <= reached
    assert sorted(m for m in reached if m.startswith("sglang_rvv.srt")) == []


def test_the_entrypoint_imports_no_harness():
    """The container entrypoint runs at every start: it needs the SGLang arguments, not the
    supervisor, the client, the cache build, the benchmarks or the smoke."""
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    reached = _reached(graph, "sglang_rvv.entrypoint")
    assert "sglang_rvv.launch.args" in reached
    harness = ("sglang_rvv.launch.process", "sglang_rvv.launch.client", "sglang_rvv.cache_build",
               "sglang_rvv.bench", "sglang_rvv.smoke")
    assert sorted(m for m in reached if m.startswith(harness)) == []
