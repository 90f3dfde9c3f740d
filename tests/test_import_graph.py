"""Architecture checks: no import cycle inside hf_mlcl (between modules or between folders), library code never imports the CLI or the demo,
every module opens with a docstring naming what it holds, and the formatter owns the layout."""

from __future__ import annotations

import ast
import os

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hf_mlcl")
PRODUCT_SURFACE = {
    "hf_mlcl.cli",
    "hf_mlcl.cli_parser",
    "hf_mlcl.cli_report",
    "hf_mlcl.demo",
    "hf_mlcl.__main__",
}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(PKG))[: -len(".py")].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules() -> dict[str, str]:
    out = {}
    for folder, _dirs, files in os.walk(PKG):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                out[_module_name(path)] = path
    return out


MODULES = _modules()


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_pkg else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> set[str]:
    """hf_mlcl modules imported anywhere in ``module`` (top level or inside functions)."""
    path = MODULES[module]
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.endswith("__init__.py"), node)
            # `from pkg import submodule` imports the submodule; `from pkg import name` runs pkg
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import a.b.c` / `from a import b` -> the module it names
                name = name.rpartition(".")[0]
            if name.startswith("hf_mlcl") and name != module:
                found.add(name)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def _is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def _expand(target: str, seen: set[str] | None = None) -> set[str]:
    """Importing a package runs its ``__init__``: an edge to a package stands for the modules it imports."""
    if not _is_package(target):
        return {target}
    seen = set() if seen is None else seen
    if target in seen:
        return set()
    seen.add(target)
    out: set[str] = set()
    for t in GRAPH[target]:
        out |= _expand(t, seen)
    return out


def _module_edges() -> dict[str, set[str]]:
    """Module -> the (non-package) modules its imports run, package re-exports followed through."""
    edges = {}
    for mod in MODULES:
        if _is_package(mod):
            continue
        out: set[str] = set()
        for t in GRAPH[mod]:
            out |= _expand(t)
        edges[mod] = out - {mod}
    return edges


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_walker_sees_the_package():
    assert {"hf_mlcl.cli", "hf_mlcl.training.stages", "hf_mlcl.losses.core"} <= set(MODULES)
    assert "hf_mlcl.training.stages" in GRAPH["hf_mlcl.cli"]
    assert "hf_mlcl.losses.registry" in GRAPH["hf_mlcl.losses.all_"]  # relative imports resolve


def test_the_cycle_finder_finds_a_planted_cycle():
    planted = _module_edges()
    planted["hf_mlcl.losses.registry"].add("hf_mlcl.cli")
    assert _find_cycle(planted) is not None


def test_no_import_cycle_between_modules():
    """Every import counts, module-level or inside a function (a lazy import only hides a cycle)."""
    cycle = _find_cycle(_module_edges())
    assert cycle is None, " -> ".join(cycle)


def _room(module: str) -> str:
    """The room of a module: its sub-package of hf_mlcl (``hf_mlcl.training``), or the module itself."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_folders():
    """The folders and top-level modules form layers: no two of them import each other, even through a lazy
    import (an arrow that runs back up the layers)."""
    rooms: dict[str, set[str]] = {}
    for mod, targets in _module_edges().items():
        rooms.setdefault(_room(mod), set()).update(_room(t) for t in targets if _room(t) != _room(mod))
    cycle = _find_cycle(rooms)
    assert cycle is None, " -> ".join(cycle)


def test_library_code_never_imports_the_cli_or_the_demo():
    offenders = {
        m: sorted(GRAPH[m] & PRODUCT_SURFACE)
        for m in MODULES
        if m not in PRODUCT_SURFACE and GRAPH[m] & PRODUCT_SURFACE
    }
    assert not offenders, offenders


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_opens_with_a_docstring_naming_its_concept(module):
    path = MODULES[module]
    doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read(), path))
    assert doc and len(doc.split("\n", 1)[0].strip()) >= 10, (
        f"{path}: first line of the docstring should name its concept"
    )
    lines = len(
        ast.get_docstring(ast.parse(open(path, encoding="utf-8").read(), path), clean=False).splitlines()
    )
    assert lines <= 15, f"{path}: a {lines}-line module docstring; design prose belongs in docs/design.md"


def test_the_formatter_owns_the_layout():
    """`ruff format --check` passes on every Python folder of the repository, and no line opts out of it."""
    import subprocess
    import sys

    root = os.path.dirname(PKG)
    folders = ["hf_mlcl", "tests", "benchmarks", "studies", "examples"]
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    proc = subprocess.run([ruff, "format", "--check", *folders], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    marker = "fmt: " + "skip"
    skipped = [
        os.path.relpath(os.path.join(d, f), root)
        for folder in folders
        for d, _, fs in os.walk(os.path.join(root, folder))
        for f in fs
        if f.endswith(".py") and marker in open(os.path.join(d, f), encoding="utf-8").read()
    ]
    assert not skipped, skipped


def test_every_design_reference_names_a_section_of_design_md():
    """A module's `Design: docs/design.md, "<heading>"` points at a heading that docs/design.md has."""
    import re

    design = open(os.path.join(os.path.dirname(PKG), "docs", "design.md"), encoding="utf-8").read()
    headings = {" ".join(h.split()) for h in re.findall(r"^#{2,4} (.+)$", design, flags=re.M)}
    cited = {
        (os.path.relpath(path, os.path.dirname(PKG)), " ".join(name.split()))
        for path in MODULES.values()
        for name in re.findall(r'docs/design\.md,\s+"([^"]+)"', open(path, encoding="utf-8").read())
    }
    assert len(cited) >= 30  # the references this test reads: a changed citation form would leave it empty
    missing = sorted((path, name) for path, name in cited if name not in headings)
    assert not missing, missing


def test_the_package_layout_in_usage_md_names_every_module():
    """docs/usage.md's "The package layout" has a row per package, and each row names every module of it."""
    import re

    usage = open(os.path.join(os.path.dirname(PKG), "docs", "usage.md"), encoding="utf-8").read()
    table = usage.split("## The package layout", 1)[1].split("\n\n| package | modules |", 1)[-1]
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `hf_mlcl/([\w/]*)` [^|]*\| (.+) \|$", table, re.M)
    }
    missing = []
    for name in MODULES:
        parts = name.split(".")
        if parts[-1] == "__init__" or name == "hf_mlcl" or os.path.basename(MODULES[name]) == "__init__.py":
            continue
        package = parts[1] + "/" if len(parts) > 2 else ""  # a sub-package counts under its top package
        if f"`{parts[-1] if len(parts) <= 3 else parts[2]}`" not in rows.get(package, ""):
            missing.append(name)
    assert len(rows) >= 10, sorted(rows)  # the rows this test reads
    assert not missing, missing
