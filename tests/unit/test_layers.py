"""The layer rule of docs/architecture.md, read from the source with ``ast``.

A module may import facefuse modules of its own layer or of a layer below it, never above;
every ``facefuse.*`` import must name a module that exists (a stale path after a move fails
here, not in a server log).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# top-level folders installed as facefuse sub-packages (pyproject.toml [tool.setuptools])
SOURCES = {"facefuse": ROOT / "facefuse", "export": ROOT / "export", "client": ROOT / "client"}

# bottom to top; the first element of a facefuse module path after "facefuse." names its package
LAYERS = (
    ("core", {"core", "__init__"}),
    ("runtime", {"runtime"}),
    ("domain", {"prompt", "face", "cache", "models"}),
    ("pipeline", {"diffusion", "quality"}),
    ("adapters", {"serving", "client", "export", "bench", "train", "gpu", "cli"}),
)
RANK = {package: rank for rank, (_, packages) in enumerate(LAYERS) for package in packages}


def source_files() -> list[tuple[str, Path]]:
    """(package, file) for every module of the library."""
    files = []
    for name, root in SOURCES.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            package = name if name != "facefuse" else rel.parts[0].removesuffix(".py")
            files.append((package, path))
    return files


def facefuse_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every facefuse import, top-level and function-local alike."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "facefuse":
                found += [(node.lineno, f"facefuse.{alias.name}") for alias in node.names]
            elif node.module.startswith("facefuse."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("facefuse.")]
    return found


def module_exists(module: str) -> bool:
    parts = module.split(".")[1:]
    root = SOURCES.get(parts[0]) if parts and parts[0] in ("export", "client") else None
    base = root if root is not None else SOURCES["facefuse"] / parts[0]
    rest = parts[1:]
    target = base.joinpath(*rest) if rest else base
    return target.with_suffix(".py").exists() or (target / "__init__.py").exists()


def test_every_package_has_a_layer():
    unknown = {package for package, _ in source_files()} - set(RANK)
    assert not unknown, f"add {sorted(unknown)} to a layer here and in docs/architecture.md"


@pytest.mark.parametrize(
    "package,path",
    [pytest.param(pkg, path, id=str(path.relative_to(ROOT))) for pkg, path in source_files()],
)
def test_imports_point_down(package, path):
    wrong = []
    for line, module in facefuse_imports(path):
        if not module_exists(module):
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} does not exist")
            continue
        target = module.split(".")[1]
        if RANK.get(target, -1) > RANK[package]:
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {package} imports {module} (above)")
    assert not wrong, "\n".join(wrong)


def test_stubs_import_facefuse_modules_that_exist():
    """The Triton ``model.py`` stubs are adapters: any layer, but real modules only."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sorted((ROOT / "model_repository").glob("*/1/model.py"))
        for line, module in facefuse_imports(path)
        if not module_exists(module)
    ]
    assert not wrong, "\n".join(wrong)
