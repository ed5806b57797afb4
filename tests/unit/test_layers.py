"""The package layering holds: every module imports only from the layers below its own.

The layers are read from README.md ("Where things are": the numbered list under
``src/magi_code/``, lowest first), so the README and this test cannot drift; every module
of the package must be in exactly one of them. Imports are read from the source with
``ast`` (function-level and relative imports included), so an import added anywhere in a
package counts. Within a layer, modules may import each other, without a cycle.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import magi_code
from magi_code.daemon.preload import NEVER_RUN
from tests.support.product_source import parsed_modules

ROOT = Path(magi_code.__file__).parent
README = Path(__file__).resolve().parents[2] / "README.md"

# Beyond the layer order (module -> modules it must never import): adapters do not import
# one another, except the shim, which runs on the client; the client (the light side of
# every frontend) imports no coordinator or session and turn code; the coordinator is
# transport-neutral; ``daemonctl`` works through the client, not the shim.
APART: dict[str, set[str]] = {
    "core": {"endpoint"},
    "client": {"core", "sessions", "turns", "stdio", "daemon", "shim", "oneshot", "acp"},
    "shim": {"core", "daemon", "stdio", "oneshot", "acp"},
    "daemon": {"client", "shim", "stdio", "oneshot", "acp"},
    "stdio": {"daemon", "client", "shim", "oneshot", "acp"},
    "oneshot": {"acp"},
    # The ACP agent is a client of the core (client/, daemon/ for its embedded mode, and
    # the stdio byte streams).
    "acp": {"core", "shim", "oneshot", "sessions", "turns", "tools"},
    "daemonctl": {"shim", "acp"},
}


def readme_layers() -> list[list[str]]:
    """The README's layers, lowest first, each a list of top-level module names."""
    text = README.read_text()
    layers: list[list[str]] = []
    for line in text[text.index("- `src/magi_code/`") :].splitlines()[1:]:
        if re.match(r" {2}\d+\. ", line):
            layers.append([])
        elif not layers:
            continue  # the bullet's own text, before its list
        elif not line.startswith(" " * 5):
            break  # the end of the list
        layers[-1] += re.findall(r"`(\w+)(?:/|\.py)`", line)
    return layers


def modules() -> set[str]:
    return {
        path.name.removesuffix(".py")
        for path in ROOT.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py") or (path / "__init__.py").exists()
    }


def _imports() -> dict[str, dict[str, str]]:
    """module -> {module it imports: where (the first such import)}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for path, tree in parsed_modules():
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        package, own = parts[:-1], parts[1]
        for node in ast.walk(tree):
            targets: list[list[str]] = []
            if isinstance(node, ast.Import):
                targets = [alias.name.split(".") for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = list(package[: len(package) + 1 - node.level]) if node.level else []
                module = base + (node.module.split(".") if node.module else [])
                # ``from magi_code import logs``, ``from . import activity``: names modules.
                targets = [[*module, alias.name] for alias in node.names]
            for target in targets:
                if target[0] == "magi_code" and len(target) > 1 and target[1] != own:
                    where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                    graph[own].setdefault(target[1], where)
    return graph


def test_the_readme_puts_every_module_in_one_layer() -> None:
    layers = readme_layers()
    assert len(layers) > 1, "README.md: no numbered list of layers under `src/magi_code/`"
    named = [name for layer in layers for name in layer]
    assert sorted(set(named)) == sorted(named), f"README.md names a module twice: {named}"
    assert sorted(modules() - set(named)) == [], "modules missing from the README's layers"
    assert sorted(set(named) - modules()) == [], "the README's layers name missing modules"


def test_no_module_imports_a_layer_above_its_own() -> None:
    layer_of = {name: index for index, layer in enumerate(readme_layers()) for name in layer}
    graph = _imports()
    upward = [
        f"{module} (layer {layer_of[module] + 1}) imports {target} "
        f"(layer {layer_of[target] + 1}) at {where}"
        for module, targets in sorted(graph.items())
        for target, where in sorted(targets.items())
        if target in layer_of and layer_of[target] > layer_of.get(module, len(layer_of))
    ]
    assert upward == [], "imports upward, against the layer order in README.md:\n" + "\n".join(
        upward
    )


def test_modules_kept_apart_do_not_import_each_other() -> None:
    graph = _imports()
    wrong = [
        f"{module} imports {target} at {graph[module][target]}"
        for module, banned in sorted(APART.items())
        for target in sorted(banned & graph[module].keys())
    ]
    assert wrong == []


def test_no_modules_import_each_other_in_a_cycle() -> None:
    graph = _imports()
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join([*trail, node, nxt])}"
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for node in sorted(modules()):
        if node not in state:
            visit(node, [])


def test_the_daemon_preload_skips_exactly_what_the_layers_keep_from_the_daemon() -> None:
    # What the daemon leaves out of its preload it must never be able to import (else an
    # upgrade could mix new code into it); what it could import it must preload.
    layers = readme_layers()
    own = next(index for index, layer in enumerate(layers) if "daemon" in layer)
    above = {name for layer in layers[own + 1 :] for name in layer}
    assert above | APART["daemon"] == NEVER_RUN
