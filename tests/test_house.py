"""How the product is put together: what imports what, and what a pytest run in the same environment gets."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata


def test_doctor_does_not_import_pytest() -> None:
    """The verify engine is a library: doctor judges the same facts without pytest in the process."""
    probe = ("import sys, gpunode.doctor; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_the_verify_plugin_is_not_registered_for_every_pytest_run() -> None:
    """No pytest11 entry point: only gpunode's own runs (``-p gpunode.verify.plugin``) get --inventory."""
    assert not [e for e in metadata.entry_points(group="pytest11") if e.value.startswith("gpunode")]
    result = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, check=False)
    assert "--inventory" not in result.stdout


def test_the_chain_is_listed_once_and_each_step_has_its_deploy_fact_diagnosis_and_suite() -> None:
    """gpunode.chain is the one list; the deploy files and the suites named after each step follow it."""
    from pathlib import Path

    from gpunode import chain

    root = Path(__file__).parents[1]
    suites = sorted(p.stem.removeprefix("test_") for p in (root / "src/gpunode/verify/suites").glob("test_*.py"))
    assert suites == sorted(chain.NAMES)
    for folder in (root / "deploys", root / "src/gpunode/scaffold/deploys"):
        assert sorted(p.stem for p in folder.glob("*.py")) == sorted(("bootstrap", *chain.NAMES)), folder
    for step in chain.STEPS:
        assert callable(chain.load(step.deploy))
        if step.on_node:
            assert chain.load(step.fact)().command() and callable(chain.load(step.diagnose))
    source = "\n".join(p.read_text() for p in (root / "src/gpunode").rglob("*.py") if p.name != "chain.py")
    assert '"toolkit_repo", "toolkit"' not in source and "'toolkit_repo', 'toolkit'" not in source


# the product's rooms, lowest first: a module may import its own room and the rooms below, never one above
LAYERS = (
    ("gpunode", "errors", "chain", "gpu_generations", "op_order"),
    ("inventory_data",),
    ("settings",),
    ("cluster", "connection", "image"),
    ("host_settings",),
    ("facts",),
    ("diagnosis",),
    ("operations",),
    ("steps", "verify"),
    ("deploy", "doctor", "preflight", "migrate", "init", "lint", "lint_dra", "node_checker"),
    ("cli",),
)


def product_imports() -> dict[str, set[str]]:
    """Every product module (not the scaffold) and the gpunode modules it imports; the simulator
    (gpunode_sim) is another distribution, which the product must not import at all."""
    import ast
    from pathlib import Path

    src = Path(__file__).parents[1] / "src"
    graph: dict[str, set[str]] = {}
    for path in (src / "gpunode").rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.startswith("gpunode.scaffold"):
            continue
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gpunode"):
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names
                          if (src / f"{node.module}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("gpunode")}
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not [n for n in names if n.startswith("gpunode_sim")], f"{name} imports the simulator"
        graph[name] = found
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gpunode"


def test_imports_go_down_the_layers_only_and_the_product_never_imports_the_simulator() -> None:
    level = {name: depth for depth, rooms in enumerate(LAYERS) for name in rooms}
    graph = product_imports()
    assert {room(m) for m in graph} <= set(level), sorted({room(m) for m in graph} - set(level))
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                   if level[room(d)] > level[room(m)])
    assert wrong == []


def test_no_import_cycle_between_product_modules() -> None:
    graph = product_imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path[path.index(module):], module))
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            if dep in graph and dep != module and not module.startswith(dep + "."):
                visit(dep, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_one_table_of_nvidias_plugin_config_keys_for_both_packages() -> None:
    """The plugin owns the table; gpunode carries it verbatim (the plugin imports nothing from gpunode)."""
    from pathlib import Path

    root = Path(__file__).parents[1]
    owned = (root / "plugin/gpunode_plugin/config_keys.py").read_bytes()
    assert (root / "src/gpunode/cluster/plugin_config_keys.py").read_bytes() == owned
    assert b"import" not in owned.split(b'"""', 2)[2]  # pure data


def test_run_state_is_kept_on_pyinfras_objects_not_in_module_globals() -> None:
    """One record per host and per run (gpunode.operations.run_state); a new run starts empty."""
    from pathlib import Path

    from pyinfra.api import State

    from gpunode.operations.run_state import host_run, run_of

    root = Path(__file__).parents[1] / "src/gpunode"
    holders = [str(p.relative_to(root)) for p in root.rglob("*.py") if "WeakKeyDictionary" in p.read_text()]
    assert holders == []

    class Target:
        pass

    first, second = Target(), Target()
    host_run(first).reboot = "driver upgraded without reboot"
    assert host_run(first).reboot and host_run(second).reboot is None
    run_of(State()).rolling = True
    assert run_of(State()).rolling is False


def test_the_simulator_is_its_own_distribution_with_rooms_by_concern_and_no_import_circle() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).parents[1]
    assert not list((root / "src/gpunode").glob("sim/**/*.py"))
    package = root / "sim/gpunode_sim"
    rooms = sorted(p.name for p in package.iterdir() if (p / "__init__.py").exists())
    assert rooms == ["access", "build", "cluster", "guest", "host", "images", "node", "registry", "repos", "spec"]
    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(root / "sim").with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = {node.module for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpunode_sim.")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path[path.index(module):], module))
        if module not in done:
            for dep in sorted(graph.get(module, ())):
                if dep in graph and not module.startswith(dep + "."):
                    visit(dep, (*path, module))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_inventory_data_is_parsed_in_one_place() -> None:
    """Only gpunode.host_settings turns a host's raw data into settings; every other module is handed them."""
    from pathlib import Path

    root = Path(__file__).parents[1] / "src/gpunode"
    parsing = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "scaffold" not in p.parts and ".from_data(" in p.read_text())
    assert parsing == ["host_settings.py"], parsing


def test_one_verdict_vocabulary_from_diagnosis_to_every_report() -> None:
    """ok / finding / not checked: the findings, verify's steps, doctor's links and the preflight's lines."""
    from pathlib import Path

    from gpunode.diagnosis import Verdict
    from gpunode.doctor import Link
    from gpunode.preflight import FINDING, NOT_CHECKED, OK
    from gpunode.verify.checks import StepResult

    assert [str(v) for v in Verdict] == ["ok", "finding", "not checked"]
    assert {OK, FINDING, NOT_CHECKED} == set(Verdict)
    for kind in (StepResult, Link):
        assert kind.__dataclass_fields__["state"].type == "Verdict", kind
    source = "\n".join(p.read_text() for p in (Path(__file__).parents[1] / "src/gpunode").rglob("*.py"))
    for other in ("Severity", '"outcome"', '"pass"', '"skip"', '"problem"'):
        assert other not in source, other
