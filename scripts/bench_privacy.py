"""Benchmark party mode: the per-iteration cost of secure aggregation, and what differential privacy costs in accuracy.

Data sets: a9a (32,561 x 123) and the KDD Cup 99 10% set (494,021 x 118)
from ../shared/data, each split into P contiguous blocks of rows, one per
party: every party's block is converted on its own (party mode) and the same
rows as one set of P shard files (plain mode). Both modes train hinge BMRM
(lam 1e-4, with a bias) on P ranks for a fixed number of iterations (no gap
test, no pruning), so they take the same path, and rank 0 reports the
solver's seconds per iteration. Party mode runs without the audit log, then
with it and with --verify-coordinator (every party replays the solver). The
first iterations are left out (the fixed-point range is found there); the
key agreement at start-up is timed separately.

Then a9a with differential privacy: party-mode BMRM with per-example
clipping and Gaussian noise, (epsilon, delta) = (1, 1e-5) over 40
iterations, against the same run without noise and the converged
non-private model; accuracy on a9a.t.

    python scripts/bench_privacy.py [--parties 3] [--iterations 200] [--workdir DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data")
SKIP = 10  # iterations left out of the per-iteration time


def make_sets(name, directory, parties):
    """Write DIR/site-R (one set per party) and DIR/all (P files); return the shape and the rows."""
    from prbmrm.data import read_input, write_shards

    X, y, _ = read_input(os.path.join(DATA, name))
    bounds = np.linspace(0, len(y), parties + 1).astype(int)
    for r in range(parties):
        write_shards(X[bounds[r]:bounds[r + 1]], y[bounds[r]:bounds[r + 1]],
                     os.path.join(directory, f"site-{r}"), 1)
    write_shards(X, y, os.path.join(directory, "all"), parties)
    return X.shape


def worker(directory, mode, iterations, lam, dp):
    """Run under mpiexec: train once; rank 0 prints its history, w and the start-up seconds as JSON."""
    from prbmrm.comm import get_comm
    from prbmrm.party import Party
    from prbmrm.train import fit

    comm = get_comm()
    party = None
    if mode != "plain":
        party = Party(audit_log=os.path.join(directory, "audit-{rank}.jsonl") if mode != "secure" else None,
                      verify_coordinator=mode == "verified", dp_epsilon=1.0 if dp else None,
                      dp_delta=1e-5 if dp else None, dp_clip=4.0)
    data = os.path.join(directory, "all" if party is None else "site-{rank}")
    started = time.perf_counter()
    result, _, _ = fit(data, bias=True, lam=lam, epsilon=0, rel_epsilon=0 if iterations else 1e-3,
                       max_iter=iterations or 10000, idle_age=0 if iterations else 10, comm=comm,
                       party=party)
    total = time.perf_counter() - started
    if comm.is_root:
        print(json.dumps({"history": {k: v.tolist() for k, v in result.history.items()},
                          "w": result.w.tolist(), "startup": total - result.history["seconds_total"][-1],
                          "spent": party.budget.spent() if dp else None}))


def run_worker(directory, parties, mode, iterations, lam, dp=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(parties), sys.executable,
               __file__, "--worker", directory, "--mode", mode, "--iterations", str(iterations),
               "--lam", str(lam)] + (["--dp"] if dp else [])
    completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if completed.returncode != 0:
        sys.exit(f"worker {mode} failed:\n{completed.stderr}")
    run = json.loads(completed.stdout.strip().splitlines()[-1])
    run["history"] = {k: np.asarray(v) for k, v in run["history"].items()}
    return run


def per_iteration(run):
    """Median seconds of one iteration (solver clock) after the first SKIP."""
    return float(np.median(np.diff(run["history"]["seconds_total"])[SKIP:]))


def overhead(name, shape, runs):
    plain = per_iteration(runs["plain"])
    print(f"\n{name}: {shape[0]:,} x {shape[1]:,}, {len(runs['plain']['history']['iteration'])} "
          f"iterations")
    print(f"{'mode':>34} {'s/iteration':>12} {'x plain':>8} {'comm s/it':>10} {'start-up s':>11}")
    labels = {"plain": "plain (reproducible Allreduce)", "secure": "party mode, secure aggregation",
              "audited": "  + audit log", "verified": "  + audit log + verify-coordinator"}
    for mode, run in runs.items():
        seconds = per_iteration(run)
        comm = float(np.median(run["history"]["seconds_comm"][SKIP:]))
        print(f"{labels[mode]:>34} {seconds:12.5f} {seconds / plain:8.2f} {comm:10.5f} {run['startup']:11.2f}")
    w = {mode: np.asarray(run["w"]) for mode, run in runs.items()}
    print(f"max |w_party - w_plain| / max |w_plain|: "
          f"{np.max(np.abs(w['secure'] - w['plain'])) / np.max(np.abs(w['plain'])):.1e}")


def accuracy(w, X, y):
    w = np.asarray(w)
    return float(np.mean(np.where(X @ w[:-1] + w[-1] >= 0, 1.0, -1.0) == y))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--workdir", help="where to write the shards (default: a temporary directory)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--dp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.mode, args.iterations, args.lam, args.dp)
        return
    from prbmrm.data import read_input

    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        for name, label in (("a9a.xz", "a9a"), ("kddcup99_10pct.binary.xz", "KDD Cup 99 10%")):
            directory = os.path.join(workdir, label.split()[0])
            shape = make_sets(name, directory, args.parties)
            runs = {mode: run_worker(directory, args.parties, mode, args.iterations, args.lam)
                    for mode in ("plain", "secure", "audited", "verified")}
            overhead(label, shape, runs)
        X_test, y_test, _ = read_input(os.path.join(DATA, "a9a.t.xz"), n_features=123)
        directory = os.path.join(workdir, "a9a")
        lam = 1e-3
        private = run_worker(directory, args.parties, "secure", 40, lam, dp=True)
        noiseless = run_worker(directory, args.parties, "secure", 40, lam)
        converged = run_worker(directory, args.parties, "secure", 0, lam)
        print(f"\na9a, hinge, lam {lam:g}, {args.parties} parties: accuracy on a9a.t (16,281 rows)")
        print(f"  differential privacy, epsilon {private['spent']:.3g} delta 1e-05 (clip 4, 40 "
              f"iterations): {accuracy(private['w'], X_test, y_test):.4f}")
        print(f"  the same 40 iterations without noise or clipping:           "
              f"{accuracy(noiseless['w'], X_test, y_test):.4f}")
        print(f"  non-private, converged ({len(converged['history']['iteration'])} iterations, rel. gap "
              f"1e-3):              {accuracy(converged['w'], X_test, y_test):.4f}")


if __name__ == "__main__":
    main()
