"""The import graph of labs/, quiz/ and config/, read from the source: one-way dependencies.

Every `import` counts, at module level, inside a function or under `if TYPE_CHECKING` alike:
each is a dependency a reader has to follow. The rules:

- no cycles;
- labs never imports quiz;
- quiz reaches labs only through `labs.api`;
- outside labs/backends/, nothing imports a backend's own modules (`labs.backends.vllm.*`,
  `labs.backends.sim`): the registry in `labs.backends` (and its shared types in
  `labs.backends.base`) is the way in.

The graph is read from the source with `ast` (nothing is run); one test then imports every
module, which catches what the source cannot show (a name a cycle leaves undefined at import).
No database is touched.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("labs", "quiz", "config")
LABS_PUBLIC = "labs.api"
BACKENDS = "labs.backends"
BACKENDS_SHARED = {BACKENDS, f"{BACKENDS}.base"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


MODULES = _modules()


def _known(name: str) -> str | None:
    """The module `name` is, or the closest package of ours it lies in; None if not ours."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    """The modules of ours that `module` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            # `from labs import ratios` imports the module labs.explanation.ratios; `from labs.x
            # import y` the module labs.x.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in map(_known, targets) if t is not None and t != module)
    return found


def import_graph() -> dict[str, set[str]]:
    return {module: _imports(module, path) for module, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    arrows = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return " <-> ".join(component) + "\n" + "\n".join(arrows)


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_every_module_is_read():
    graph = import_graph()
    assert {"labs.runs.submission", "quiz.personal", "config.settings", LABS_PUBLIC} <= set(graph)


def test_every_module_imports():
    # The WSGI entry point checks the database and broker as it is imported.
    for module in sorted(set(MODULES) - {"config.wsgi"}):
        importlib.import_module(module)


def test_no_import_cycles():
    graph = import_graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, graph) for c in cycles)


def test_labs_never_imports_quiz():
    bad = [
        f"{module} -> {target}"
        for module, targets in sorted(import_graph().items())
        if _is_under(module, "labs")
        for target in sorted(targets)
        if _is_under(target, "quiz")
    ]
    assert not bad, "labs imports quiz:\n" + "\n".join(bad)


def test_quiz_reaches_labs_only_through_its_public_module():
    bad = [
        f"{module} -> {target}"
        for module, targets in sorted(import_graph().items())
        if _is_under(module, "quiz")
        for target in sorted(targets)
        if _is_under(target, "labs") and target != LABS_PUBLIC
    ]
    assert not bad, f"quiz imports labs other than {LABS_PUBLIC}:\n" + "\n".join(bad)


def test_backends_are_reached_through_the_registry():
    bad = [
        f"{module} -> {target}"
        for module, targets in sorted(import_graph().items())
        if not _is_under(module, BACKENDS)
        for target in sorted(targets)
        if _is_under(target, BACKENDS) and target not in BACKENDS_SHARED
    ]
    assert not bad, "imports of a backend's own modules:\n" + "\n".join(bad)


# Django's and the command line's own packages of labs sit at its top, beside models and views: no
# rule of their own. Every other package says in its docstring what it may import.
GLUE_PACKAGES = {"labs.migrations", "labs.management", "labs.templatetags", "labs.cli"}


def package_rules() -> dict[str, list[str]]:
    """Each package of labs and what its docstring's "May import:" paragraph allows."""
    rules: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py" or module.count(".") != 1 or not _is_under(module, "labs"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "May import:" in doc:
            paragraph = doc.partition("May import:")[2].split("\n\n")[0]
            rules[module] = re.findall(r"`(labs(?:\.\w+)*)`", paragraph)
    return rules


def forbidden_imports(graph: dict[str, set[str]], rules: dict[str, list[str]]) -> list[str]:
    """Imports from a package of labs to a part of labs its rules do not name."""
    return [
        f"{module} -> {target} ({package} may import: {', '.join(allowed) or 'nothing'})"
        for package, allowed in sorted(rules.items())
        for module, targets in sorted(graph.items())
        if _is_under(module, package)
        for target in sorted(targets)
        if _is_under(target, "labs")
        and target != "labs"
        and not _is_under(target, package)
        and not any(_is_under(target, a) for a in allowed)
    ]


def test_every_package_of_labs_says_what_it_may_import():
    packages = {
        m
        for m, path in MODULES.items()
        if path.name == "__init__.py" and m.count(".") == 1 and _is_under(m, "labs")
    }
    missing = sorted(packages - GLUE_PACKAGES - set(package_rules()))
    assert not missing, "packages without a 'May import:' paragraph: " + ", ".join(missing)


def test_each_package_imports_only_what_its_docstring_allows():
    bad = forbidden_imports(import_graph(), package_rules())
    assert not bad, "imports a package's docstring does not allow:\n" + "\n".join(bad)


LONG_MODULE_LINES = 600


def test_a_long_module_of_labs_says_why_it_is_one():
    long = [
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for module, path in sorted(MODULES.items())
        if _is_under(module, "labs")
        and ".migrations." not in f".{module}."
        and (lines := len(path.read_text().splitlines())) > LONG_MODULE_LINES
        and "Why one module:" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert not long, (
        f"modules over {LONG_MODULE_LINES} lines without a 'Why one module:' paragraph in their "
        "docstring (split them, or say why not):\n" + "\n".join(long)
    )


def test_a_forbidden_import_is_reported():
    graph = {"labs.parameters.params": {"labs.runs.turns", "labs.parameters.catalog"}}
    assert forbidden_imports(graph, {"labs.parameters": []}) == [
        "labs.parameters.params -> labs.runs.turns (labs.parameters may import: nothing)"
    ]
    assert package_rules()["labs.parameters"] == []
