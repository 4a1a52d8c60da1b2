"""The package's layers: no import cycles (imports inside functions included), no reaching into
another module's private names, and the layer order of docs/architecture.md."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "attnconv"

# Lower layers never import higher ones (docs/architecture.md, "Layers"). A module not listed
# belongs to the layer of its package (attnconv.data.idx -> attnconv.data).
LAYERS = [
    ["attnconv.errors", "attnconv.pathwords", "attnconv.fileio", "attnconv.tables", "attnconv.limits", "attnconv.options",
     "attnconv.streams"],
    ["attnconv.precision", "attnconv.flops", "attnconv.modes"],
    ["attnconv.ops"],
    ["attnconv.positional"],
    ["attnconv.attention"],
    ["attnconv.construct"],
    ["attnconv.models", "attnconv.data"],
    ["attnconv.config"],
    ["attnconv.dataset_presets", "attnconv.runs"],
    ["attnconv.evaluate", "attnconv.training", "attnconv.analysis", "attnconv.bench", "attnconv.export"],
    ["attnconv.plots"],
    ["attnconv.report", "attnconv.explorer", "attnconv.learnconv"],
    ["attnconv.cli", "attnconv.__main__"],
]


def modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Edges module -> modules it imports (anywhere in its body), and private-name imports."""

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for m, f in mods.items():
        if m == "attnconv":  # the package face only re-exports
            continue
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if not source.startswith("attnconv"):
                    continue
                for alias in node.names:
                    target = owner(f"{source}.{alias.name}") if f"{source}.{alias.name}" in mods else owner(source)
                    if target and target != m:
                        edges[m].add(target)
                        if alias.name.startswith("_") and not alias.name.startswith("__") and target == owner(source):
                            private.append(f"{m} imports {source}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = owner(alias.name) if alias.name.startswith("attnconv") else None
                    if target and target != m:
                        edges[m].add(target)
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return found


def layer_of(module: str) -> int | None:
    for level, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                return level
    return None


def test_no_import_cycles():
    edges, _ = imports(modules())
    assert cycles(edges) == []


def test_no_private_names_across_modules():
    assert imports(modules())[1] == []


def test_every_module_has_a_layer_and_imports_only_lower_or_its_own():
    mods = modules()
    edges, _ = imports(mods)
    unplaced = sorted(m for m in mods if m != "attnconv" and layer_of(m) is None)
    assert unplaced == [], "add these modules to LAYERS and to docs/architecture.md"
    upward = [f"{m} -> {t}" for m, targets in edges.items() for t in targets
              if m != "attnconv" and layer_of(t) is not None and layer_of(t) > layer_of(m)]
    assert upward == []


def test_the_checker_finds_cycles_and_private_imports(tmp_path, monkeypatch):
    """The checks above can fail: a package with a lazy-import cycle and a private import."""
    pkg = tmp_path / "attnconv"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from attnconv.b import g\n")
    (pkg / "b.py").write_text("from attnconv.sub import _hidden\nimport attnconv.a\n")
    (pkg / "sub" / "__init__.py").write_text("_hidden = 1\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    edges, private = imports(modules())
    assert cycles(edges) == [["attnconv.a", "attnconv.b"]]
    assert private == ["attnconv.b imports attnconv.sub._hidden"]


@pytest.mark.parametrize("module", ["attnconv.training.loop", "attnconv.data.idx", "attnconv.construct.learnable"])
def test_submodules_take_their_packages_layer(module):
    assert layer_of(module) == layer_of(module.rpartition(".")[0])
