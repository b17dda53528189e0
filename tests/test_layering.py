"""The folder tree is the pipeline: imports flow one way, load -> extract -> spectra -> bounds ->
records -> reports, with the command line on top.  Every import in every module (including those
inside functions, which are how heavy or later parts are loaded lazily) is read from the source and
checked against the stage order; one that flows upward, or a cycle between modules, fails here."""

import ast
from pathlib import Path

import specbound

ROOT = Path(specbound.__file__).resolve().parent

# Stage of every module or package (first matching prefix wins); an import may only name a module
# of the same or an earlier stage.  Within a stage, modules may import each other without a cycle.
STAGES = [
    ("errors", 0),
    ("atomic", 0),
    ("options", 0),
    ("io", 1),
    ("archs", 2),
    ("compute", 3),
    ("bounds", 4),
    ("records", 5),
    ("pipeline", 6),
    ("sweep", 7),
    ("report", 8),
    ("integrations", 8),
    ("study", 9),
    ("tools", 10),
    ("cli", 11),
]


def stage_of(module: str) -> int:
    """Stage of ``specbound.<module>`` (the package itself, ``specbound/__init__``, is the public
    face: it may import anything, lazily)."""
    for prefix, stage in STAGES:
        if module == prefix or module.startswith(prefix + "."):
            return stage
    raise AssertionError(f"module specbound.{module} belongs to no stage: add it to STAGES in {__file__}")


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        yield ".".join(parts), path, is_package


def imported(module: str, path: Path, is_package: bool) -> list[tuple[str, int]]:
    """``(imported specbound module, line)`` for every import statement in the file."""
    tree = ast.parse(path.read_text(), str(path))
    here = module.split(".") if module else []
    if not is_package:
        here = here[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and (node.module == "specbound" or node.module.startswith("specbound.")):
                target = node.module[len("specbound.") :] if node.module != "specbound" else ""
            else:
                continue
            # `from pkg import name` names a submodule when there is one, else an object of pkg
            for alias in node.names:
                candidate = f"{target}.{alias.name}" if target else alias.name
                out.append((candidate if _is_module(candidate) else target, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("specbound."):
                    out.append((alias.name[len("specbound.") :], node.lineno))
    return out


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_every_import_flows_down_the_pipeline():
    upward = []
    for module, path, is_package in modules():
        if module == "":  # specbound/__init__.py: the public API, lazily
            continue
        stage = stage_of(module)
        for target, line in imported(module, path, is_package):
            if target == "":  # `from specbound import __version__` and the like
                continue
            if stage_of(target) > stage:
                upward.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: {module} (stage {stage}) imports "
                    f"{target} (stage {stage_of(target)})"
                )
    assert not upward, "imports flowing upward:\n" + "\n".join(upward)


def test_every_import_names_a_module():
    """A relative import one level off (``from .archs import`` inside ``bounds/``) names no module:
    caught here, before it fails at run time."""
    missing = [
        f"{path.relative_to(ROOT.parent)}:{line}: {module} imports specbound.{target}"
        for module, path, is_package in modules()
        for target, line in imported(module, path, is_package)
        if target and not _is_module(target)
    ]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_no_import_cycles_between_modules():
    graph = {}
    for module, path, is_package in modules():
        graph[module] = {
            t for t, _ in imported(module, path, is_package) if t and t in dict.fromkeys(m for m, _, _ in modules())
        }
    # A package's __init__ re-exporting its modules is not a cycle with them: drop package -> own submodule edges.
    for module in graph:
        graph[module] = {t for t in graph[module] if not t.startswith(module + ".") or module == ""}
    graph.pop("", None)
    seen, stack, cycles = {}, [], []

    def visit(node):
        seen[node] = "active"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in graph:
                if seen.get(nxt) == "active":
                    cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
                elif nxt not in seen:
                    visit(nxt)
        stack.pop()
        seen[node] = "done"

    for node in sorted(graph):
        if node not in seen:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_package_root_holds_only_the_frame():
    """Every stage is a package; the root keeps the pieces every stage shares and the two entry points."""
    root = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert root == ["atomic", "cli", "errors", "options", "pipeline"]


def test_the_checker_sees_imports_inside_functions(tmp_path):
    """The reader must catch a lazy import: a function-level `from ..cli import main` in compute/."""
    fake = tmp_path / "compute" / "x.py"
    fake.parent.mkdir()
    fake.write_text("def f():\n    from ..cli import main\n    return main\n")
    targets = [t for t, _ in imported("compute.x", fake, False)]
    assert targets == ["cli"]
    assert stage_of("cli") > stage_of("compute.x")


def test_compute_reads_no_config():
    """The compute stage takes plain data from the architecture stage (``archs.model``: dimensions,
    rotary layout, layer weights); reading config.json or a family spec is the architecture stage's."""
    readers = []
    for module, path, is_package in modules():
        if module.startswith("compute"):
            readers += [
                f"{path.relative_to(ROOT.parent)}:{line}: {module} imports {target}"
                for target, line in imported(module, path, is_package)
                if target.startswith("archs") and target != "archs.model"
            ]
    assert not readers, "compute imports a module that reads configs:\n" + "\n".join(readers)
