"""The packages depend on each other in one direction (docs/design.md), so do the files within
them (no two import each other, directly or through others; docs/design.md lists each file's
level), and the light packages import without the heavy ones."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Which project packages each package may import (its own modules always).
ALLOWED = {
    "hlo_trace": set(),
    "hardware": {"hlo_trace"},
    # models.opensora.theory takes the ring volumes from their one home, hardware.collectives
    # (numpy + stdlib: no torch, no jaxlib).
    "models": {"hlo_trace", "hardware"},
    # hlo_analyzer.mapping rebuilds an STDiT3 pair's ops from its shape dictionary with
    # models.opensora.block_ops (torch-free, like every model module it may import).
    "hlo_analyzer": {"hlo_trace", "hardware", "models"},
    # planning.plan_search estimates plans with the hardware model (hardware sits below
    # hlo_analyzer, so this adds no circle).
    # the plan vocabulary (configs, cases, module plans, calibration requests, the strategies'
    # feasibility rules, PipeFusion's patches, training options): torch-free, below the tracer
    # and the search
    "plans": {"hlo_trace", "models"},
    "tracing": {"hlo_trace", "models", "plans", "hlo_analyzer", "hardware"},
    # the plan search, its estimates and the study runner: on top of the analysis it reads
    # (hlo_analyzer.analyze_dump); the tracer it starts in processes of its own through one
    # protocol (TRACER_PROTOCOL below), never imported.
    "planning": {"hlo_trace", "models", "plans", "hlo_analyzer", "hardware"},
    # hlo-report's pages are made from the commands' JSON and CSV files, never from their code:
    # rendering apart from computing.
    "hlo_report": {"hlo_trace"},
}


def _imported_packages(path: Path) -> set[str]:
    """Top-level names of every import in the file, at any depth (lazy imports count too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def floor_violations(root: Path, allowed: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """File -> the project packages it imports that ``allowed`` does not let ``package`` import."""
    offending = {}
    for path in sorted((root / package).rglob("*.py")):
        wrong = (_imported_packages(path) & set(allowed)) - allowed[package] - {package}
        if wrong:
            offending[str(path.relative_to(root))] = sorted(wrong)
    return offending


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_layers_below_it(package):
    assert floor_violations(REPO_ROOT, ALLOWED, package) == {}


def test_the_floor_check_names_an_upward_import(tmp_path):
    """planning importing the tracer, even inside a function: the floor check names the file."""
    (tmp_path / "planning").mkdir()
    (tmp_path / "planning" / "a.py").write_text("def f():\n    from tracing.cli import main\n")
    assert floor_violations(tmp_path, ALLOWED, "planning") == {"planning/a.py": ["tracing"]}


# -- the file-level import graph -------------------------------------------------------------------
# Every import statement counts, at any depth: lazy imports inside functions and those under
# ``if TYPE_CHECKING:`` too (two files that each need the other's names to be read are a circle,
# whether or not the interpreter happens to survive it). An import names the deepest project
# module it reaches: ``import a.b.c`` and ``from a.b import c`` (c a module) name ``a.b.c``;
# ``from a.b import name`` (not a module) names ``a.b``, i.e. ``a/b/__init__.py`` for a package.
# Importing a submodule runs its parent packages' ``__init__`` first; that implicit step is no
# edge (else every file that a package's ``__init__`` re-exports would sit in a circle with it).


def _project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every file of the project's packages."""
    modules = {}
    for package in ALLOWED:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _deepest_module(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _file_imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``module`` (the file ``path``) imports (comment above)."""
    named = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package, level - 1 packages up
                package = module.split(".")[:None if path.name == "__init__.py" else -1]
                base = ".".join(package[:len(package) - node.level + 1] + [base] * bool(base))
            named |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {found for name in named if (found := _deepest_module(name, modules)) not in (None, module)}


def _import_graph() -> dict[str, set[str]]:
    modules = _project_modules()
    return {module: _file_imports(module, path, modules) for module, path in modules.items()}


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, str] = {}  # "open": on the current path, "done": no circle through it
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_circle_finder():
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _a_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_counts_lazy_and_type_checking_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    modules = {name: tmp_path / path for name, path in
               {"pkg": "pkg/__init__.py", "pkg.a": "pkg/a.py", "pkg.b": "pkg/b.py",
                "pkg.c": "pkg/c.py", "pkg.d": "pkg/d.py"}.items()}
    modules["pkg.a"].write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.b import B\n"
        "def lazy():\n    from pkg import c\n    from pkg import some_name\n    from . import d\n")
    assert _file_imports("pkg.a", modules["pkg.a"], modules) == {"pkg", "pkg.b", "pkg.c", "pkg.d"}


def test_no_two_files_import_each_other():
    """The file-level import graph of the project is acyclic (comment above: what counts)."""
    assert _a_cycle(_import_graph()) is None


#: The block of docs/design.md that lists each package's files from the bottom up.
_ORDER_BLOCK = re.compile(r"<!-- file-order -->\n```text\n(.*?)```", re.S)


def _documented_levels() -> dict[str, int]:
    """Module -> its level in docs/design.md's file order: per package, ``<`` between levels,
    files by their name in the package (``__init__`` for the package's own), a line that starts
    with a space going on with the package above."""
    block = _ORDER_BLOCK.search((REPO_ROOT / "docs" / "design.md").read_text())
    assert block, "docs/design.md has no '<!-- file-order -->' text block"
    orders: dict[str, str] = {}
    package = ""
    for line in block.group(1).splitlines():
        if line and not line[0].isspace():
            package, _, line = line.partition(" ")
            assert package in ALLOWED, f"docs/design.md file order: {package!r} is no package"
        orders[package] = orders.get(package, "") + " " + line
    levels = {}
    for package, order in orders.items():
        for level, group in enumerate(order.split("<")):
            for name in group.replace(",", " ").split():
                module = package if name == "__init__" else f"{package}.{name}"
                assert module not in levels, f"docs/design.md file order names {module} twice"
                levels[module] = level
    return levels


def test_design_md_lists_every_file_below_the_files_that_import_it():
    graph = _import_graph()
    levels = _documented_levels()
    assert sorted(set(graph) - set(levels)) == [], "files missing from docs/design.md's file order"
    assert sorted(set(levels) - set(graph)) == [], "docs/design.md's file order names no such file"
    assert upward_imports(graph, levels) == []


def upward_imports(graph: dict[str, set[str]], levels: dict[str, int]) -> list[str]:
    """Each import of a file of the same package on the same or a higher documented level."""
    return sorted(f"{module} (level {levels[module]}) imports {imported} (level {levels[imported]})"
                  for module, imports in graph.items() for imported in imports
                  if imported.split(".")[0] == module.split(".")[0]
                  and levels[imported] >= levels[module])


def test_the_file_order_check_names_an_import_of_a_file_on_its_level_or_above():
    graph = {"pkg.low": set(), "pkg.high": {"pkg.low"}, "pkg.peer": {"pkg.high"}}
    assert upward_imports(graph, {"pkg.low": 0, "pkg.high": 1, "pkg.peer": 2}) == []
    assert upward_imports(graph, {"pkg.low": 0, "pkg.high": 1, "pkg.peer": 1}) == [
        "pkg.peer (level 1) imports pkg.high (level 1)"]


#: The analyzer's front ends: the commands and their text, and the package's API (its
#: ``__init__``: ``analyze_dump`` among its names), on top of both of its layers.
ANALYZER_FRONT_ENDS = frozenset({"hlo_analyzer", "hlo_analyzer.cli", "hlo_analyzer.pipeline_cli",
                                 "hlo_analyzer.table"})


def _measurement_uses_of_the_mapping(graph: dict[str, set[str]]) -> list[str]:
    """Imports of ``hlo_analyzer.mapping`` by the analyzer's measurement layer (docs/design.md,
    "hlo_analyzer": every file of the analyzer but the mapping and the front ends)."""
    def mapping(module: str) -> bool:
        return module == "hlo_analyzer.mapping" or module.startswith("hlo_analyzer.mapping.")

    return sorted(f"{module} imports {imported}" for module, imports in graph.items()
                  if module.split(".")[0] == "hlo_analyzer" and not mapping(module)
                  and module not in ANALYZER_FRONT_ENDS
                  for imported in imports if mapping(imported))


def test_the_measurement_layer_never_imports_the_mapping_layer():
    graph = _import_graph()
    assert any(module.startswith("hlo_analyzer.mapping.") for module in graph)
    assert _measurement_uses_of_the_mapping(graph) == []
    # the check sees such an import: the Report reaching up for the --hw sections' renderer
    graph["hlo_analyzer.report"] = graph["hlo_analyzer.report"] | {"hlo_analyzer.mapping.render"}
    assert _measurement_uses_of_the_mapping(graph) == [
        "hlo_analyzer.report imports hlo_analyzer.mapping.render"]


def _import_with_blocked(modules: list[str], blocked: list[str]) -> subprocess.CompletedProcess:
    """Import ``modules`` in a fresh interpreter where importing any of ``blocked`` fails."""
    code = "\n".join([
        "import sys",
        *[f"sys.modules[{name!r}] = None" for name in blocked],  # None: import raises
        *[f"import {name}" for name in modules],
    ])
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True)


def test_hardware_imports_without_jax_jaxlib_or_torch():
    completed = _import_with_blocked(
        ["hardware", "hardware.spec", "hardware.collectives"],
        ["jax", "jaxlib", "torch", "torch_xla", "hlo_analyzer"])
    assert completed.returncode == 0, completed.stderr


def test_the_torch_free_model_modules_import_without_torch_or_the_analyzer():
    completed = _import_with_blocked(
        ["models.opensora.config", "models.opensora.inputs", "models.opensora.flops",
         "models.opensora.parallel", "models.opensora.theory", "models.opensora.block_ops",
         "models.cuda_runtime"],
        ["torch", "torch_xla", "jax", "jaxlib", "hlo_analyzer"])
    assert completed.returncode == 0, completed.stderr


def test_the_plan_vocabulary_imports_without_torch_or_the_analyzer():
    completed = _import_with_blocked(
        ["plans", "plans.config", "plans.cases", "plans.module_plan", "plans.calibration",
         "plans.feasibility", "plans.patches", "plans.train_options"],
        ["torch", "torch_xla", "jax", "jaxlib", "hlo_analyzer", "tracing"])
    assert completed.returncode == 0, completed.stderr


def test_the_blocking_is_real():
    # (the package itself imports its API lazily: the module that needs jaxlib)
    completed = _import_with_blocked(["hlo_analyzer.mlir"], ["jaxlib"])
    assert completed.returncode != 0 and "jaxlib" in completed.stderr


# -- the imports themselves ------------------------------------------------------------------------
# Four rules on top of the floors: (1) no file imports a private name (``_x``) of another
# package; (2) an import inside a function reaches into another package only across the
# documented native boundary: the imported module loads torch, torch-xla, jax or jaxlib when
# imported (a command imports in milliseconds and loads those inside the command, where an
# interrupt is one line: docs/design.md); any other import sits at the top of the file, where the
# reader sees it; (3) no module starts a process (``python -m MODULE``) whose module imports the
# starter back, directly or through others: a circle through a process is still a circle. (A
# command that runs itself again in a fresh process starts no circle.) (4) planning reaches the
# tracer through one protocol only: no file of planning imports tracing, and only the protocol's
# file starts one of its modules as a process.

#: The native libraries behind the one boundary where imports may wait inside functions.
NATIVE_LIBRARIES = frozenset({"torch", "torch_xla", "jax", "jaxlib"})


def _modules_under(root: Path, packages) -> dict[str, Path]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports_at_top(path: Path) -> set[str]:
    """Names imported when the file is imported: statements outside functions and classes'
    methods, and outside ``if TYPE_CHECKING:``."""
    names: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, (ast.Try, ast.With, ast.ClassDef)):
                walk(node.body)
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(ast.parse(path.read_text()).body)
    return names


def _loads_native(module: str, modules: dict[str, Path], seen: set[str] | None = None) -> bool:
    """Whether importing ``module`` imports a native library (through the files it imports at
    their top, or its package's ``__init__``)."""
    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    parent = module.rpartition(".")[0]
    if parent in modules and _loads_native(parent, modules, seen):
        return True
    for name in _imports_at_top(modules[module]):
        if name.split(".")[0] in NATIVE_LIBRARIES:
            return True
        found = _deepest_module(name, modules)
        if found is not None and found != module and _loads_native(found, modules, seen):
            return True
    return False


def _import_nodes(path: Path):
    """(node, inside a function) for every absolute import statement of the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lazy = {id(node) for function in ast.walk(tree)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.module
                                            and not node.level):
            yield node, id(node) in lazy


def private_imports(root: Path, packages) -> list[str]:
    """``file imports pkg._name`` for each private name a file takes from another package."""
    found = []
    for module, path in _modules_under(root, packages).items():
        package = module.split(".")[0]
        for node, _ in _import_nodes(path):
            if isinstance(node, ast.ImportFrom):
                named = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                named = [alias.name for alias in node.names]
            for name in named:
                if name.split(".")[0] in packages and name.split(".")[0] != package and \
                        any(part.startswith("_") and not part.startswith("__") for part in name.split(".")):
                    found.append(f"{module} imports {name}")
    return sorted(found)


def lazy_imports_across_packages(root: Path, packages) -> list[str]:
    """``file imports module inside a function`` for each such import of another package's
    module that loads no native library (rule 2 above)."""
    modules = _modules_under(root, packages)
    found = []
    for module, path in modules.items():
        for node, lazy in _import_nodes(path):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                target = _deepest_module(name, modules)
                if lazy and target is not None and target.split(".")[0] != module.split(".")[0] \
                        and not _loads_native(target, modules):
                    found.append(f"{module} imports {target} inside a function")
    return sorted(set(found))


def _started_modules(path: Path) -> set[str]:
    """Modules the file starts as processes: ``"-m", "pkg.mod"`` in a list or tuple."""
    started = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple)):
            values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            started |= {values[i + 1] for i in range(len(values) - 1)
                        if values[i] == "-m" and isinstance(values[i + 1], str)}
    return started


def processes_importing_their_caller(root: Path, packages) -> list[str]:
    """``starter starts child, which imports starter`` (rule 3 above)."""
    modules = _modules_under(root, packages)
    graph = {module: _file_imports(module, path, modules) for module, path in modules.items()}
    found = []
    for starter, path in modules.items():
        for child in sorted(_started_modules(path) & set(modules) - {starter}):
            reached, todo = set(), [child]
            while todo:
                module = todo.pop()
                if module not in reached:
                    reached.add(module)
                    todo.extend(graph[module])
            if starter in reached:
                found.append(f"{starter} starts {child}, which imports {starter}")
    return found


#: (caller, tracer, the caller's one module that starts the tracer) of rule 4.
TRACER_PROTOCOL = ("planning", "tracing", "planning.trace_process")


def tracer_reached_outside_the_protocol(root: Path, packages, caller: str, tracer: str,
                                        protocol: str) -> list[str]:
    """``file imports tracer.x`` for each import of the tracer by a file of ``caller``, and
    ``file starts tracer.x`` for each process of it started elsewhere than ``protocol`` (rule 4)."""
    found = []
    for module, path in _modules_under(root, packages).items():
        if module.split(".")[0] != caller:
            continue
        for node, _ in _import_nodes(path):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [f"{module} imports {name}" for name in names if name.split(".")[0] == tracer]
        if module != protocol:
            found += [f"{module} starts {child}" for child in sorted(_started_modules(path))
                      if child.split(".")[0] == tracer]
    return sorted(found)


def test_no_private_name_is_imported_across_packages():
    assert private_imports(REPO_ROOT, ALLOWED) == []


def test_imports_inside_functions_cross_packages_only_at_the_native_boundary():
    assert lazy_imports_across_packages(REPO_ROOT, ALLOWED) == []


def test_no_process_imports_the_module_that_starts_it():
    assert processes_importing_their_caller(REPO_ROOT, ALLOWED) == []


def test_planning_reaches_the_tracer_only_through_its_protocol():
    assert tracer_reached_outside_the_protocol(REPO_ROOT, ALLOWED, *TRACER_PROTOCOL) == []
    caller, tracer, protocol = TRACER_PROTOCOL
    started = (REPO_ROOT / protocol.replace(".", "/")).with_suffix(".py")
    assert {m.split(".")[0] for m in _started_modules(started)} == {tracer}  # the check sees them


def _fake_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_each_rule_fails_on_an_injected_violation(tmp_path):
    """A fake tree of three packages, clean, then with one violation of each rule: each check
    names it. ``high`` reaches the tracer ``engine`` through ``high.protocol`` only."""
    clean = {"low/__init__.py": "", "low/native.py": "import torch\n", "low/plain.py": "X = 1\n",
             "high/__init__.py": "",
             "high/a.py": "from low.plain import X\n\ndef f():\n    from low.native import torch\n",
             "high/protocol.py": "import sys\n\ndef start():\n    return [sys.executable, '-m', 'engine.run']\n",
             "engine/__init__.py": "", "engine/run.py": "from low.plain import X\n"}
    _fake_tree(tmp_path, clean)
    packages = ("low", "high", "engine")
    protocol = ("high", "engine", "high.protocol")
    assert private_imports(tmp_path, packages) == []
    assert lazy_imports_across_packages(tmp_path, packages) == []
    assert processes_importing_their_caller(tmp_path, packages) == []
    assert tracer_reached_outside_the_protocol(tmp_path, packages, *protocol) == []
    _fake_tree(tmp_path, {
        "high/b.py": "from low.plain import _secret\n",
        "high/c.py": "def g():\n    from low.plain import X\n",
        "low/starter.py": "import subprocess, sys\n\n"
                          "def run():\n    subprocess.run([sys.executable, '-m', 'high.child'])\n",
        "high/child.py": "from low.starter import run\n"})
    assert private_imports(tmp_path, packages) == ["high.b imports low.plain._secret"]
    assert lazy_imports_across_packages(tmp_path, packages) == ["high.c imports low.plain inside a function"]
    assert processes_importing_their_caller(tmp_path, packages) == [
        "low.starter starts high.child, which imports low.starter"]
    assert tracer_reached_outside_the_protocol(tmp_path, packages, *protocol) == []
    _fake_tree(tmp_path, {"high/d.py": "def h():\n    from engine.run import X\n",
                          "high/e.py": "import sys\nCOMMAND = (sys.executable, '-m', 'engine.run')\n"})
    assert tracer_reached_outside_the_protocol(tmp_path, packages, *protocol) == [
        "high.d imports engine.run", "high.e starts engine.run"]
