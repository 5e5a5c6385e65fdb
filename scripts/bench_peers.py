"""prbmrm against BMRM 2.1 (the authors' C++ code), side by side, stopped at the same absolute gap.

For each data set, lam and number of ranks, runs BMRM 2.1 (``linear-bmrm-train`` on one rank,
``parallel-bmrm-train`` under ``/usr/bin/mpiexec.mpich`` on more) and prbmrm (``python -m
prbmrm.cli.train`` under the pip ``mpiexec``; ``bmrm`` and the default solver, i.e. no
``--solver``) one after the other, interleaved so that the load of a busy machine hits both alike,
hinge loss, no bias, ``--epsilon GAP --rel-epsilon 0`` (BMRM 2.1: ``BMRM.epsilonTol GAP``). Prints
one markdown row per run: the 1-minute load average at its start, iterations, wall seconds, CPU
seconds and peak RSS of the process tree (``getrusage`` of the children), the final objective J, and prbmrm's ratios to BMRM 2.1
(iterations, wall seconds). Iterations are the figure load does not change. A BMRM 2.1 run that
fails (its parallel trainer now and then exits with 1 on a rank after converging) gets a row saying
so, and the round's prbmrm runs no ratios.

"solve s" is each program's own clock around its iterations (BMRM 2.1's "Wall-clock total", prbmrm's
last ``seconds_total`` in ``--log-json``, rank 0's): the wall seconds less it are start-up and
input (BMRM 2.1 parsing its text files; prbmrm's interpreter, imports, MPI and its shards) and
the end. In runs under a second that part is most of the difference.

prbmrm's modules are compiled to bytecode first (``compileall``), as an installed copy is. prbmrm runs
under this script's interpreter: run it with one whose start-up adds nothing (a venv, like the
baseline's), else a site hook (this machine's system Python imports certifi in one, 25-65 ms) is charged
to every prbmrm run and not to the baseline's.

``--baseline TREE`` adds, in every round after this tree's runs, the default solver of the prbmrm
checkout TREE (an earlier commit, e.g. ``git worktree add --detach TREE 4916440``) run by
``--baseline-python`` (an interpreter with that commit's dependencies) with TREE alone on its path,
on shards its own ``shard`` command wrote: the earlier package's ratios to BMRM 2.1 measured in the
same rounds. (A checkout that compiles its kernels at run time, as 4916440 did with numba, needs one
untimed run first to fill its cache, as an installed copy's would be.) A last table gives, per set, lam, ranks and run, the median wall ratio over the rounds.

BMRM 2.1 is built from ``../shared/peers/bmrm21-*.tar.xz`` into a temporary directory when ``g++``
exists (its parallel trainer when ``mpicxx`` does), unless ``--peer-dir`` / ``--peer-mpi-dir`` name
existing builds. Its data files (features and labels split, examples without features dropped, as
it rejects them) and prbmrm's shards are written to a temporary directory.

Usage (from the repository root, prbmrm on PYTHONPATH)::

    python scripts/bench_peers.py [--sets a9a w8a fashion] [--lams 1e-4 1e-5 1e-6] [--ranks 1 2]
        [--solvers bmrm default] [--gap 1e-4] [--repeat 1]
        [--peer-dir /work/peers/s/linear-bmrm] [--peer-mpi-dir /work/peers/m/linear-bmrm]
        [--baseline TREE --baseline-python PYTHON]
"""

import argparse
import json
import lzma
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(REPO / "scripts"))
from peer_build import build_peer  # noqa: E402 (the scripts directory is not a package)
MPIEXEC_PEER = "/usr/bin/mpiexec.mpich"
GNU_TIME = "/usr/bin/time"
TIMEOUT = 3600


def write_peer_data(source, out):
    """Split the SVMlight file `source` (xz or plain) into BMRM 2.1's feature and label files under `out`."""
    features, labels = out / "data.feat", out / "data.lab"
    opened = lzma.open(source, "rt") if source.suffix == ".xz" else open(source)
    with opened as lines, open(features, "w") as f, open(labels, "w") as g:
        for line in lines:
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[1].strip():
                g.write(parts[0] + "\n")
                f.write(parts[1].rstrip("\n") + "\n")
    return features, labels


def write_fashion(out, parts):
    """Fashion-MNIST (``bench_core.load_fashion``) as an SVMlight file and prbmrm's shards under `out`."""
    from sklearn.datasets import dump_svmlight_file

    from prbmrm.io import write_shards

    sys.path[:0] = [str(REPO), str(REPO / "scripts")]
    from bench_core import load_fashion

    X, y = load_fashion()
    if (X.getnnz(axis=1) == 0).any():  # BMRM 2.1 drops them: both must train on the same rows
        X, y = X[X.getnnz(axis=1) > 0], y[X.getnnz(axis=1) > 0]
    source = out / "fashion.svm"
    dump_svmlight_file(X, y, str(source), zero_based=False)
    write_shards(X, y, out / "shards", parts)
    return source


def peer_config(path, features, labels, lam, gap, max_iter):
    """Write BMRM 2.1's configuration for hinge loss, no bias, absolute gap `gap`."""
    path.write_text("\n".join([
        "string Solver.type BMRM", "int BMRM.verbosity 1", f"int BMRM.maxNumOfIter {max_iter}",
        f"double BMRM.epsilonTol {gap}", f"double BMRM.lambda {lam}",
        "string BMRM.innerSolverType L2N2_DaiFletcherPGM", "string Loss.lossFunctionType HINGE",
        "bool Loss.nonNegative true", "bool Data.bias false", "string Data.format VECTOR_LABEL_VECTOR_FEATURE",
        f"string Data.featureFile {features}", f"string Data.labelFile {labels}",
        f"string Model.modelFile {path.with_suffix('.model')}", ""]))


def measure(command, cwd, env=None):
    """Run `command` (in `env`, default this environment); return (stdout, wall seconds, CPU seconds, peak RSS
    in MB, load) of its process tree.

    The load is the 1-minute load average of the machine when the run started.

    The peak RSS is GNU time's (``/usr/bin/time``: the largest process of the tree) where it exists;
    otherwise getrusage's, which only shows a rise over the earlier children.
    """
    rss_file = Path(cwd) / "rss.txt"
    if os.path.exists(GNU_TIME):
        command = [GNU_TIME, "-f", "%M", "-o", str(rss_file), *command]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=TIMEOUT, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if os.path.exists(GNU_TIME):
        rss = float(rss_file.read_text().split()[-1]) / 1024.0
    else:  # the children's ru_maxrss is the largest so far: only a rise is this run's
        rss = after.ru_maxrss / 1024.0 if after.ru_maxrss > before.ru_maxrss else None
    return done.stdout, wall, cpu, rss, load


def run_peer(trainer, ranks, config, cwd):
    """Run BMRM 2.1; return its figures."""
    command = [str(trainer), str(config)]
    if ranks > 1:
        command = [MPIEXEC_PEER, "-n", str(ranks), *command]
    out, wall, cpu, rss, load = measure(command, cwd)
    iterations = int(re.search(r"No\. of iterations:\s*(\d+)", out).group(1))
    objective = float(re.search(r"Primal obj\. val\.:\s*(\S+)", out).group(1))
    solve = float(re.search(r"Wall-clock total:\s*(\S+)", out).group(1))
    return {"iterations": iterations, "wall": wall, "cpu": cpu, "rss": rss, "J": objective, "load": load,
            "solve": solve}


def mpiexec():
    """The mpiexec of the mpich wheel, beside the interpreter the 1-rank runs use (or the one on PATH).

    Not PATH's first: under pyenv that is a shim, a bash script that finds the interpreter's
    mpiexec each time, 60 ms more per run than the 1-rank runs pay.
    """
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else shutil.which("mpiexec")


class Baseline:
    """An earlier prbmrm checkout `tree` run by the interpreter `python` (``--baseline``)."""

    def __init__(self, tree, python):
        self.tree, self.python = Path(tree).resolve(), python
        self.commit = subprocess.run(["git", "-C", str(self.tree), "rev-parse", "--short", "HEAD"], check=True,
                                     capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout.strip()
        # earlier commits kept the commands at the package's top level (prbmrm.train, prbmrm.shard)
        self.package = "prbmrm.cli." if (self.tree / "prbmrm" / "cli" / "train.py").exists() else "prbmrm."
        self.env = dict(os.environ, PYTHONPATH=str(self.tree))
        subprocess.run([python, "-m", "compileall", "-q", str(self.tree / "prbmrm")], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def shard(self, source, parts, out):
        """Write `source`'s shards with the checkout's own command (run beside them: ``-m`` puts the working
        directory first on the path, which must not hold another prbmrm)."""
        subprocess.run([self.python, "-m", self.package + "shard", str(source), "--parts", str(parts), "--out",
                        str(out), "--quiet"], check=True, stdin=subprocess.DEVNULL, env=self.env, cwd=Path(out).parent)


def run_prbmrm(shards, ranks, lam, gap, solver, max_iter, cwd, baseline=None):
    """Run ``python -m prbmrm.cli.train`` on `ranks` ranks (`solver` None: the default), or the `baseline`
    checkout's training command; return its figures."""
    log = Path(cwd) / "log.jsonl"
    if log.exists():
        log.unlink()
    python, module = (sys.executable, "prbmrm.cli.train") if baseline is None else (
        baseline.python, baseline.package + "train")
    command = [python, "-m", module, "--data", str(shards), "--loss", "hinge",
               "--lam", repr(lam), "--epsilon", repr(gap), "--rel-epsilon", "0", "--max-iter", str(max_iter),
               "--out", str(Path(cwd) / "model.h5"), "--log-json", str(log), "--quiet"]
    if solver is not None:
        command += ["--solver", solver]
    if ranks > 1:
        command = [mpiexec(), "-n", str(ranks), *command]
    _, wall, cpu, rss, load = measure(command, cwd, None if baseline is None else baseline.env)
    last = json.loads(log.read_text().splitlines()[-1])
    return {"iterations": int(last["iteration"]), "wall": wall, "cpu": cpu, "rss": rss,
            "J": float(last["best_objective"]), "load": load, "solve": float(last["seconds_total"])}


def row(name, lam, ranks, label, figures, peer):
    """One markdown row; the ratios to BMRM 2.1 for prbmrm's runs."""
    rss = "-" if figures["rss"] is None else f"{figures['rss']:.0f}"
    cells = [name, f"{lam:.0e}", str(ranks), label, f"{figures['load']:.1f}", f"{figures['iterations']:,}",
             f"{figures['wall']:.2f}", f"{figures['solve']:.2f}",
             f"{figures['cpu']:.2f}", rss, f"{figures['J']:.7f}"]
    if peer is None or figures is peer:
        cells += ["", ""]
    else:
        cells += [f"{figures['iterations'] / peer['iterations']:.2f}", f"{figures['wall'] / peer['wall']:.2f}"]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| set | lam | ranks | run | load | iterations | wall s | solve s | CPU s | peak RSS MB | J | iter ratio "
          "| wall ratio |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["a9a", "w8a"],
                        help="data sets of ../shared/data (name.xz), or fashion: Fashion-MNIST, classes 0-4 "
                             "against 5-9, from the Debian package dataset-fashion-mnist")
    parser.add_argument("--lams", nargs="+", type=float, default=[1e-4, 1e-5, 1e-6])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--solvers", nargs="+", default=["bmrm", "default"],
                        help="prbmrm solvers to run ('default': no --solver)")
    parser.add_argument("--gap", type=float, default=1e-4, help="absolute gap both stop at (default 1e-4)")
    parser.add_argument("--max-iter", type=int, default=100000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, interleaved (default 1)")
    parser.add_argument("--peer-dir", help="directory of a built linear-bmrm-train (default: build one)")
    parser.add_argument("--peer-mpi-dir", help="directory of a built parallel-bmrm-train (default: build one)")
    parser.add_argument("--data-dir", default=str(SHARED / "data"))
    parser.add_argument("--skip-peer", action="store_true", help="run prbmrm alone (e.g. to repeat its runs)")
    parser.add_argument("--baseline", metavar="TREE", help="also run the default solver of this earlier prbmrm "
                        "checkout in every round")
    parser.add_argument("--baseline-python", default=sys.executable, metavar="PYTHON",
                        help="the interpreter that runs --baseline (default: this one)")
    args = parser.parse_args(argv)
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{env_path}" if env_path else str(REPO)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # As pip install does: else, with PYTHONDONTWRITEBYTECODE set, every run compiles the package's
    # modules from source (~0.15 s of CPU a run that no installed copy spends).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "prbmrm")], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as work:
        work = Path(work)
        serial = parallel = None
        if not args.skip_peer:
            serial = Path(args.peer_dir) if args.peer_dir else build_peer(work, mpi=False)
            parallel = Path(args.peer_mpi_dir) if args.peer_mpi_dir else (
                build_peer(work, mpi=True) if max(args.ranks) > 1 else None)
        if serial is None and not args.skip_peer:
            print("BMRM 2.1 not available (no g++ or no ../shared/peers/bmrm21-*.tar.xz): prbmrm alone")
        baseline = Baseline(args.baseline, args.baseline_python) if args.baseline else None
        ratios = {}  # (set, lam, ranks, run) -> wall ratios to BMRM 2.1 over the rounds
        print(HEADER, flush=True)
        for name in args.sets:
            data = work / name
            data.mkdir()
            shards = data / "shards"
            if name == "fashion":
                source = write_fashion(data, max(args.ranks))
            else:
                source = Path(args.data_dir) / f"{name}.xz"
                subprocess.run([sys.executable, "-m", "prbmrm.cli.shard", str(source), "--parts", str(max(args.ranks)),
                                "--out", str(shards), "--quiet"], check=True, stdin=subprocess.DEVNULL)
            if baseline is not None:
                baseline.shard(source, max(args.ranks), data / "baseline-shards")
            features, labels = write_peer_data(source, data)
            for lam in args.lams:
                config = data / f"lam{lam:g}.cfg"
                peer_config(config, features, labels, lam, args.gap, args.max_iter)
                for ranks in args.ranks:
                    trainer = None
                    if ranks == 1 and serial is not None:
                        trainer = serial / "linear-bmrm-train"
                    elif ranks > 1 and parallel is not None:
                        trainer = parallel / "parallel-bmrm-train"
                    for _ in range(args.repeat):
                        peer = None
                        try:
                            peer = None if trainer is None else run_peer(trainer, ranks, config, data)
                        except RuntimeError as error:  # its parallel trainer sometimes ends a converged run with 1
                            print(f"| {name} | {lam:.0e} | {ranks} | BMRM 2.1 failed: "
                                  f"{str(error).splitlines()[0][-80:]} |", flush=True)
                        if peer is not None:
                            print(row(name, lam, ranks, "BMRM 2.1", peer, peer), flush=True)
                        runs = [(solver, None) for solver in args.solvers] + (
                            [] if baseline is None else [("default", baseline)])
                        for solver, tree in runs:
                            figures = run_prbmrm(data / "baseline-shards" if tree else shards, ranks, lam,
                                                 args.gap, None if solver == "default" else solver, args.max_iter,
                                                 data, tree)
                            label = "prbmrm default" if solver == "default" else f"prbmrm {solver}"
                            if tree is not None:
                                label += f" at {tree.commit}"
                            print(row(name, lam, ranks, label, figures, peer), flush=True)
                            if peer is not None:
                                ratios.setdefault((name, lam, ranks, label), []).append(
                                    figures["wall"] / peer["wall"])
        if ratios:
            print("\n| set | lam | ranks | run | wall ratios to BMRM 2.1 | median |\n| --- | --- | --- | --- | --- | --- |")
            for (name, lam, ranks, label), values in ratios.items():
                print(f"| {name} | {lam:.0e} | {ranks} | {label} | {' / '.join(f'{v:.2f}' for v in values)} "
                      f"| {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
