"""prbmrm's default solver against LIBLINEAR: time to the same certified objective, 1 thread, interleaved.

For each data set, loss (hinge, logistic) and lam, one round runs:

- prbmrm's default (no ``--solver``), ``--epsilon 1e-4 --rel-epsilon 0``, as a whole process
  (``python -m prbmrm.cli.train`` on the data's HDF5 shards): its own clock (the model history's
  ``seconds_total``) and the whole process's wall and CPU seconds (start-up and reading the shards included).
  The shards are made once per set by ``python -m prbmrm.cli.shard`` from the svmlight file LIBLINEAR reads;
  that conversion is timed apart and printed under the table (a one-time step, as LIBLINEAR's own binary
  caches would be; its time is not in the process times);
- LIBLINEAR 2.x (the ``liblinear-official`` package's ``train()`` call on the problem in memory, timed: "without
  input"; C = 1 / (lam m), no bias): ``-s 3`` (dual coordinate descent) for the hinge, ``-s 0`` (trust-region
  Newton) and ``-s 7`` (dual) for the logistic loss, each from its default eps tightened tenfold until its
  primal objective is within 1e-4 of a certified lower bound of min J (the best bound of a tight prbmrm run
  made before the rounds, not timed); the fastest solver that gets there is reported, with its eps. A solver
  that never gets within 1e-4 (eps down to 1e-6) is reported as such;
- LIBLINEAR's whole run ("with input"): its ``train`` command-line program (``--train-program``) reading the
  svmlight file and training at the same solver and eps (its model read back and checked within 1e-4).

Rounds interleave the programs (prbmrm, then LIBLINEAR, per case); the table shows medians over the rounds,
the ratios prbmrm own / LIBLINEAR's train() and prbmrm process / LIBLINEAR's whole run, and the 1-minute load
average at the case's last round. BLAS and OpenMP are held to one thread in both.

Data sets: ``a9a`` and ``kddcup99`` (``$PRBMRM_DATA``); ``dense-standin``, a dense set of Fashion-MNIST's
shape (60,000 x 784; ``--dense-rows``), generated with a fixed seed by :func:`dense_standin` because
Fashion-MNIST is not available offline; ``planted5m``, a planted sparse set (``--planted-rows`` rows, default
5,000,000 with ``--full``, 200,000 otherwise; 1,000 features, 10 nonzeros per row, values +-[1, 2] with three
decimals, labels from a random w plus noise), also on 2 ranks (mpiexec) with the ratio 2-rank / 1-rank time
(own and process) at the first lam. The generated sets are written as svmlight text with
:func:`write_svmlight`; ``--work DIR`` keeps the text files and shards for later runs.

The quick mode (the default; the machine is shared) runs a9a, one round; ``--full`` runs every set and
three rounds.

Usage (from the repository root)::

    PYTHONPATH=$PWD PRBMRM_DATA=/work/shared/data python scripts/bench_liblinear.py [--full]
        [--sets a9a kddcup99 dense-standin planted5m] [--losses hinge logistic] [--lams 1e-4 1e-5 1e-6]
        [--rounds 3] [--work DIR] [--train-program PATH/TO/liblinear/train] [--no-ranks | --ranks-only]
"""

import argparse
import lzma
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import numpy as np  # noqa: E402

TARGET = 1e-4
EPS_START = {"3": 0.1, "0": 0.01, "7": 0.1}
SOLVERS = {"hinge": ["3"], "logistic": ["0", "7"]}
SETS = ("a9a", "kddcup99", "dense-standin", "planted5m")


def planted(rows, d=1000, per_row=10, seed=0):
    """A planted sparse set: `per_row` nonzeros +-[1, 2] (3 decimals) per row, labels sign(<w, x> + noise)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    indices = rng.integers(0, d, size=(rows, per_row))
    indices.sort(axis=1)
    # Three decimals, as in a typical svmlight file: LIBLINEAR's input is short text, not 17 digits a value.
    values = rng.choice([-1.0, 1.0], size=(rows, per_row)) * rng.uniform(1.0, 2.0, size=(rows, per_row)).round(3)
    X = sp.csr_matrix((values.ravel(), indices.ravel(), np.arange(0, rows * per_row + 1, per_row)), shape=(rows, d))
    X.sum_duplicates()
    X.data = X.data.round(3)  # a column drawn twice in a row holds the sum: three decimals again
    X.eliminate_zeros()
    w = rng.normal(size=d)
    f = X @ w
    y = np.where(f + 0.5 * np.std(f) * rng.normal(size=rows) > 0, 1.0, -1.0)
    return X, y


def dense_standin(rows=60_000, d=784, rank=16, seed=0):
    """A dense stand-in of Fashion-MNIST's shape (Fashion-MNIST itself is not available offline).

    Every entry in (0, 1) with 3 decimals, like scaled pixels, correlated as images are (a sigmoid of
    `rank` random factors plus noise); labels sign(<w, x> - median + noise) for a random w.
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, rank)) @ rng.normal(size=(rank, d)) / np.sqrt(rank)
    X += 0.5 * rng.normal(size=(rows, d))
    X = np.clip((1.0 / (1.0 + np.exp(-X))).round(3), 0.001, 0.999)
    f = X @ rng.normal(size=d)
    y = np.where(f - np.median(f) + 0.5 * np.std(f) * rng.normal(size=rows) > 0, 1.0, -1.0)
    return X, y


def write_svmlight(X, y, path):
    """Write (X, y) as svmlight text, 1-based, values with at most 4 significant digits (those of the sets here)."""
    import scipy.sparse as sp

    formats = {}
    chunk = max(1, 2**20 * X.shape[0] // max(1, X.size if sp.issparse(X) else X.shape[0] * X.shape[1]))
    with open(path, "w") as f:
        for lo in range(0, X.shape[0], chunk):
            block = sp.csr_matrix(X[lo:lo + chunk])
            pairs = np.empty(2 * block.nnz)
            pairs[0::2], pairs[1::2] = block.indices + 1, block.data
            pairs, indptr = pairs.tolist(), (2 * block.indptr).tolist()
            lines = []
            for i, label in enumerate(y[lo:lo + chunk].tolist()):
                k = indptr[i + 1] - indptr[i]
                if k not in formats:
                    formats[k] = "%d" + " %d:%.4g" * (k // 2) + "\n"
                lines.append(formats[k] % (label, *pairs[indptr[i]:indptr[i + 1]]))
            f.write("".join(lines))


def objective(X, y, w, loss, lam):
    z = y * (X @ w)
    risk = np.maximum(0.0, 1.0 - z) if loss == "hinge" else np.logaddexp(0.0, -z)
    return 0.5 * lam * float(w @ w) + float(np.mean(risk))


def run_prbmrm(shards, loss, lam, ranks=1, epsilon=TARGET, solver=None):
    """One whole prbmrm process; returns (own seconds, process seconds, iterations, objective, lower bound, status,
    process CPU seconds, phases): phases are the history's risk, subproblem and comm seconds summed, reading
    (the run's seconds before its first iteration: loading the shards) and the rest of the process (start-up, the
    model written)."""
    from prbmrm.model import load_model

    with tempfile.TemporaryDirectory() as out:
        model = os.path.join(out, "m.h5")
        command = [sys.executable, "-m", "prbmrm.cli.train", "--data", shards, "--loss", loss, "--lam", repr(lam),
                   "--epsilon", repr(epsilon), "--rel-epsilon", "0", "--quiet", "--out", model]
        if solver:
            command += ["--solver", solver]
        if ranks > 1:
            command = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks)] + command
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=3600)
        process = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if done.returncode != 0:
            raise RuntimeError(f"prbmrm failed: {done.stderr[-2000:]}")
        m = load_model(model)
        own = float(m.history["seconds_total"][-1])
        phases = {name: float(np.sum(m.history[f"seconds_{name}"])) for name in ("risk", "subproblem", "comm")}
        phases.update(reading=float(m.attrs["seconds"]) - own, rest=process - float(m.attrs["seconds"]))
        return (own, process, int(m.attrs["iterations"]), float(m.attrs["objective"]), float(m.attrs["lower_bound"]),
                int(m.attrs["status"]), cpu, phases)


def run_liblinear(problem, X, y, loss, lam, bound, solver, eps):
    """One LIBLINEAR train(); returns ((seconds, CPU seconds), objective, within the target)."""
    from liblinear import liblinearutil

    C = 1.0 / (lam * X.shape[0])
    started, cpu = time.perf_counter(), time.process_time()
    model = liblinearutil.train(problem, liblinearutil.parameter(f"-s {solver} -c {C!r} -e {eps!r} -q"))
    seconds = (time.perf_counter() - started, time.process_time() - cpu)
    w = np.array([model.w[i] for i in range(X.shape[1])])
    if model.label[0] != 1:
        w = -w
    value = objective(X, y, w, loss, lam)
    return seconds, value, value - bound <= TARGET


def liblinear_settings(problem, X, y, loss, lam, bound):
    """For each LIBLINEAR solver of `loss`: the largest eps (tenfold steps) within the target, or None."""
    found = {}
    for solver in SOLVERS[loss]:
        eps = EPS_START[solver]
        found[solver] = None
        while eps >= 1e-6:
            if run_liblinear(problem, X, y, loss, lam, bound, solver, eps)[2]:
                found[solver] = eps
                break
            eps /= 10
    return found


def liblinear_whole(program, path, lam, rows, solver, eps, features):
    """LIBLINEAR's whole run: its `train` program reading the svmlight file and training (the model written to a
    temporary file); returns ((wall seconds, CPU seconds), w)."""
    with tempfile.TemporaryDirectory() as out:
        model = os.path.join(out, "model")
        command = [program, "-s", solver, "-c", repr(1.0 / (lam * rows)), "-e", repr(eps), "-q", path, model]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=3600)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"LIBLINEAR's train failed: {done.stderr[-2000:]}")
        return (seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime), read_liblinear_w(
            model, features)


def read_liblinear_w(path, features):
    """The weights of a LIBLINEAR model file of a binary problem, signed for the label +1 (no bias)."""
    with open(path) as f:
        lines = f.read().split("\n")
    labels = next(line for line in lines if line.startswith("label ")).split()[1:]
    start = lines.index("w") + 1
    w = np.zeros(features)
    values = np.array([float(line) for line in lines[start:] if line.strip()])
    w[:values.size] = values
    return w if labels[0] == "1" else -w


def svmlight_copy(name, rows, dense_rows, work):
    """The set as an svmlight text file in `work` (made once, then reused): the shared data decompressed, or the
    generated sets written with :func:`write_svmlight`, named for their rows unless of the full size."""
    size = {"planted5m": (rows, 5_000_000), "dense-standin": (dense_rows, 60_000)}.get(name, (0, 0))
    stem = name if size[0] == size[1] else f"{name}-{size[0]}"
    path = os.path.join(work, f"{stem}.svm")
    if not os.path.exists(path):
        partial = path + ".partial"
        if name in ("a9a", "kddcup99"):
            file = {"a9a": "a9a.xz", "kddcup99": "kddcup99_10pct.binary.xz"}[name]
            with lzma.open(os.path.join(os.environ.get("PRBMRM_DATA", "/work/shared/data"), file)) as f, \
                    open(partial, "wb") as out:
                while block := f.read(2**24):
                    out.write(block)
        else:
            X, y = planted(rows) if name == "planted5m" else dense_standin(dense_rows)
            write_svmlight(X, y, partial)
        os.replace(partial, path)
    return path


def make_shards(path, shards, parts):
    """`python -m prbmrm.cli.shard` on the svmlight file (once; reused if there); returns its wall seconds or
    None when reused."""
    if os.path.exists(shards):
        return None
    import shutil

    partial = shards + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "prbmrm.cli.shard", path, "--parts", str(parts), "--out", partial,
                           "--quiet"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"prbmrm.cli.shard failed: {done.stderr[-2000:]}")
    os.replace(partial, shards)
    return seconds


def train_program(given):
    """LIBLINEAR's `train` command-line program: `given`, else $LIBLINEAR_TRAIN, else `train` on PATH, else None."""
    import shutil

    return given or os.environ.get("LIBLINEAR_TRAIN") or shutil.which("train")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="every data set, three rounds")
    parser.add_argument("--sets", nargs="+", choices=SETS)
    parser.add_argument("--losses", nargs="+", default=["hinge", "logistic"])
    parser.add_argument("--lams", nargs="+", type=float, default=[1e-4, 1e-5, 1e-6])
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--planted-rows", type=int)
    parser.add_argument("--dense-rows", type=int, help="rows of the dense stand-in (default 60,000)")
    parser.add_argument("--work", help="keep the svmlight files and shards here, reused by later runs "
                                       "(default: a temporary directory)")
    parser.add_argument("--train-program", help="LIBLINEAR's train program (default $LIBLINEAR_TRAIN, else train "
                                                "on PATH; without one the whole-run columns are n/a)")
    ranks = parser.add_mutually_exclusive_group()
    ranks.add_argument("--no-ranks", action="store_true", help="skip planted5m's 1-rank / 2-rank comparison")
    ranks.add_argument("--ranks-only", action="store_true", help="only planted5m's 1-rank / 2-rank comparison")
    args = parser.parse_args(argv)
    sets = args.sets or (list(SETS) if args.full else ["a9a"])
    rounds = args.rounds or (3 if args.full else 1)
    rows = args.planted_rows or (5_000_000 if args.full else 200_000)
    dense_rows = args.dense_rows or 60_000
    program = train_program(args.train_program)
    from sklearn.datasets import load_svmlight_file
    from liblinear import liblinearutil

    print("dense-standin: a stand-in of Fashion-MNIST's shape (Fashion-MNIST is not available offline), generated "
          "with a fixed seed (dense_standin).")
    print(f"LIBLINEAR whole run: {program or 'n/a (no train program)'} reading the svmlight file and training; "
          "LIBLINEAR s: liblinear-official's train() call on the problem in memory.")
    print("| set | loss | lam | prbmrm default: iterations / own s / process s (process CPU s) "
          "| LIBLINEAR: solver, eps, s (CPU s) | LIBLINEAR whole run s (CPU s) | prbmrm own / LIBLINEAR "
          "| prbmrm process / LIBLINEAR whole run | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    notes = []
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or scratch
        os.makedirs(work, exist_ok=True)
        for name in sets:
            path = svmlight_copy(name, rows, dense_rows, work)
            parts = 2 if name in ("planted5m", "dense-standin") else 1
            shards = path[:-len(".svm")] + "-shards"
            seconds = make_shards(path, shards, parts)
            note = len(notes)
            notes.append(f"{name}: `prbmrm shard` into {parts} part(s): "
                         + (f"{seconds:.1f} s" if seconds is not None else "reused from --work")
                         + " (a one-time conversion, not in the process times)")
            if name == "planted5m" and not args.no_ranks:
                for loss in args.losses:
                    lam = args.lams[0]
                    one = [run_prbmrm(shards, loss, lam, ranks=r) for _ in range(rounds) for r in (1, 2)]
                    single = statistics.median(r[0] for r in one[0::2])
                    double = statistics.median(r[0] for r in one[1::2])
                    wall1 = statistics.median(r[1] for r in one[0::2])
                    wall2 = statistics.median(r[1] for r in one[1::2])
                    phases = [", ".join(f"{phase} {statistics.median(r[7][phase] for r in runs):.2f}"
                                        for phase in runs[0][7]) for runs in (one[0::2], one[1::2])]
                    # Under the table (these runs come before its cases): own and process time, then the phases.
                    notes.append(f"{name} {loss} lam {lam:g}: own seconds 1 rank {single:.2f}, 2 ranks {double:.2f}, "
                                 f"ratio {double / single:.2f}; process seconds {wall1:.2f} and {wall2:.2f}, ratio "
                                 f"{wall2 / wall1:.2f}; process CPU seconds (all ranks) "
                                 f"{statistics.median(r[6] for r in one[0::2]):.2f} and "
                                 f"{statistics.median(r[6] for r in one[1::2]):.2f}; phases (rank 0's seconds) "
                                 f"1 rank: {phases[0]}; 2 ranks: {phases[1]} (load {os.getloadavg()[0]:.1f})")
            if args.ranks_only:
                continue
            X, y = load_svmlight_file(path)
            X, y = X.tocsr(), np.where(y > 0, 1.0, -1.0)
            notes[note] += f"; {X.shape[0]:,} x {X.shape[1]:,}, {X.nnz:,} nonzeros"
            problem = liblinearutil.problem(y, X)
            for loss in args.losses:
                for lam in args.lams:
                    # A certified bound of min J, not timed: a tight prbmrm run.
                    bound = run_prbmrm(shards, loss, lam, epsilon=1e-7 if loss == "logistic" else 1e-6)[4]
                    settings = liblinear_settings(problem, X, y, loss, lam, bound)
                    ours, theirs = [], {solver: [] for solver, eps in settings.items() if eps is not None}
                    whole = {solver: [] for solver in theirs}
                    for _ in range(rounds):
                        ours.append(run_prbmrm(shards, loss, lam))
                        for solver in theirs:
                            theirs[solver].append(run_liblinear(problem, X, y, loss, lam, bound, solver,
                                                                settings[solver])[0])
                            if program:
                                timing, w = liblinear_whole(program, path, lam, X.shape[0], solver, settings[solver],
                                                            X.shape[1])
                                # The program reads the text (rounded values): its run may miss the target
                                # where train() on the same eps did not; then it is not a whole run to the target.
                                missed = objective(X, y, w, loss, lam) - bound > TARGET
                                whole[solver].append(None if missed else timing)
                    own = statistics.median(r[0] for r in ours)
                    process = statistics.median(r[1] for r in ours)
                    process_cpu = statistics.median(r[6] for r in ours)
                    iterations = ours[-1][2]
                    reached = all(r[5] in (0, 1) for r in ours)
                    peer_whole = ratio_whole = "n/a"
                    if theirs:
                        solver = min(theirs, key=lambda s: statistics.median(t[0] for t in theirs[s]))
                        seconds = statistics.median(t[0] for t in theirs[solver])
                        cpu = statistics.median(t[1] for t in theirs[solver])
                        peer = f"-s {solver}, eps {settings[solver]:g}: {seconds:.3f} ({cpu:.3f})"
                        ratio = f"{own / seconds:.2f}x"
                        reaching = {s: runs for s, runs in whole.items() if runs and None not in runs}
                        if reaching:
                            fastest = min(reaching, key=lambda s: statistics.median(t[0] for t in reaching[s]))
                            wall = statistics.median(t[0] for t in reaching[fastest])
                            peer_whole = (f"-s {fastest}: {wall:.2f} "
                                          f"({statistics.median(t[1] for t in reaching[fastest]):.2f})")
                            ratio_whole = f"{process / wall:.2f}x"
                        elif program:
                            peer_whole = f"-s {', '.join(whole)} at that eps: missed the target from the text"
                    else:
                        peer = "never within 1e-4 (eps down to 1e-6)"
                        ratio = "only prbmrm gets there" if reached else "neither gets there"
                        ratio_whole = ratio if program else "n/a"
                    mark = "" if reached else " (gap not reached)"
                    print(f"| {name} | {loss} | {lam:g} | {iterations} / {own:.3f} / {process:.2f} "
                          f"({process_cpu:.2f}){mark} "
                          f"| {peer} | {peer_whole} "
                          f"| {ratio} | {ratio_whole} | {os.getloadavg()[0]:.1f} |", flush=True)
    print("\n".join(notes))


if __name__ == "__main__":
    main()
