"""The house's layers, enforced: walk every module's imports with ``ast`` and check the graph.

Layers, lowest first (an import may go down or sideways, never up)::

    core        oomguard.errors, units, report, times, _types, _version
    sources/    all I/O (Root, snapshot, GPU driver query)
    probes/     parse + assemble the report
    policy/     budget, plan, profiles, MemoryBudget
    supervisor/ run loop, process primitives, restart, isolation, events
    verify/     verify, allocation child, pin probes
    agent/      spool, sender, loop, forwarder
    commands/   one module per command + flags
    top         oomguard (``__init__``), oomguard.__main__, oomguard.cli

``manager/`` is an optional extra beside the stack: it imports only the core and itself, and only
the lazy bridge (``ALLOWED_MANAGER_IMPORTERS``) imports it. Inside, its rooms are layered the same
way (``MANAGER_ROOMS``), lowest first::

    base        oomguard.manager (``__init__``), times, redact, logs (text or JSON), settings (the configuration)
    contract    reportschema (the JSON Schema engine), contract (the report as the manager takes it), bodies
    db/         the tables, engines and migrations
    policy      alerts, retention, learning (the fleet learns: the recommender's rule)
    store/      reads and writes, the group-commit writer, database health
    web/        HTTP: API, dashboard, middleware, sessions, metrics, uvicorn
    top         app (wires it), cli (``oomguard manager``)

What counts as an import: ``import``/``from`` statements anywhere in a module (module level,
inside functions: lazy imports count, inside ``else:`` of a TYPE_CHECKING test),
``importlib.import_module("oomguard.x")``/``__import__`` calls (``import_module(f"oomguard.pkg.{name}")``,
a dispatch chosen at run time, counts as importing every module directly in ``oomguard.pkg``), and the
values of a package's ``_LAZY`` map (``oomguard/__init__.py`` loads those on first attribute access). Imports in the
body of ``if TYPE_CHECKING:`` are excluded: they never run. ``from oomguard.x import y`` where
``oomguard.x.y`` is a module is an import of ``oomguard.x.y``; otherwise of ``oomguard.x``.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = "oomguard"
SRC = Path(__file__).resolve().parent.parent / "src" / PACKAGE

CORE = frozenset(
    f"{PACKAGE}.{m}" for m in ("errors", "units", "report", "times", "_types", "_version", "nodes", "labels")
)
TOP = frozenset({PACKAGE, f"{PACKAGE}.__main__", f"{PACKAGE}.cli"})
LAYERS = ("core", "sources", "probes", "policy", "runtime", "supervisor", "verify", "agent", "commands", "top")
RANK = {name: i for i, name in enumerate(LAYERS)}
# The one lazy bridge into the optional extra (cli.py until commands/manager.py takes over).
ALLOWED_MANAGER_IMPORTERS = frozenset({f"{PACKAGE}.cli", f"{PACKAGE}.commands.manager"})
MANAGER = f"{PACKAGE}.manager"
# The manager's rooms, lowest first: a module directly in manager/ is named here; one in a folder
# (db/, store/, web/) takes its folder's room. ``""`` is the package itself (``manager/__init__``).
MANAGER_ROOMS = (
    ("base", ("", "times", "redact", "logs", "settings")),
    ("contract", ("reportschema", "contract", "bodies")),
    ("db", ("db",)),
    ("policy", ("alerts", "retention", "learning")),
    ("store", ("store",)),
    ("web", ("web",)),
    ("top", ("app", "cli")),
)
ROOM = {name: room for room, names in MANAGER_ROOMS for name in names}
ROOM_RANK = {room: i for i, (room, _) in enumerate(MANAGER_ROOMS)}

Graph = Mapping[str, Iterable[str]]


# --- collecting the graph -------------------------------------------------------------------------


def module_name(path: Path, src: Path) -> str:
    """``src/oomguard/probes/cgroup.py`` -> ``oomguard.probes.cgroup``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package (folders without ``__init__.py``, e.g. migrations, included)."""
    return {module_name(p, src): p for p in sorted(src.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node that can run: the body of ``if TYPE_CHECKING:`` is skipped (its ``else`` is kept)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.append(node.test)
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve_relative(module: str | None, level: int, importer: str, is_package: bool) -> str:
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"{importer}: relative import beyond the top-level package")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _lazy_targets(tree: ast.Module, importer: str) -> list[str]:
    """Values of a package's module-level ``_LAZY = {"name": "sub.module"}`` map, relative to it."""
    out: list[str] = []
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Dict)):
            continue
        if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in stmt.targets):
            for value in stmt.value.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out.append(f"{importer}.{value.value}")
    return out


def _dynamic_targets(call: ast.Call, known: set[str]) -> list[str]:
    """``import_module("oomguard.x")`` -> x; ``import_module(f"oomguard.pkg.{name}")`` -> every module
    directly in ``oomguard.pkg`` (the name is chosen at run time: any of them may be loaded)."""
    func = call.func
    fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if fname not in ("import_module", "__import__"):
        return []
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        prefix = head.value if isinstance(head, ast.Constant) and isinstance(head.value, str) else ""
        # "oomguard.{x}" alone is the package's lazy loader: its _LAZY map names the targets.
        if prefix.startswith(PACKAGE + ".") and prefix.endswith(".") and prefix.count(".") >= 2:
            return sorted(m for m in known if m.startswith(prefix) and "." not in m[len(prefix) :])
    return []


def imports_of(source: str, importer: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """The ``oomguard`` modules that ``source`` (the text of module ``importer``) imports at run time."""
    known = set(known)
    tree = ast.parse(source)
    found: set[str] = set()

    def add(name: str) -> None:
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            found.add(name)

    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(node.module, node.level, importer, is_package) if node.level else node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base)
        elif isinstance(node, ast.Call) and node.args:
            for target in _dynamic_targets(node, known):
                add(target)
    if is_package:
        for target in _lazy_targets(tree, importer):
            add(target)
    found.discard(importer)
    return found


def build_graph(src: Path = SRC) -> dict[str, set[str]]:
    modules = discover(src)
    return {
        name: imports_of(path.read_text(), name, path.name == "__init__.py", modules) for name, path in modules.items()
    }


# --- the rules (pure functions on a graph, so a planted violation shows they can fail) ------------------


def layer_of(module: str) -> str | None:
    """The layer name, ``"manager"``, or None for a module the table does not place."""
    if module in CORE:
        return "core"
    if module in TOP:
        return "top"
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == PACKAGE:
        if parts[1] == "manager":
            return "manager"
        if parts[1] in RANK and parts[1] not in ("core", "top"):
            return parts[1]
    return None


def room_of(module: str) -> str | None:
    """The manager room of a module of ``manager/`` (by its first name below ``manager``), or None."""
    if module != MANAGER and not module.startswith(MANAGER + "."):
        return None
    return ROOM.get(module[len(MANAGER) + 1 :].split(".", maxsplit=1)[0])


def find_cycles(graph: Graph) -> list[list[str]]:
    """Concrete cycles (``[a, b, ..., a]``): the shortest through each module of each strongly connected
    component (Tarjan), so every module caught in a cycle is named in at least one."""
    edges = {node: sorted(set(targets)) for node, targets in graph.items()}
    for targets in list(edges.values()):
        for t in targets:
            edges.setdefault(t, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0

    def strongconnect(root: str) -> None:
        nonlocal counter
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            succ = edges[node]
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                components.append(comp)

    for node in sorted(edges):
        if node not in index:
            strongconnect(node)

    cycles: list[list[str]] = []
    seen: set[frozenset[tuple[str, str]]] = set()
    for comp in components:
        members = set(comp)
        if len(comp) == 1 and comp[0] not in edges[comp[0]]:
            continue
        for start in sorted(members):  # the shortest cycle through each member, each cycle once
            cycle = _cycle_through(start, members, edges)
            key = frozenset(itertools.pairwise(cycle))
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
    return sorted(cycles)


def _cycle_through(start: str, members: set[str], edges: Mapping[str, list[str]]) -> list[str]:
    """A shortest path start -> ... -> start inside one component (BFS)."""
    prev: dict[str, str] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in edges[node]:
            if nxt not in members:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover: a component always has one


def edges(graph: Graph) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets)


def upward_imports(graph: Graph) -> list[str]:
    """Imports from a lower layer into a higher one (manager is judged by its own rules)."""
    out = []
    for a, b in edges(graph):
        la, lb = layer_of(a), layer_of(b)
        if la in RANK and lb in RANK and RANK[la] < RANK[lb]:
            out.append(f"{a} ({la}) -> {b} ({lb})")
    return out


def unplaced_modules(graph: Graph) -> list[str]:
    names = set(graph) | {b for _, b in edges(graph)}
    return sorted(n for n in names if layer_of(n) is None)


def manager_importers(graph: Graph) -> list[str]:
    """Edges into manager/ from outside it, other than the allowed bridge."""
    return [
        f"{a} -> {b}"
        for a, b in edges(graph)
        if layer_of(b) == "manager" and layer_of(a) != "manager" and a not in ALLOWED_MANAGER_IMPORTERS
    ]


def manager_non_core_imports(graph: Graph) -> list[str]:
    """manager/ may import the core and itself, nothing else of the package."""
    return [
        f"{a} -> {b}" for a, b in edges(graph) if layer_of(a) == "manager" and layer_of(b) not in ("core", "manager")
    ]


def manager_upward_imports(graph: Graph) -> list[str]:
    """Imports inside manager/ from a lower room into a higher one (``MANAGER_ROOMS``)."""
    out = []
    for a, b in edges(graph):
        ra, rb = room_of(a), room_of(b)
        if ra is not None and rb is not None and ROOM_RANK[ra] < ROOM_RANK[rb]:
            out.append(f"{a} ({ra}) -> {b} ({rb})")
    return out


def manager_unplaced(graph: Graph) -> list[str]:
    names = set(graph) | {b for _, b in edges(graph)}
    return sorted(n for n in names if layer_of(n) == "manager" and room_of(n) is None)


def sources_above_core(graph: Graph) -> list[str]:
    return [
        f"{a} -> {b}" for a, b in edges(graph) if layer_of(a) == "sources" and layer_of(b) not in ("core", "sources")
    ]


# --- the real package -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph()


def test_the_walk_sees_every_module(graph: dict[str, set[str]]) -> None:
    assert len(graph) > 40, sorted(graph)
    for expected in ("oomguard", "oomguard.cli", "oomguard.sources.root", "oomguard.probes.cgroup", "oomguard.manager"):
        assert expected in graph
    # The package's lazy loader is followed (its _LAZY map), and so is every function-level import.
    assert "oomguard.policy.budget" in graph["oomguard"]
    lazy = 0
    for name, path in discover().items():
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PACKAGE):
                    lazy += 1
                    targets = {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
                    assert targets & graph[name], (name, node.module)
    assert lazy > 5, "the package imports heavy parts lazily; the walk must see those imports"


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert unplaced_modules(graph) == [], "add the module to a layer folder or to CORE/TOP in this test"


def test_every_import_resolves_to_a_module(graph: dict[str, set[str]]) -> None:
    missing = sorted(f"{a} -> {b}" for a, b in edges(graph) if b not in graph)
    assert missing == []


def test_no_import_cycle(graph: dict[str, set[str]]) -> None:
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_from_a_lower_layer_into_a_higher_one(graph: dict[str, set[str]]) -> None:
    bad = upward_imports(graph)
    assert bad == [], "upward imports (layers: " + " < ".join(LAYERS) + "):\n" + "\n".join(bad)


def test_sources_import_only_the_core(graph: dict[str, set[str]]) -> None:
    bad = sources_above_core(graph)
    assert bad == [], "sources/ is the lowest I/O layer:\n" + "\n".join(bad)


def test_only_the_bridge_imports_manager(graph: dict[str, set[str]]) -> None:
    bad = manager_importers(graph)
    assert bad == [], "manager/ is an optional extra:\n" + "\n".join(bad)


def test_manager_imports_only_the_core(graph: dict[str, set[str]]) -> None:
    bad = manager_non_core_imports(graph)
    assert bad == [], "manager/ may import only core modules:\n" + "\n".join(bad)


def test_no_import_is_kept_for_its_side_effect() -> None:
    """An import that binds a name nobody uses (ruff's F401, silenced) is there for what importing
    does: a table's columns added elsewhere, a registry filled. Declare the thing where it lives."""
    kept = [
        f"{path.relative_to(SRC.parent)}:{n}"
        for path in discover().values()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "noqa: F401" in line
    ]
    assert kept == []


def test_every_manager_module_has_a_room(graph: dict[str, set[str]]) -> None:
    assert manager_unplaced(graph) == [], "add the module to a manager folder or to MANAGER_ROOMS in this test"


def test_the_manager_imports_only_its_own_room_and_the_rooms_below(graph: dict[str, set[str]]) -> None:
    bad = manager_upward_imports(graph)
    rooms = " < ".join(room for room, _ in MANAGER_ROOMS)
    assert bad == [], f"upward imports inside manager/ (rooms: {rooms}):\n" + "\n".join(bad)


# --- the checker itself can fail ---------------------------------------------------------------------


def test_imports_of_reads_lazy_relative_and_submodule_imports() -> None:
    known = {"oomguard.probes", "oomguard.probes.cgroup", "oomguard.probes.parsers", "oomguard.units", "oomguard.x"}
    source = """
import os
import oomguard.units
from . import parsers
from .cgroup import read_cgroup
from ..x import thing
from oomguard.probes import cgroup
TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard.hidden import Never
else:
    from oomguard.shown import Always

def lazy():
    from oomguard.commands.render import to_json
    import importlib
    importlib.import_module("oomguard.dynamic")

_LAZY = {"probe": "policy.budget"}
"""
    found = imports_of(source, "oomguard.probes.memory", is_package=False, known=known)
    assert found == {
        "oomguard.units",
        "oomguard.probes.parsers",
        "oomguard.probes.cgroup",
        "oomguard.x",
        "oomguard.shown",
        "oomguard.commands.render",
        "oomguard.dynamic",
    }
    # In a package's __init__, "." is the package itself, and its _LAZY map names submodules.
    assert imports_of("from . import parsers", "oomguard.probes", True, known) == {"oomguard.probes.parsers"}
    lazy_map = '_LAZY = {"probe": "policy.budget", "Root": "sources.root"}\n'
    assert imports_of(lazy_map, "oomguard", True, known) == {"oomguard.policy.budget", "oomguard.sources.root"}
    assert imports_of(lazy_map, "oomguard.units", False, known) == set()  # only a package's map is a lazy loader
    assert imports_of("from .x import y", "oomguard.probes", True, known) == {"oomguard.probes.x"}
    # A run-time choice among a package's modules counts as importing each of them.
    dispatch = "def run(name):\n    importlib.import_module(f'oomguard.probes.{name}')\n"
    assert imports_of(dispatch, "oomguard.cli", False, known) == {"oomguard.probes.cgroup", "oomguard.probes.parsers"}
    assert imports_of("import_module(f'oomguard.{name}')", "oomguard", True, known) == set()


def test_checker_reports_a_planted_cycle() -> None:
    planted = {
        "oomguard.a": {"oomguard.b"},
        "oomguard.b": {"oomguard.c"},
        "oomguard.c": {"oomguard.a", "oomguard.d"},
        "oomguard.d": set(),
        "oomguard.e": {"oomguard.e"},
    }
    assert find_cycles(planted) == [
        ["oomguard.a", "oomguard.b", "oomguard.c", "oomguard.a"],
        ["oomguard.e", "oomguard.e"],
    ]
    assert find_cycles({"oomguard.a": {"oomguard.b"}, "oomguard.b": set()}) == []


def test_checker_reports_planted_layer_violations() -> None:
    planted = {
        "oomguard.sources.root": {"oomguard.probes.gpu", "oomguard.errors", "oomguard.sources.gpu"},
        "oomguard.probes.gpu": {"oomguard.sources.gpu", "oomguard.probes.parsers"},
        "oomguard.units": {"oomguard.cli"},
        "oomguard.cli": {"oomguard.manager.cli", "oomguard.policy.budget"},
        "oomguard.agent.agent": {"oomguard.manager.store"},
        "oomguard.manager.cli": {"oomguard.errors", "oomguard.probes.gpu", "oomguard.manager.app"},
    }
    assert upward_imports(planted) == [
        "oomguard.sources.root (sources) -> oomguard.probes.gpu (probes)",
        "oomguard.units (core) -> oomguard.cli (top)",
    ]
    assert sources_above_core(planted) == ["oomguard.sources.root -> oomguard.probes.gpu"]
    assert manager_importers(planted) == ["oomguard.agent.agent -> oomguard.manager.store"]
    assert manager_non_core_imports(planted) == ["oomguard.manager.cli -> oomguard.probes.gpu"]
    assert unplaced_modules({"oomguard.stray": {"oomguard.units"}}) == ["oomguard.stray"]


def test_checker_reports_planted_violations_of_the_managers_order() -> None:
    planted = {
        "oomguard.manager.app": {"oomguard.manager.web.api", "oomguard.manager.store", "oomguard.manager"},
        "oomguard.manager.web.api": {"oomguard.manager.store.queries", "oomguard.manager.alerts"},
        "oomguard.manager.store.writer": {"oomguard.manager.db", "oomguard.manager.web.deps"},
        "oomguard.manager.alerts": {"oomguard.manager.db.tables", "oomguard.manager.store.queries"},
        "oomguard.manager.db.tables": {"oomguard.manager.times"},
        "oomguard.manager.times": {"oomguard.manager.cli", "oomguard.times"},
        "oomguard.manager.settings": {"oomguard.manager.redact"},
        "oomguard.manager.stray": {"oomguard.manager.times"},
    }
    assert manager_upward_imports(planted) == [
        "oomguard.manager.alerts (policy) -> oomguard.manager.store.queries (store)",
        "oomguard.manager.store.writer (store) -> oomguard.manager.web.deps (web)",
        "oomguard.manager.times (base) -> oomguard.manager.cli (top)",
    ]
    assert manager_unplaced(planted) == ["oomguard.manager.stray"]
    assert room_of("oomguard.manager") == "base" and room_of("oomguard.manager.db.migrations.env") == "db"
    assert room_of("oomguard.managerx") is None and room_of("oomguard.units") is None


def test_walk_of_a_planted_manager_finds_its_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "oomguard"
    (pkg / "manager" / "store").mkdir(parents=True)
    (pkg / "manager" / "web").mkdir()
    for init in (pkg, pkg / "manager", pkg / "manager" / "store", pkg / "manager" / "web"):
        (init / "__init__.py").write_text("")
    (pkg / "manager" / "web" / "api.py").write_text("from oomguard.manager.store import writer\n")
    (pkg / "manager" / "store" / "writer.py").write_text("def f():\n    from ..web.api import g\n")
    graph = build_graph(pkg)
    assert manager_upward_imports(graph) == ["oomguard.manager.store.writer (store) -> oomguard.manager.web.api (web)"]


def test_walk_of_a_planted_package_finds_its_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "oomguard"
    (pkg / "sources").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sources" / "__init__.py").write_text("")
    (pkg / "units.py").write_text("def f():\n    from oomguard.sources import root\n")
    (pkg / "sources" / "root.py").write_text("from ..units import f\n")
    graph = build_graph(pkg)
    assert graph["oomguard.units"] == {"oomguard.sources.root"}
    assert find_cycles(graph) == [["oomguard.sources.root", "oomguard.units", "oomguard.sources.root"]]
    assert upward_imports(graph) == ["oomguard.units (core) -> oomguard.sources.root (sources)"]
