"""What keeps the suite passing on a busy machine: empty stdin for every child, no wall-clock bounds.

MPICH's mpiexec forwards its stdin to rank 0 and aborts the whole job ("process
reading stdin too slowly; can't keep up") when more arrives than the rank
reads, which happens whenever a test runner or a pipe gives it a non-empty
stdin; so every child process gets ``stdin=subprocess.DEVNULL``. A test that
bounds wall-clock seconds fails under load without a bug: hangs are caught by
timeouts instead, and speed is measured by the scripts in scripts/.
"""

import ast
import glob
import os
import subprocess
import sys

import pytest

from helpers import REPO, mpiexec

SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}
CLOCKS = {"time", "monotonic", "perf_counter", "process_time"}
TIMED = ("seconds", "elapsed", "duration")


def sources(*patterns):
    return sorted(path for pattern in patterns for path in glob.glob(os.path.join(REPO, pattern), recursive=True))


def calls(path):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def test_every_child_process_gets_a_stdin():
    missing = [f"{os.path.relpath(path, REPO)}:{node.lineno}"
               for path in sources("tests/**/*.py", "scripts/*.py", "prbmrm/**/*.py")
               for node in calls(path)
               if isinstance(node.func, ast.Attribute) and node.func.attr in SPAWNERS
               and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"
               and not {"stdin", "input"} & {keyword.arg for keyword in node.keywords}]
    assert missing == [], "subprocess calls without stdin= (give stdin=subprocess.DEVNULL): " + ", ".join(missing)


def timed(node):
    """Whether `node` is a clock reading or a variable holding seconds."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in CLOCKS and isinstance(node.func.value, ast.Name) and node.func.value.id == "time"
    return isinstance(node, ast.Name) and any(word in node.id for word in TIMED)


def test_no_test_asserts_wall_clock_seconds():
    bounded = []
    for path in sources("tests/**/*.py"):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assert):
                continue
            for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                ordered = any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in compare.ops)
                if ordered and any(timed(n) for side in (compare.left, *compare.comparators)
                                   for n in ast.walk(side)):
                    bounded.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
    assert bounded == [], "wall-clock assertions (use a timeout, time it in scripts/): " + ", ".join(bounded)


def test_mpiexec_with_a_pipe_on_stdin_is_documented(tmp_path):
    """`yes | mpiexec -n 2 python -m prbmrm.cli.train` fails inside mpiexec itself (any program does, even
    `true`; how soon depends on timing), so no option of prbmrm can fix it: the README's
    troubleshooting gives the cure, ``< /dev/null``, which this checks under a full pipe."""
    command = [mpiexec(), "-n", "2", sys.executable, "-m", "prbmrm.cli.train", "--quiet", "--out", str(tmp_path / "m.h5")]
    cured = subprocess.run(["sh", "-c", 'yes | head -c 1000000 | "$@" < /dev/null', "sh", *command],
                           capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO),
                           stdin=subprocess.DEVNULL, cwd=REPO)
    assert cured.returncode == 0, cured.stderr
    with open(os.path.join(REPO, "docs", "troubleshooting.md")) as f:
        assert "process reading stdin too slowly" in f.read()


def test_a_fast_selection_a_peers_selection_and_ci_running_the_readme_command():
    """`pytest -m "not slow"` leaves out the slow modules; the tests that build peer programs or run the
    benchmarks (marker ``peers``) run only when selected (``pytest -m peers``); CI (.ci/run) runs the
    README's command as it stands."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        markers = tomllib.load(f)["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("slow:") for marker in markers)
    assert any(marker.startswith("peers:") for marker in markers)
    slow = [path for path in sources("tests/**/test_*.py") if "pytestmark = pytest.mark.slow" in open(path).read()]
    assert len(slow) >= 3
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        addopts = tomllib.load(f)["tool"]["pytest"]["ini_options"]["addopts"]
    assert addopts == "-m 'not peers' -n auto --dist loadgroup"
    with open(os.path.join(REPO, ".ci", "run")) as f:
        commands = [line.split() for line in f if "pytest" in line]
    assert commands == [["python", "-m", "pytest"]]


def test_tests_of_host_wide_resources_share_one_worker():
    """The suite runs on several pytest-xdist workers at once: tests that make network namespaces or start
    Slurm daemons use names and ports of the whole host, so their modules carry xdist_group("host"), and
    every pytest run under mpiexec asks for one process (``-n 0``)."""
    host_wide = [path for path in sources("tests/**/test_*.py")
                 if any(word in open(path).read() for word in ("netns_cluster.sh", "slurm_local.sh"))]
    assert len(host_wide) >= 2
    ungrouped = [os.path.relpath(path, REPO) for path in host_wide
                 if 'pytest.mark.xdist_group("host")' not in open(path).read()]
    assert ungrouped == [], "modules using host-wide names outside the 'host' group: " + ", ".join(ungrouped)
    launched = []  # the argument lists of pytest runs under mpiexec
    for path in sources("tests/**/*.py"):
        with open(path) as f:
            lists = [node for node in ast.walk(ast.parse(f.read(), path)) if isinstance(node, ast.List)]
        for node in lists:
            words = [arg.value if isinstance(arg, ast.Constant) else None for arg in node.elts]
            if "--with-mpi" in words:
                launched.append((f"{os.path.relpath(path, REPO)}:{node.lineno}",
                                 any(list(pair) == ["-n", "0"] for pair in zip(words, words[1:]))))
    assert len(launched) >= 2 and all(one_process for _, one_process in launched), launched
