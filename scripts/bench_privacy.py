"""Benchmark party mode: the cost of secure aggregation per iteration, and of privacy in accuracy.

Data sets: a9a (32,561 x 123) and the KDD Cup 99 10% set (494,021 x 118)
from ../shared/data, each split into P contiguous blocks of rows, one per
party: every party's block is converted on its own (party mode) and the same
rows as one set of P shard files (plain mode), for P = 3 and 4. Both modes train hinge BMRM
(lam 1e-4, with a bias) on P ranks for a fixed number of iterations (no gap
test, no pruning), so they take the same path, and rank 0 reports the
solver's seconds per iteration. Party mode runs with everything that holds it
against hostile parties (signed keys checked against a roster, typed
messages, the poisoning checks on every aggregated plane, line searches
through masked sums), first without the audit log, then with it and with
--verify-coordinator (every party replays the solver); the last column is
its ratio to plain mode, the goal being at most 2x. The
first iterations are left out (the fixed-point range is found there); the
key agreement at start-up is timed separately. The modes alternate, 3 runs
each, and the least disturbed run counts (the machine is shared). The sum
of the risk-and-gradient buffer alone, plain and secure, is also timed on
P ranks (alternating calls), and its local work without MPI (secure: the
fixed-point limbs, a ChaCha20 mask per peer, the decoding).

Then a9a with differential privacy: party mode with per-example clipping
and Gaussian noise, (epsilon, delta) = (1, 1e-5) over 40 iterations of the
proximal bundle method (the solver DP runs with), against the same 40
iterations without noise and the converged non-private BMRM model; accuracy
on a9a.t.

    python scripts/bench_privacy.py [--parties 3,4] [--sets a9a,kdd] [--iterations 200] [--workdir DIR]
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
SUM_CALLS = 500


def make_sets(name, directory, parties):
    """Write DIR/site-R (one set per party) and DIR/all (P files); return the shape and the rows."""
    from prbmrm.io import read_input, write_shards

    X, y, _ = read_input(os.path.join(DATA, name))
    bounds = np.linspace(0, len(y), parties + 1).astype(int)
    for r in range(parties):
        write_shards(X[bounds[r]:bounds[r + 1]], y[bounds[r]:bounds[r + 1]],
                     os.path.join(directory, f"site-{r}"), 1)
    write_shards(X, y, os.path.join(directory, "all"), parties)
    make_keys(directory, parties)
    return X.shape


def make_keys(directory, parties):
    """Each party's signing key DIR/party-R.key and the roster DIR/roster.json."""
    from prbmrm.party.keys import keygen, write_roster

    for r in range(parties):
        keygen(os.path.join(directory, f"party-{r}"))
    write_roster([os.path.join(directory, f"party-{r}.pub") for r in range(parties)],
                 os.path.join(directory, "roster.json"))


def sums_worker(n, calls):
    """Run under mpiexec: time the sum of an n-vector, plain and secure, alternating; rank 0 prints JSON."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.party.secure import SecureComm

    comm = get_comm()
    secure = SecureComm(comm)
    partials = np.random.default_rng(comm.rank).standard_normal((1, n))
    seconds = {"plain": [], "secure": []}
    for _ in range(calls):
        for name, communicator in (("plain", comm), ("secure", secure)):
            comm.barrier()
            started = time.perf_counter()
            communicator.reproducible_sum(partials, comm.size)
            seconds[name].append(time.perf_counter() - started)
    if comm.is_root:
        print(json.dumps({name: float(np.median(values)) for name, values in seconds.items()}))


class Loopback:
    """Party 0 of 3 whose collectives cost nothing (for timing only: peers' keys made up, sums 0)."""

    rank, size, is_root = 0, 3, True

    def bcast_array(self, buf, root=0):
        """The key agreement: made-up peers, each with a properly signed message."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        from prbmrm.party.secure import _raw, _signed_text

        if root != 0:
            signing, exchange = Ed25519PrivateKey.generate(), _raw(X25519PrivateKey.generate().public_key())
            message = _raw(signing.public_key()) + exchange + signing.sign(_signed_text(root, 3, exchange))
            buf[:] = np.frombuffer(message, dtype=np.float64)
        return buf

    def check(self, error=None):
        assert error is None

    def allreduce_sum(self, buf):
        buf[:] = 0
        return buf

    def allreduce_max(self, values):
        return np.array(values, dtype=np.float64)


def local_cost(n, calls=2000):
    """Median seconds of one sum's own work (encoding, masks, decoding), plain and secure, without MPI."""
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.party.secure import SecureComm

    partials = np.random.default_rng(0).uniform(-0.5, 0.5, (1, n))  # within the first range: no retry
    seconds = {}
    for name, communicator in (("plain", SerialComm()), ("secure", SecureComm(Loopback()))):
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            communicator.reproducible_sum(partials, 3)
            times.append(time.perf_counter() - started)
        seconds[name] = float(np.median(times))
    return seconds


def worker(directory, mode, iterations, lam, dp, solver):
    """Run under mpiexec: train once; rank 0 prints its history, w and the start-up seconds as JSON."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.party.session import Party
    from prbmrm.training import run

    comm = get_comm()
    party = None
    if mode != "plain":
        party = Party(audit_log=os.path.join(directory, "audit-{rank}.jsonl") if mode != "secure" else None,
                      verify_coordinator=mode == "verified", dp_epsilon=1.0 if dp else None,
                      dp_delta=1e-5 if dp else None, dp_clip=4.0,
                      signing_key=os.path.join(directory, "party-{rank}.key"),
                      roster=os.path.join(directory, "roster.json"))
    data = os.path.join(directory, "all" if party is None else "site-{rank}")
    started = time.perf_counter()
    result, _, _ = run(data, bias=True, lam=lam, solver=solver, epsilon=0,
                       rel_epsilon=0 if iterations else 1e-3, max_iter=iterations or 10000,
                       idle_age=0 if iterations else 10, comm=comm, party=party)
    total = time.perf_counter() - started
    if comm.is_root:
        print(json.dumps({"history": {k: v.tolist() for k, v in result.history.items()},
                          "w": result.w.tolist(), "startup": total - result.history["seconds_total"][-1],
                          "spent": party.budget.spent() if dp else None}))


def launch(parties, *args):
    """Run this script with `args` on `parties` ranks; return what rank 0 printed (JSON)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(parties), sys.executable,
               __file__, *map(str, args)]
    completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                               stdin=subprocess.DEVNULL)
    if completed.returncode != 0:
        sys.exit(f"worker {args} failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run_worker(directory, parties, mode, iterations, lam, dp=False, solver="bmrm"):
    run = launch(parties, "--worker", directory, "--mode", mode, "--iterations", iterations, "--lam", lam,
                 "--solver", solver, *(["--dp"] if dp else []))
    run["history"] = {k: np.asarray(v) for k, v in run["history"].items()}
    return run


def per_iteration(run):
    """Median seconds of one iteration (solver clock) after the first SKIP."""
    return float(np.median(np.diff(run["history"]["seconds_total"])[SKIP:]))


def overhead(name, shape, repeats, sums):
    """Print each mode's per-iteration seconds (the least disturbed of the repeats) against plain mode's."""
    runs = {mode: min(runs, key=per_iteration) for mode, runs in repeats.items()}
    plain = per_iteration(runs["plain"])
    print(f"\n{name}: {shape[0]:,} x {shape[1]:,}, {len(runs['plain']['history']['iteration'])} "
          f"iterations, best of {len(repeats['plain'])} runs per mode")
    print(f"{'mode':>34} {'s/iteration':>12} {'x plain':>8} {'comm s/it':>10} {'start-up s':>11}")
    labels = {"plain": "plain (reproducible Allreduce)", "secure": "party mode (hostile-proof)",
              "audited": "  + audit log", "verified": "  + audit log + verify-coordinator"}
    for mode, run in runs.items():
        seconds = per_iteration(run)
        comm = float(np.median(run["history"]["seconds_comm"][SKIP:]))
        print(f"{labels[mode]:>34} {seconds:12.5f} {seconds / plain:8.2f} {comm:10.5f} "
              f"{run['startup']:11.2f}")
    print(f"the sum alone ({shape[1] + 2} values, median of {SUM_CALLS} calls): plain "
          f"{sums['plain'] * 1e3:.3f} ms, secure {sums['secure'] * 1e3:.3f} ms "
          f"({sums['secure'] / sums['plain']:.2f}x)")
    local = local_cost(shape[1] + 2)
    print(f"  of which a party's own work (encoding, 2 masks, decoding; no MPI): plain "
          f"{local['plain'] * 1e3:.3f} ms, secure {local['secure'] * 1e3:.3f} ms")
    # BMRM amplifies round-off; party mode's sums differ from plain mode's by about one ulp.
    w = {mode: np.asarray(run["w"]) for mode, run in runs.items()}
    objective = {mode: run["history"]["objective"] for mode, run in runs.items()}
    drift = np.abs(objective["secure"] - objective["plain"]) / np.abs(objective["plain"])
    first = np.flatnonzero(drift > 1e-9)
    print(f"party vs plain: max |w_party - w_plain| / max |w_plain| = "
          f"{np.max(np.abs(w['secure'] - w['plain'])) / np.max(np.abs(w['plain'])):.1e}; objectives "
          f"agree to 1e-9 {'throughout' if not len(first) else f'up to iteration {first[0]}'}")


def accuracy(w, X, y):
    w = np.asarray(w)
    return float(np.mean(np.where(X @ w[:-1] + w[-1] >= 0, 1.0, -1.0) == y))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parties", default="3,4", help="comma-separated party counts (default 3,4)")
    parser.add_argument("--sets", default="a9a,kdd", help="data sets: a9a, kdd or both (default)")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode, alternating (default 3)")
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--workdir", help="where to write the shards (default: a temporary directory)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--dp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--solver", default="bmrm", help=argparse.SUPPRESS)
    parser.add_argument("--sums", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.mode, args.iterations, args.lam, args.dp, args.solver)
        return
    if args.sums:
        sums_worker(args.sums, SUM_CALLS)
        return
    from prbmrm.io import read_input

    counts = [int(p) for p in args.parties.split(",")]
    sets = {"a9a": ("a9a.xz", "a9a"), "kdd": ("kddcup99_10pct.binary.xz", "KDD Cup 99 10%")}
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        for parties in counts:
            for key in args.sets.split(","):
                name, label = sets[key]
                directory = os.path.join(workdir, f"{label.split()[0]}-{parties}")
                shape = make_sets(name, directory, parties)
                repeats = {mode: [] for mode in ("plain", "secure", "audited", "verified")}
                for _ in range(args.repeats):
                    for mode, runs in repeats.items():
                        runs.append(run_worker(directory, parties, mode, args.iterations, args.lam))
                sums = launch(parties, "--sums", shape[1] + 2)
                overhead(f"{label}, {parties} parties", shape, repeats, sums)
        parties = counts[-1]
        X_test, y_test, _ = read_input(os.path.join(DATA, "a9a.t.xz"), n_features=123)
        directory = os.path.join(workdir, "a9a-dp")
        make_sets("a9a.xz", directory, parties)
        lam = 1e-3
        private = run_worker(directory, parties, "secure", 40, lam, dp=True, solver="proximal")
        noiseless = run_worker(directory, parties, "secure", 40, lam, solver="proximal")
        converged = run_worker(directory, parties, "secure", 0, lam)
        print(f"\na9a, hinge, lam {lam:g}, {parties} parties: accuracy on a9a.t (16,281 rows)")
        print(f"  differential privacy, epsilon {private['spent']:.3g} delta 1e-05 against any "
              f"{parties - 2} colluding parties (clip 4, 40 iterations): {accuracy(private['w'], X_test, y_test):.4f}")
        print(f"  the same 40 iterations without noise or clipping:           "
              f"{accuracy(noiseless['w'], X_test, y_test):.4f}")
        print(f"  non-private, converged ({len(converged['history']['iteration'])} iterations, rel. gap "
              f"1e-3):              {accuracy(converged['w'], X_test, y_test):.4f}")


if __name__ == "__main__":
    main()
