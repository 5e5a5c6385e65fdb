"""Communication per BMRM iteration against the rank count, before and after a change, interleaved.

Runs ``mpiexec -n P python -m prbmrm.cli.train`` (hinge, lam 1e-4, no stopping test, a fixed number of
iterations) from each source tree given (``--trees OLD NEW``: checkouts run through PYTHONPATH) at each
rank count, alternating trees and rank counts round by round so that load on the machine hits all alike.
Printed per run, from the model's history (rank 0's view, medians over the iterations after the first
two): milliseconds per iteration in the risk (rank 0's own data pass), the subproblem (rank 0 alone),
and the communication (broadcast of w and the reduction, including waiting for the slowest rank); the
CPU seconds of all ranks per iteration; and per tree the ratio comm(largest P) / comm(smallest P).

``--text`` makes hashed-text-like data instead (``--rows`` x 2^``--log-d`` columns, ``--nnz`` per row, in
``--parts`` shards) and prints, beside the times, the bytes each rank sends per iteration in the
reduction as the code sends them: the running sum's P - 1 messages of 8 (d + 1) bytes one after the
other (before), or one Allreduce of 2 (d + 1) + 5 int64 words (after), against the ideal of a float64
ring Allreduce, 2 (P - 1) / P x 8 (d + 1) bytes per rank.

    python scripts/bench_comm.py --data 'kdd64/*.h5' --trees /work/wt-p14base /work/wt-p14core --ranks 8 64
    python scripts/bench_comm.py --text --trees OLD NEW --ranks 16
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np


def mpiexec():
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else "mpiexec"


def run(tree, data, ranks, iterations, out):
    """One training run; return (per-iteration medians in ms, CPU seconds per iteration, wall seconds)."""
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "prbmrm.cli.train", "--data", data,
               "--loss", "hinge", "--lam", "1e-4", "--solver", "bmrm", "--rel-epsilon", "0",
               "--max-iter", str(iterations), "--quiet", "--out", out]
    env = dict(os.environ, PYTHONPATH=tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(command, env=env, check=True, stdin=subprocess.DEVNULL, timeout=3600)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with h5py.File(out) as f:
        history = {key: f["history"][key][()] for key in f["history"]}
    done = len(history["seconds_comm"])
    medians = {part: 1000 * statistics.median(history[f"seconds_{part}"][2:])
               for part in ("risk", "subproblem", "comm")}
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / done
    return medians, cpu, wall


def text_like(directory, rows, log_d, nnz, parts):
    """Hashed-text-like rows (Zipf-distributed columns, tf-idf-like values, unit norm) in `parts` shards."""
    import scipy.sparse as sp

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from prbmrm.io import write_shards

    rng = np.random.default_rng(0)
    d = 2 ** log_d
    columns = (rng.zipf(1.3, size=rows * nnz) * 2654435761) % d
    X = sp.csr_matrix((np.ones(rows * nnz), columns, np.arange(0, rows * nnz + 1, nnz)), shape=(rows, d))
    X.sum_duplicates()
    X.data = 1.0 + np.log(X.data)
    X = sp.csr_matrix(sp.diags(1.0 / np.sqrt(X.multiply(X).sum(axis=1)).A1) @ X)
    y = np.where(X @ rng.standard_normal(d) >= 0, 1.0, -1.0)
    write_shards(X, y, directory, parts)
    return os.path.join(directory, "*.h5"), d


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", nargs="+", required=True, help="source trees to compare (PYTHONPATH)")
    parser.add_argument("--data", help="shard files (a glob)")
    parser.add_argument("--text", action="store_true", help="make hashed-text-like data instead")
    parser.add_argument("--rows", type=int, default=16000)
    parser.add_argument("--log-d", type=int, default=17)
    parser.add_argument("--nnz", type=int, default=100)
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_comm_")
    data, d = args.data, None
    if args.text:
        data, d = text_like(os.path.join(work, "text"), args.rows, args.log_d, args.nnz, args.parts)
    results = {}
    print(f"{'tree':<28} {'P':>3} {'risk ms':>8} {'subproblem ms':>14} {'comm ms':>8} {'CPU s/it':>9} {'wall s':>7}")
    for _ in range(args.rounds):
        for ranks in args.ranks:
            for tree in args.trees:
                medians, cpu, wall = run(tree, data, ranks, args.iterations, os.path.join(work, "model.h5"))
                results.setdefault((tree, ranks), []).append(medians["comm"])
                print(f"{tree:<28} {ranks:>3} {medians['risk']:>8.2f} {medians['subproblem']:>14.2f} "
                      f"{medians['comm']:>8.2f} {cpu:>9.3f} {wall:>7.1f}", flush=True)
    print()
    for tree in args.trees:
        comm = {ranks: statistics.median(results[(tree, ranks)]) for ranks in args.ranks}
        line = ", ".join(f"P={ranks}: {ms:.2f} ms" for ranks, ms in comm.items())
        ratio = comm[max(args.ranks)] / comm[min(args.ranks)] if len(args.ranks) > 1 else float("nan")
        print(f"{tree}: comm per iteration {line}; comm({max(args.ranks)}) / comm({min(args.ranks)}) = {ratio:.2f}")
    if d is not None:
        for ranks in args.ranks:
            ideal = 2 * (ranks - 1) / ranks * 8 * (d + 1)
            print(f"d = {d}, P = {ranks}: ideal float64 ring Allreduce {ideal / 1e6:.3f} MB per rank; "
                  f"before: {ranks - 1} sequential messages of {8 * (d + 1) / 1e6:.3f} MB (each rank sends one); "
                  f"after: one Allreduce of {8 * (2 * (d + 1) + 5) / 1e6:.3f} MB per rank "
                  f"(Rabenseifner: {2 * (ranks - 1) / ranks * 8 * (2 * (d + 1) + 5) / 1e6:.3f} MB sent per rank, "
                  f"2 log2 P = {2 * np.log2(ranks):.0f} rounds)")


if __name__ == "__main__":
    main()
