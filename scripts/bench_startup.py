"""A rank's start-up in CPU seconds, step by step, beside a process that only imports its dependencies.

Issue 26 asks for at most 0.3 CPU s per rank before the first iteration. On
a9a (``--data``: an SVMlight file, sharded here in ``--parts`` files), for
each P of ``--ranks``, alternated round by round so that load on the
machine hits all alike, every rank of four ``mpiexec -n P`` jobs reports its
CPU seconds (user + system, getrusage of the process, threads included):

- ``bare``: ``python -c "import numpy, scipy.sparse, h5py; from mpi4py import MPI"``,
  the floor any rank of an MPI Python program on these libraries pays;
- ``steps``: the start-up of a rank in steps, each the CPU since the one
  before: the interpreter (start to the first statement), numpy, scipy.sparse
  and h5py (after ``import prbmrm.cli``, as in the command, which defers the
  numpy modules scipy.sparse would load: :mod:`prbmrm.cli.deferred`), mpi4py
  (the import calls MPI_Init_thread), prbmrm's modules (the training command
  and what it imports; scipy.linalg only where rank 0 first needs LAPACK), the
  communicator (:func:`prbmrm.distributed.comm.get_comm`: a duplicate
  communicator and the watch thread) and the reading of the rank's shard
  (:func:`prbmrm.io.inputs.load_input`);
- ``train 1`` and ``train 11``: the users' command, ``python -m prbmrm.train``
  (hinge, lam 1e-4, the default solver) stopped after 1 and after 11
  iterations, CPU at exit. A tenth of their difference is one iteration;
  ``train 1`` less one iteration is the start-up, the exit (rank 0 writes
  the model, the watch thread is joined) included: an upper bound of the
  start-up. Less the steps above, it is the set-up inside
  :func:`prbmrm.training.fit` (the options, the loss, the oracle's plan, the
  solver) and the exit.

Printed: per P and job, the median over ranks and rounds, with the range,
and the load average of each round; then one rank's ``python -X importtime``
of the training command's imports, self times summed by top-level package
(wall microseconds, so load inflates them: read the shares).

    python scripts/bench_startup.py [--ranks 1 2 8] [--repeats 3] [--data a9a.xz] [--parts 8]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data", "a9a.xz")
sys.path.insert(0, HERE)
from bench_scale import commit  # noqa: E402  (one commit line for the benchmarks)

# Each rank of a job writes its (label, CPU seconds so far) marks to cpu-RANK.json.
PRELUDE = """import json as _json, os as _os, resource as _resource
def _cpu():
    usage = _resource.getrusage(_resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
_marks = [("interpreter", _cpu())]
def _mark(label):
    _marks.append((label, _cpu()))
def _report():
    rank = next((_os.environ[name] for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
                 if name in _os.environ), "0")
    with open("cpu-" + rank + ".json", "w") as _file:
        _json.dump(_marks, _file)
"""

BARE = """import numpy, scipy.sparse, h5py
from mpi4py import MPI
_mark("imports")
_report()
"""

STEPS = """import prbmrm.cli  # first, as in the command: it defers numpy modules scipy.sparse would load
import numpy, scipy.sparse, h5py
_mark("numpy, scipy.sparse, h5py")
from mpi4py import MPI
_mark("mpi4py (MPI_Init)")
import prbmrm.cli.train
_mark("prbmrm's modules")
from prbmrm.distributed.comm import get_comm
comm = get_comm()
_mark("communicator")
from prbmrm.io.inputs import load_input
local = load_input({data!r}, comm)
_mark("read the shard")
_report()
"""

TRAIN = """import atexit, runpy, sys
atexit.register(lambda: (_mark("exit"), _report()))
sys.argv = ["prbmrm.train"] + {argv!r}
runpy.run_module("prbmrm.train", run_name="__main__", alter_sys=True)
"""


def job(ranks, code, cwd):
    """Run `code` on `ranks` ranks; each rank's marks, in rank order."""
    for name in os.listdir(cwd):
        if name.startswith("cpu-"):
            os.remove(os.path.join(cwd, name))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(ranks), sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=600, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    if done.returncode != 0:
        sys.exit(f"bench_startup: {' '.join(command[:4])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found = []
    for rank in range(ranks):
        try:
            with open(os.path.join(cwd, f"cpu-{rank}.json")) as f:
                found.append(json.load(f))
        except OSError:
            sys.exit(f"bench_startup: rank {rank} of {ranks} did not report:\n{done.stderr[-2000:]}")
    return found


def steps(marks):
    """The CPU seconds of each step (since the mark before), then the total."""
    return [(label, now - before) for (_, before), (label, now) in zip([("", 0.0)] + marks[:-1], marks)] + \
        [("total", marks[-1][1])]


def startup_row(ranks, bare, steps_total, train_1, train_11):
    """The table's row of the start-up: `train_1` less one iteration (a tenth of `train_11` less `train_1`)."""
    one = (train_11 - train_1) / 10
    startup = train_1 - one
    return (f"| {ranks} | train 1 less one iteration ({1e3 * one:.1f} ms) | start-up and exit (set-up and exit: "
            f"{startup - steps_total:+.3f} s over the steps) | {startup:.3f} ({startup - bare:+.3f} s over bare, "
            f"{startup / bare:.2f}x) |")


def importtime(workdir):
    """Self microseconds of the training command's imports, summed by top-level package (one process)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import prbmrm.cli.train"], capture_output=True,
                          text=True, cwd=workdir, timeout=120, stdin=subprocess.DEVNULL, check=True)
    groups = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line.split(":", 1)[1].split("|")
        package = name.strip().split(".")[0]
        groups[package] = groups.get(package, 0) + int(own)
    return sorted(groups.items(), key=lambda item: -item[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--data", default=DATA, help="an SVMlight file (default a9a)")
    parser.add_argument("--parts", type=int, default=8, help="shard files (at least the largest P)")
    args = parser.parse_args()
    if args.parts < max(args.ranks):
        sys.exit("bench_startup: --parts must be at least the largest of --ranks")

    import prbmrm
    from prbmrm.io import read_input, write_shards

    workdir = tempfile.mkdtemp(prefix="bench-startup-")
    try:
        shards = os.path.join(workdir, "shards")
        X, y, _ = read_input(args.data)
        write_shards(X, y, shards, args.parts)
        train = ["--data", shards, "--loss", "hinge", "--lam", "1e-4", "--quiet", "--out", "model.h5"]
        jobs = {"bare": PRELUDE + BARE, "steps": PRELUDE + STEPS.format(data=shards),
                "train 1": PRELUDE + TRAIN.format(argv=train + ["--max-iter", "1"]),
                "train 11": PRELUDE + TRAIN.format(argv=train + ["--max-iter", "11"])}
        seen = {}  # (P, job) -> per step, the seconds of every rank of every round
        loads = {}
        for _ in range(args.repeats):
            for ranks in args.ranks:
                loads.setdefault(ranks, []).append(os.getloadavg()[0])
                for name, code in jobs.items():
                    for marks in job(ranks, code, workdir):
                        for label, seconds in steps(marks):
                            seen.setdefault((ranks, name), {}).setdefault(label, []).append(seconds)
        pattern = importtime(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()[0]

    def cell(values):
        return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    print(f"## bench_startup: a rank's CPU seconds before its first iteration, {os.path.basename(args.data)} "
          f"in {args.parts} shards\n")
    print(f"- command: `{' '.join([os.path.basename(sys.executable)] + sys.argv)}`")
    print(f"- prbmrm {prbmrm.__version__} from {os.path.dirname(prbmrm.__file__)}; commit {commit()}")
    print(f"- {os.cpu_count()} cores; load average (1 min) per round: "
          + "; ".join(f"P={p}: {', '.join(f'{v:.1f}' for v in loads[p])}" for p in args.ranks)
          + f"; at the end {load:.1f}")
    print("- CPU s per rank (user + system), median over ranks and rounds (range)\n")
    print("| P | job | step | CPU s |")
    print("| --- | --- | --- | --- |")
    for ranks in args.ranks:
        for name in jobs:
            for label, values in seen[(ranks, name)].items():
                if name.startswith("train") and label != "total":
                    continue
                print(f"| {ranks} | {name} | {label} | {cell(values)} |")
        print(startup_row(ranks, *(statistics.median(seen[(ranks, name)]["total"])
                                   for name in ("bare", "steps", "train 1", "train 11"))))
    total = sum(us for _, us in pattern)
    print(f"\n`python -X importtime -c 'import prbmrm.cli.train'` (one process, load {load:.1f}): "
          f"{total / 1e3:.0f} ms of imports, self times by top-level package:\n")
    print("| package | ms | share |")
    print("| --- | --- | --- |")
    for package, us in pattern[:15]:
        print(f"| {package} | {us / 1e3:.1f} | {us / total:.0%} |")


if __name__ == "__main__":
    main()
