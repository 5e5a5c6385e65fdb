"""The package's layout: the tree shows the parts, no import cycle, no private name across directories, every
module importable alone, one command, and a loss added from outside in two functions and a registration line."""

import ast
import glob
import importlib
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit

from helpers import REPO

PACKAGE = os.path.join(REPO, "prbmrm")
MAX_TOP_MODULES = 12


def modules():
    """Every module of the package: its dotted name -> (path, the package its relative imports start from)."""
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
            if dotted.endswith(".__init__"):
                dotted = dotted[:-len(".__init__")]
                found[dotted] = (path, dotted)
            else:
                found[dotted] = (path, dotted.rsplit(".", 1)[0])
    return found


def imports(dotted, path, package, known):
    """The modules of the package that `path` imports, at any depth (function-level imports too)."""
    edges = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:  # `from . import x` imports the submodule x; else the module itself
                edges.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names)
    return {edge for edge in edges if edge in known and edge != dotted}


def import_graph():
    known = modules()
    return {name: imports(name, path, package, known) for name, (path, package) in known.items()}


def find_cycle(graph):
    """A list of modules that import each other in a circle, or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["prbmrm.training"] >= {"prbmrm.io", "prbmrm.losses", "prbmrm.distributed.oracle"}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_core_never_imports_the_layers_above_it():
    """Data in/out and the losses know nothing of structured models, solvers, MPI or the command lines."""
    graph = import_graph()
    above = ("prbmrm.structured", "prbmrm.solvers", "prbmrm.distributed.comm", "prbmrm.cli.train", "prbmrm.training",
             "prbmrm.distributed.oracle", "prbmrm.party.session")
    for name, targets in graph.items():
        if name.startswith(("prbmrm.io", "prbmrm.losses")):
            wrong = sorted(t for t in targets if t.startswith(above))
            assert not wrong, f"{name} imports {wrong}"


@pytest.mark.slow  # one fresh process per module
def test_every_module_imports_alone_in_a_fresh_process():
    """Each module imports with no other module of the package loaded before it (no hidden import-order
    dependency). A fork server that has imported numpy, scipy and h5py, never prbmrm, forks one process per
    module: what an interpreter of its own would show, without paying for those imports 80 times."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["numpy", "scipy.sparse", "scipy.optimize", "h5py"])
    failed = {}
    for name in sorted(name for name in modules() if not name.endswith("__main__")):
        process = context.Process(target=importlib.import_module, args=(name,))
        process.start()
        process.join(120)
        if process.exitcode != 0:
            process.kill()
            failed[name] = f"exit code {process.exitcode} (see: python -c 'import {name}')"
    assert not failed, failed


def test_the_top_level_holds_at_most_12_modules():
    """The parts are packages; the top level keeps the front door, its options, model files and commands."""
    top = sorted(name for name in os.listdir(PACKAGE) if name.endswith(".py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_every_part_is_a_package_that_says_what_it_is():
    for directory, _, files in os.walk(PACKAGE):
        if any(name.endswith(".py") for name in files) and "__pycache__" not in directory:
            init = os.path.join(directory, "__init__.py")
            assert os.path.exists(init), directory
            assert ast.get_docstring(ast.parse(open(init).read())), init


def private_imports_across_directories():
    """(module, imported module, private names) for each import of a private module or name from another directory."""
    known = modules()
    found = []
    for name, (path, package) in known.items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("prbmrm")):
                continue
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module
            target_path = os.path.join(REPO, *target.split("."))
            target_dir = target_path if os.path.isdir(target_path) else os.path.dirname(target_path)
            if os.path.samefile(target_dir, os.path.dirname(path)):
                continue
            private = [alias.name for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
            if private or any(part.startswith("_") and not part.startswith("__") for part in target.split(".")):
                found.append((name, target, private))
    return found


def test_no_private_name_is_imported_from_another_directory():
    assert not private_imports_across_directories()


def test_the_private_import_finder_finds_one(tmp_path, monkeypatch):
    package = tmp_path / "prbmrm"
    (package / "io").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "io" / "__init__.py").write_text("")
    (package / "io" / "readers.py").write_text("def _parse(): pass\n")
    (package / "training.py").write_text("from .io.readers import _parse\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", str(package))
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    assert private_imports_across_directories() == [("prbmrm.training", "prbmrm.io.readers", ["_parse"])]


def test_the_library_never_imports_the_commands():
    """The commands are a thin layer over the library: nothing but them and their entry points imports cli."""
    graph = import_graph()
    entry = ("prbmrm.cli", "prbmrm.__main__", "prbmrm.train")
    wrong = {name: sorted(t for t in targets if t.startswith("prbmrm.cli")) for name, targets in graph.items()
             if not name.startswith(entry)}
    assert not {name: targets for name, targets in wrong.items() if targets}


def test_the_tests_mirror_the_package():
    """Each folder of tests/ that holds tests is named after a package of prbmrm/."""
    tests = os.path.join(REPO, "tests")
    folders = {os.path.basename(os.path.dirname(path)) for path in glob.glob(os.path.join(tests, "*", "test_*.py"))}
    packages = {name for name in os.listdir(PACKAGE) if os.path.isdir(os.path.join(PACKAGE, name))}
    assert folders and folders <= packages, folders - packages


def run_command(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=REPO))


def test_python_m_prbmrm_lists_the_subcommands():
    done = run_command("prbmrm")
    assert done.returncode == 0, done.stderr
    for name in ("shard", "train", "predict", "plot", "party"):
        assert f"\n  {name} " in done.stdout, done.stdout
    unknown = run_command("prbmrm", "nope")
    assert unknown.returncode == 2 and "unknown subcommand 'nope'" in unknown.stderr


def test_the_console_script_is_declared():
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts == {"prbmrm": "prbmrm.__main__:main"}


@pytest.mark.parametrize("name, module", [("shard", "prbmrm.cli.shard"), ("train", "prbmrm.cli.train"),
                                          ("predict", "prbmrm.cli.predict"), ("plot", "prbmrm.cli.plot"),
                                          ("party", "prbmrm.cli.party")])
def test_a_subcommand_is_its_module(name, module):
    through, direct = run_command("prbmrm", name, "--help"), run_command(module, "--help")
    assert through.returncode == direct.returncode == 0, through.stderr + direct.stderr
    # The same help, under the name the user typed.
    assert through.stdout.startswith(f"usage: prbmrm {name} ") and direct.stdout.startswith(f"usage: {module} ")
    # argparse wraps the usage lines by the program name's length: compare the words.
    assert through.stdout.replace(f"prbmrm {name}", module).split() == direct.stdout.split()


@pytest.mark.parametrize("name, module, argv", [("train", "prbmrm.cli.train", ["--lam", "-1"]),
                                                ("shard", "prbmrm.cli.shard", ["no-such-file", "--out", "x"]),
                                                ("party", "prbmrm.cli.party", [])])
def test_a_subcommand_reports_errors_under_the_name_typed(name, module, argv):
    through, direct = run_command("prbmrm", name, *argv), run_command(module, *argv)
    assert through.returncode == direct.returncode == 2
    assert through.stderr.splitlines()[-1].startswith(f"prbmrm {name}: error: "), through.stderr
    assert direct.stderr.splitlines()[-1].startswith(f"{module}: error: "), direct.stderr


def test_prbmrm_train_trains_like_python_m_prbmrm_train(tmp_path):
    for prefix, out in ((["prbmrm", "train"], "a.h5"), (["prbmrm.cli.train"], "b.h5")):
        done = run_command(*prefix, "--max-iter", "20", "--quiet", "--out", str(tmp_path / out))
        assert done.returncode == 0, done.stderr
    import h5py

    with h5py.File(tmp_path / "a.h5", "r") as a, h5py.File(tmp_path / "b.h5", "r") as b:
        assert a["w"][()].tobytes() == b["w"][()].tobytes()


# ---- A scalar loss from outside the package -------------------------------

from prbmrm.losses import LOSSES, BinaryLoss, register_loss  # noqa: E402


class SoftHinge(BinaryLoss):
    """log(1 + exp(1 - y f)): a smooth hinge, not one of the package's losses."""

    name = "soft_hinge_outside"

    def value(self, f, y):
        return np.logaddexp(0.0, 1.0 - y * f)

    def derivative(self, f, y):
        return -y * expit(1.0 - y * f)


@pytest.fixture
def soft_hinge():
    register_loss(SoftHinge)
    yield SoftHinge.name
    del LOSSES[SoftHinge.name]


def test_a_scalar_loss_registered_from_outside_trains_to_scipys_optimum(soft_hinge):
    from prbmrm.training import run, load_demo

    X, y = load_demo()
    lam = 1e-2
    result, _, loss = run(None, loss=soft_hinge, lam=lam, rel_epsilon=0.0, epsilon=1e-9)
    assert isinstance(loss, SoftHinge) and result.success

    def objective(w):
        margins = 1.0 - y * (X @ w)
        return (0.5 * lam * w @ w + np.mean(np.logaddexp(0.0, margins)),
                lam * w - X.T @ (y * expit(margins)) / len(y))

    reference = minimize(objective, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B",
                         options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10000}).fun
    assert result.lower_bound <= reference + 1e-12  # a valid bound on the true optimum
    assert result.fun - reference <= 1e-8 + 1e-12
    assert result.fun == pytest.approx(objective(result.w)[0], rel=1e-12)


def test_an_unregistered_name_lists_the_registered_ones(soft_hinge):
    from prbmrm.errors import UsageError
    from prbmrm.losses import get_loss

    with pytest.raises(UsageError, match="soft_hinge_outside.*|.*soft_hinge_outside"):
        get_loss("no_such_loss")
