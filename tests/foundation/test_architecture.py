"""Imports show the architecture (docs/architecture.md, Import direction): the core is pure Python over records."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "supervisor"
FORBIDDEN_IN_CORE = {"ray", "torch", "boto3", "botocore", "numpy", "matplotlib"}
CORE_MAY_IMPORT = ("supervisor.core", "supervisor.errors", "supervisor.config", "supervisor.logging")


def _imports(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
    return mods


def _pure_files() -> list[Path]:
    files = list((PKG / "core").rglob("*.py"))
    if (PKG / "traces").exists():
        files += list((PKG / "traces").rglob("*.py"))
    return files


def test_core_imports_no_runtime_library() -> None:
    files = _pure_files()
    assert files
    for f in files:
        bad = {m for m in _imports(f) if m.split(".")[0] in FORBIDDEN_IN_CORE}
        assert not bad, f"{f.relative_to(PKG.parent)} imports {sorted(bad)}"


def test_core_imports_only_core_and_shared_types() -> None:
    for f in (PKG / "core").rglob("*.py"):
        inner = {m for m in _imports(f) if m.startswith("supervisor")}
        stray = {m for m in inner if not m.startswith(CORE_MAY_IMPORT)}
        assert not stray, f"{f.relative_to(PKG.parent)} imports {sorted(stray)}"


def test_stage_packages_do_not_import_the_runtime() -> None:
    """Only the orchestration layer (runtime, cli, drills) may import the runtime."""
    for stage in ("core", "traces", "checkpoint", "storage", "incidents", "sdk", "ranks"):
        for f in (PKG / stage).rglob("*.py") if (PKG / stage).exists() else []:
            bad = {
                m
                for m in _imports(f)
                if m.startswith(("supervisor.runtime", "supervisor.cli", "supervisor.drills"))
            }
            assert not bad, f"{f.relative_to(PKG.parent)} imports {sorted(bad)}"


def test_the_runtime_does_not_import_what_launches_it() -> None:
    """The loop runs inside the supervisor actor; the launching process's side (client, cli, drills)
    stays out of it."""
    for f in (PKG / "runtime").rglob("*.py"):
        bad = {
            m
            for m in _imports(f)
            if m.startswith(("supervisor.client", "supervisor.cli", "supervisor.drills"))
        }
        assert not bad, f"{f.relative_to(PKG.parent)} imports {sorted(bad)}"


def test_the_supervisor_process_does_not_import_torch() -> None:
    # The supervisor actor reads the SDK's directives and never trains: importing it must not pull
    # in torch (~3 CPU-s per job), which `supervisor.sdk` loads only when a torch-using name is used.
    import subprocess
    import sys

    code = (
        "import sys, supervisor.runtime.actor, supervisor.client.api, supervisor.sdk.directives\n"
        "from supervisor import sdk\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert sdk.SupervisedLoader.__name__ == 'SupervisedLoader' and 'torch' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _package_graph() -> dict[str, set[str]]:
    """Which of the package's folders each folder imports (module level and inside functions)."""
    graph: dict[str, set[str]] = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG).parts
        if len(parts) < 2:
            continue
        for mod in _imports(f):
            names = mod.split(".")
            if (
                names[0] == "supervisor"
                and len(names) > 1
                and (PKG / names[1]).is_dir()
                and names[1] != parts[0]
            ):
                graph.setdefault(parts[0], set()).add(names[1])
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_folder_level_import_cycle() -> None:
    # A cycle between folders (config -> observability -> incidents -> core -> config was one) means
    # no folder can be read, tested or moved without the others; the direction is in docs/architecture.md.
    cycle = _cycle(_package_graph())
    assert cycle is None, "folder-level import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_the_code_cites_only_rules_in_the_repository() -> None:
    # The design notes and style guide the project started from are not in the repository: a
    # comment citing them ("STYLE.md point 7") points a reader nowhere (docs/architecture.md).
    for f in PKG.rglob("*.py"):
        text = f.read_text()
        for outside in ("STYLE.md", "DESIGN.md"):
            assert outside not in text, f"{f.relative_to(PKG.parent)} cites {outside}: cite docs/ instead"


def test_the_layout_in_operations_md_names_every_folder() -> None:
    layout = (PKG.parent / "docs" / "operations.md").read_text().split("## Layout of the code", 1)[1]
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(n for n in folders if f"  {n}/ " not in layout)
    assert not missing, f"docs/operations.md's layout leaves out {missing}"
