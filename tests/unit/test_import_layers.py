"""The package's import structure, read from the source with ``ast`` (function-level imports included).

A folder of ``megatron_loop`` is one room, and so is each top-level module (``megatron_loop/plan.py``),
``tools/`` and ``pretrain_loop.py``. Rooms stand on floors in the order data flows: a room imports only
from rooms on lower floors (never from its own floor, never up), so the rooms' imports form no circle,
and no chain of imports between modules comes back to where it started. :data:`FLOORS` is the table,
one row per room; to move a module, move it into the folder of the floor it belongs to.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from testpaths import REPO

PACKAGE = "megatron_loop"
MAX_LINES = 500
LONG_MODULES_ALLOWED = {"megatron_loop/hf/modeling_looplm.py"}  # self-contained: copied into every HF export

# room -> (floor, why it sits there). A room imports only from rooms on lower floors.
FLOORS: dict[str, tuple[int, str]] = {
    "megatron_loop.errors": (0, "error types and OS-error wording, used everywhere"),
    "megatron_loop.atomic": (0, "temp-file + rename writes, used by every writer"),
    "megatron_loop.console": (0, "third-party console lines filtered, progress bars only on a terminal"),
    "megatron_loop.cli": (1, "the command-line convention (one error line, exit 2) and the tools' shared argument checks"),
    "megatron_loop.config": (1, "YAML -> validated dataclasses (and the DeepSpeed JSON); reads nothing but the base"),
    "megatron_loop.hf": (2, "the self-contained HF modeling file (torch + transformers only), copied into every "
                            "export; the training model runs its recurrence and conditioning"),
    "megatron_loop.flops": (2, "FLOP counts from a ModelConfig alone (no torch)"),
    "megatron_loop.plotting": (2, "matplotlib styling shared by every figure"),
    "megatron_loop.data": (2, "indexed datasets, packing, loaders, preprocessing: read the config"),
    "megatron_loop.model": (3, "the LoopLM built plain from a ModelConfig (and a placement): blocks, conditioning, "
                               "the vocabulary edges, the loss, recomputation policies"),
    "megatron_loop.parallel": (4, "process groups (bootstrap), this rank's place in them, the TP gradient sum, "
                                  "shards, DeepSpeed's mpu, and parallelize: a built model prepared for training"),
    "megatron_loop.measure": (4, "timers, peak memory and FLOP/s, host-sync probes, the LM-head loss check"),
    "megatron_loop.optim": (5, "Muon + AdamW (on ZeRO partitions and TP shards), the WSD schedule, the engine"),
    "megatron_loop.plan": (6, "steps, WSD split, accumulation and token budget of a run, from the config"),
    "megatron_loop.checkpoint": (7, "the on-disk checkpoint format: folders, manifest, selection, weights, publish"),
    "megatron_loop.registry": (7, "the paper's run table, rendered as configs (counts parameters via the plan)"),
    "megatron_loop.training": (8, "the run built once, the step and the loop, checkpoints, resume, metrics"),
    "megatron_loop.export": (9, "HF export: a training checkpoint to a transformers folder and back, models "
                                "loaded from checkpoints or exports"),
    "megatron_loop.curves": (9, "training curves from metrics.jsonl (tools/plot_metrics.py)"),
    "megatron_loop.dryrun": (9, "--dry-run report: runs training's preflight checks on the plan"),
    "megatron_loop.eval": (10, "loop-sweep evaluation of HF exports"),
    "megatron_loop.studies": (11, "registered studies: plans, the gate, per-item analysis, archives and the docs "
                                  "generated from them; above registry (the CPU twins) and eval (per-item scoring)"),
    "megatron_loop.gpu": (11, "the GPU sessions: steps under process-tree limits, the device's environment, the "
                             "reports (whose tables tools/bench.py renders with); runs training and eval as commands"),
    "megatron_loop.probes": (11, "representation probes of checkpoints or HF exports (the sweep's one-pass rule)"),
    "megatron_loop": (12, "the package root (__init__.py): re-exports load_config, build_model"),
    "tools": (13, "command-line tools: import anything, imported by nothing in the package"),
    "pretrain_loop": (13, "the training entry point"),
}


def source_files() -> list[Path]:
    return [*sorted((REPO / PACKAGE).rglob("*.py")), *sorted((REPO / "tools").rglob("*.py")), REPO / "pretrain_loop.py"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """The megatron_loop modules ``path`` imports anywhere in it (``from P import m`` names module P.m
    when m is a submodule, else P); ``if TYPE_CHECKING:`` blocks are left out (never run)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    type_checking = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if _is_module(sub) else base)
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def import_graph() -> dict[str, set[str]]:
    graph = {module_name(p): imports_of(p) for p in source_files()}
    return {m: {t for t in targets if t != m} for m, targets in graph.items()}


def room_of(module: str) -> str:
    """The room a module stands in: its folder under ``megatron_loop`` (``megatron_loop.model`` for
    ``megatron_loop.model.looplm``), the top-level module itself, ``tools`` or ``pretrain_loop``."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def floor_of(module: str) -> int:
    room = room_of(module)
    assert room in FLOORS, f"{module}: its room {room} has no row in FLOORS; add one (its floor and why)"
    return FLOORS[room][0]


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """room -> the other rooms its modules import."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room_of(module), set()).update(room_of(t) for t in targets)
    return {room: targets - {room} for room, targets in rooms.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_package_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_room_imports_from_its_own_floor_or_a_higher_one():
    """Arrows between rooms run down only: no import from a lower floor up, none across one floor (so the
    rooms form no circle either)."""
    upward = [f"{m} ({room_of(m)}, floor {floor_of(m)}) imports {t} ({room_of(t)}, floor {floor_of(t)})"
              for m, targets in sorted(import_graph().items()) for t in sorted(targets)
              if room_of(t) != room_of(m) and floor_of(t) >= floor_of(m)]
    assert not upward, "\n".join(upward)
    assert find_cycle(room_graph(import_graph())) is None


def test_the_checker_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    """A cycle hidden in a function body, and an upward import spelled relatively, are both found, and
    the rooms are the folders."""
    package = tmp_path / PACKAGE
    (package / "training").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("def validate():\n    from megatron_loop.training import sampling\n")
    (package / "training" / "__init__.py").write_text("")
    (package / "training" / "sampling.py").write_text("from ..config import validate\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    graph = {module_name(p): imports_of(p) for p in sorted(package.rglob("*.py"))}
    assert graph["megatron_loop.config"] == {"megatron_loop.training.sampling"}
    assert graph["megatron_loop.training.sampling"] == {"megatron_loop.config"}
    assert find_cycle(graph) == ["megatron_loop.config", "megatron_loop.training.sampling", "megatron_loop.config"]
    assert room_of("megatron_loop.training.sampling") == "megatron_loop.training"
    assert room_graph(graph)["megatron_loop.config"] == {"megatron_loop.training"}
    assert floor_of("megatron_loop.training.sampling") > floor_of("megatron_loop.config")


def test_every_room_has_a_floor_and_every_row_a_room():
    rooms = {room_of(module) for module in import_graph()}
    for module in import_graph():
        floor_of(module)
    assert sorted(set(FLOORS) - rooms) == []  # no row for a room that is gone


def test_no_module_over_500_lines():
    """One job per module: a maintainer reads a module whole (the HF modeling file is exempt: it is
    copied alone into every export and must stand by itself)."""
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in source_files()
            if p.relative_to(REPO).as_posix() not in LONG_MODULES_ALLOWED
            and (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


# the calls that create process groups, and the one module allowed to make them
GROUP_CREATION = ("init_process_group", "new_group", "initialize_model_parallel", "init_distributed")
GROUP_OWNER = "megatron_loop/parallel/bootstrap.py"


def _calls(path: Path) -> set[str]:
    """The names of every function or method ``path`` calls (``a.b.f(...)`` counts as ``f`` and ``b.f``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
                if isinstance(func.value, ast.Name):
                    names.add(f"{func.value.id}.{func.attr}")
    return names


def test_only_the_bootstrap_module_creates_process_groups():
    """No model constructor, engine or training module creates a process group or picks a port:
    ``parallel/bootstrap.py`` does, for everyone (the model builder asks it)."""
    package = sorted((REPO / PACKAGE).rglob("*.py"))
    makers = sorted(p.relative_to(REPO).as_posix() for p in package if _calls(p) & set(GROUP_CREATION))
    assert makers == [GROUP_OWNER]
    ports = sorted(p.relative_to(REPO).as_posix() for p in package if "socket.socket" in p.read_text())
    # and the GPU sessions' driver, which picks the deepspeed launcher's --master_port for the commands it
    # runs (it imports no torch: bootstrap's free_port would load megatron-core before the kit is installed)
    assert ports == sorted([GROUP_OWNER, "megatron_loop/gpu/session.py"])


def test_one_module_calls_deepspeed_initialize():
    callers = sorted(p.relative_to(REPO).as_posix() for p in sorted((REPO / PACKAGE).rglob("*.py"))
                     if "deepspeed.initialize" in _calls(p))
    assert callers == ["megatron_loop/optim/engine.py"]


def test_one_module_reads_the_deepspeed_json():
    """The DeepSpeed JSON has one owner: config/deepspeed.py knows where the shipped files are and is the
    one module that parses a DeepSpeed config (a JSON with a ``zero_optimization`` section)."""
    package = sorted((REPO / PACKAGE).rglob("*.py"))
    where = sorted(p.relative_to(REPO).as_posix() for p in package if '"deepspeed_configs"' in p.read_text())
    parsers = sorted(p.relative_to(REPO).as_posix() for p in package
                     if "json.load" in (text := p.read_text()) and "zero_optimization" in text)
    assert where == parsers == ["megatron_loop/config/deepspeed.py"]


def test_the_checks_above_see_a_violation(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("import torch.distributed as dist\n\ndef f():\n    dist.new_group([0])\n    deepspeed.initialize(x)\n")
    assert {"new_group", "dist.new_group", "deepspeed.initialize"} <= _calls(bad)


def import_graph_figures() -> str:
    """The line docs/ARCHITECTURE.md quotes between its ``import-graph`` markers: rooms, floors (the
    longest chain of imports below a room, counting the room), arrows between rooms, arrows from a
    lower floor of ``FLOORS`` up (or across one), and circles between rooms (as farm-studio counts them)."""
    rooms = room_graph(import_graph())
    height: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in height:
            height[room] = 1 + max((floor(t) for t in rooms.get(room, ())), default=0)
        return height[room]

    arrows = [(room, t) for room, targets in rooms.items() for t in targets]
    up = sum(1 for room, t in arrows if FLOORS[t][0] >= FLOORS[room][0])
    circles = 0 if find_cycle(rooms) is None else "at least 1"
    return (f"{len(rooms)} rooms on {max(map(floor, rooms))} floors, {len(arrows)} arrows between rooms, {up} that "
            f"run back up, {circles} circles")


def test_architecture_md_quotes_the_import_graph_as_measured():
    import re

    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    quoted = re.search(r"<!-- import-graph -->(.*?)<!-- /import-graph -->", text, re.S)
    assert quoted, "docs/ARCHITECTURE.md: no <!-- import-graph --> ... <!-- /import-graph --> line"
    assert " ".join(quoted.group(1).split()) == " ".join(import_graph_figures().split()), (
        f"docs/ARCHITECTURE.md quotes {quoted.group(1)!r}; the imports give {import_graph_figures()!r}")
