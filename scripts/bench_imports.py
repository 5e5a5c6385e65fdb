"""A rank's RSS after its imports, beside processes that import only its dependencies (CPU: bench_startup.py).

Each round runs, in turn, one fresh interpreter per import set and reads, in
that process once its imports are done, the resident set (``VmRSS``). The sets:

- ``prbmrm run``: every module a 1-iteration training on the demo data has
  imported by its end (listed by ``python -X importtime``), after
  ``prbmrm.cli`` as in the run (the numpy modules it defers stay unloaded),
  MPI initialised;
- ``prbmrm.train``: the command's own imports, MPI initialised;
- ``numpy scipy h5py mpi4py``: those four packages (``import scipy`` loads
  no submodule), MPI initialised;
- ``numpy scipy.constants h5py mpi4py``: the same with scipy's lightest
  public subpackage, a table of constants: what a process pays once it uses
  any of scipy (every subpackage loads scipy's array-API layer, which copies
  numpy's namespace);
- ``numpy scipy.sparse h5py mpi4py``: the same with scipy.sparse, which a rank
  needs for CSR data;
- ``... scipy.linalg``: and scipy.linalg, which the subproblem's LAPACK needs.

Rounds alternate the sets, so machine load hits all alike; the table gives
the median over rounds and each set's difference to the bare four packages
and to the four with scipy.constants.

    python scripts/bench_imports.py [--rounds 5]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import re
{imports}
from mpi4py import MPI
print("PROBE", int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024)
"""

BARE = "import numpy, scipy, h5py, mpi4py"


def run_modules(workdir):
    """The top-level import statements of every module a short training run imports (``-X importtime``)."""
    out = os.path.join(workdir, "model.h5")
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "prbmrm.cli.train", "--max-iter", "1",
                           "--quiet", "--out", out], capture_output=True, text=True, cwd=workdir, timeout=600,
                          stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=REPO))
    if done.returncode != 0:
        sys.exit(f"bench_imports: the training run failed:\n{done.stderr[-2000:]}")
    names = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    # Importing a module imports its parents; private modules import through their packages.
    wanted = sorted({name for name in names[1:] if all(part.isidentifier() and not part.startswith("_")
                                                        for part in name.split("."))
                     and name.split(".")[0] not in {"encodings", "site", "sitecustomize", "usercustomize"}})
    # prbmrm.cli first, as in the run: it defers the numpy modules that scipy.sparse names (prbmrm.cli.deferred)
    return "import prbmrm.cli\n" + "\n".join(f"try:\n    import {name}\nexcept ImportError:\n    pass"
                                              for name in wanted)


def probe(imports):
    """RSS (MB) of a fresh interpreter after `imports` and MPI's initialisation."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(imports=imports)], capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=REPO))
    line = next((line for line in done.stdout.splitlines() if line.startswith("PROBE ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"bench_imports: a probe failed:\n{done.stderr[-2000:]}")
    return float(line.split()[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        sets = {"prbmrm run": run_modules(workdir), "prbmrm.train": "import prbmrm.cli.train",
                "numpy scipy h5py mpi4py": BARE,
                "numpy scipy.constants h5py mpi4py": BARE + ", scipy.constants",
                "numpy scipy.sparse h5py mpi4py": BARE + ", scipy.sparse",
                "numpy scipy.sparse scipy.linalg h5py mpi4py": BARE + ", scipy.sparse, scipy.linalg"}
        figures = {name: [] for name in sets}
        loads = []
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for name, imports in sets.items():
                figures[name].append(probe(imports))
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL).stdout.strip()
    print(f"commit {commit}, {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{args.rounds} rounds, load {min(loads):.1f}-{max(loads):.1f}")
    print()
    print("| imports | RSS MB, median (range) | less the bare four | less the four with scipy.constants |")
    print("| --- | --- | --- | --- |")
    bare = statistics.median(figures["numpy scipy h5py mpi4py"])
    used = statistics.median(figures["numpy scipy.constants h5py mpi4py"])
    for name, values in figures.items():
        rss = statistics.median(values)
        print(f"| {name} | {rss:.1f} ({min(values):.1f}-{max(values):.1f}) | {rss - bare:+.1f} | {rss - used:+.1f} |")


if __name__ == "__main__":
    main()
