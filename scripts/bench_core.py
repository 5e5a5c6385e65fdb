"""Benchmark the distributed core: where one BMRM iteration spends its time, at 1 and 2 ranks.

Data sets: Fashion-MNIST (Debian package dataset-fashion-mnist: 60,000 x 784,
23.4M nonzeros, scaled to [0, 1], classes 0-4 against 5-9; a synthetic set
of that shape and density if the package is absent), written as CSR shards
and held dense in memory (density 0.5 >= prbmrm.io.DENSE_DENSITY), the KDD
Cup 99 10% set from ../shared/data (494,021 x 118, 6.2M nonzeros) and two
synthetic sparse sets of 2M rows with 10 nonzeros per row at
uniformly random columns (20M nonzeros; labels from a random sparse hyperplane
with 10% flipped): one with 10,000 features, and a wide one with 100,000
features, where rank 0's O(t d) work on the dense bundle (the Gram row of each
new plane and w = -A^T alpha / lam: 160 MB each at t = 200) is no longer small
next to the data pass. Each is sharded into 2 files and
trained with hinge BMRM, lam 1e-4, no stopping and no plane pruning, for 220
iterations so the bundle holds 200+ planes.

Printed per data set and rank count: seconds per iteration in risk (the data
pass on each rank), subproblem (rank 0: Gram update, QP, new w) and
communication (broadcast + the reproducible Allreduce, including waiting for
the slowest rank); the subproblem's share of the iteration at 190-210
planes; the risk phase's speedup from 1 to 2 ranks; and the risk phase's
effective bandwidth: the bytes of X (the dense array, or CSR data, indices
and indptr) per evaluation over the seconds of an evaluation's risk phase,
summed over the ranks, next to the memory bandwidth measured by a streaming
read (numpy sum of a 512 MB array, one process, the best of 5) and its
fraction of it; then the same from rank 0's fastest risk phase (best GB/s),
the figure comparable to the best-of-5 read on a busy machine.

    python scripts/bench_core.py [--iterations 220] [--workdir DIR] [--sets fashion kdd synthetic]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data")


FASHION = "/usr/share/datasets/fashion-mnist"


def load_fashion(seed=0):
    """Fashion-MNIST's training set as (CSR X scaled to [0, 1], labels +1 for classes 0-4, -1 for 5-9).

    A synthetic set of its shape and density if the Debian package dataset-fashion-mnist is absent.
    """
    import gzip

    images = os.path.join(FASHION, "train-images-idx3-ubyte.gz")
    if os.path.exists(images):
        with gzip.open(images) as f:
            X = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784) / 255.0
        with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
            y = np.where(np.frombuffer(f.read(), np.uint8, offset=8) <= 4, 1.0, -1.0)
    else:
        print("(dataset-fashion-mnist is not installed: a synthetic set of its shape and density)")
        rng = np.random.default_rng(seed)
        X = np.where(rng.random((60_000, 784)) < 0.5, rng.random((60_000, 784)), 0.0)
        y = np.where(X @ rng.standard_normal(784) >= 0, 1.0, -1.0)
    return sp.csr_matrix(X), y


def make_fashion(directory, parts=2, seed=0):
    """Fashion-MNIST's training set (:func:`load_fashion`) as `parts` CSR shard files."""
    from prbmrm.io import write_shards

    X, y = load_fashion(seed)
    write_shards(X, y, directory, parts)
    return X.nnz, X.shape


def make_kdd(directory):
    from prbmrm.io import read_input, write_shards

    X, y, _ = read_input(os.path.join(DATA, "kddcup99_10pct.binary.xz"))
    write_shards(X, y, directory, 2)
    return X.nnz, X.shape


def make_synthetic(directory, rows, features, per_row, seed=0):
    from prbmrm.io import write_shards

    rng = np.random.default_rng(seed)
    indices = rng.integers(0, features, size=rows * per_row, dtype=np.int32)
    X = sp.csr_matrix((rng.standard_normal(rows * per_row), indices,
                       np.arange(0, rows * per_row + 1, per_row, dtype=np.int64)),
                      shape=(rows, features))
    X.sum_duplicates()
    w_true = np.where(rng.random(features) < 0.1, rng.standard_normal(features), 0.0)
    y = np.where(X @ w_true >= 0, 1.0, -1.0)
    y[rng.random(rows) < 0.1] *= -1
    write_shards(X, y, directory, 2)
    return X.nnz, X.shape


def worker(directory, iterations, lam):
    """Run under mpiexec: train and print rank 0's history and every rank's totals as JSON."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.io import load_local
    from prbmrm.losses import get_loss
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed
    from prbmrm.solvers import minimize

    comm = get_comm()
    local = load_local(directory, comm)
    oracle = DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, comm,
                             local.blocks)
    result = run_distributed(oracle, lambda risk: minimize(
        risk, np.zeros(oracle.dim), lam, epsilon=0, rel_epsilon=0, max_iter=iterations, idle_age=0))
    X = local.X
    local_bytes = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes if sp.issparse(X) else X.nbytes
    totals = comm.gather_scalars(np.array([oracle.total_seconds["risk"], local_bytes]))
    if comm.is_root:
        print(json.dumps({"history": {k: v.tolist() for k, v in result.history.items()},
                          "risk_seconds": totals[0::2].tolist(), "bytes": totals[1::2].tolist()}))


def run_worker(directory, ranks, iterations, lam):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(ranks), sys.executable,
               __file__, "--worker", directory, "--iterations", str(iterations), "--lam", str(lam)]
    completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                               stdin=subprocess.DEVNULL)
    if completed.returncode != 0:
        sys.exit(f"worker failed on {ranks} rank(s):\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def read_bandwidth(megabytes=512, repeats=5):
    """Bytes per second read by numpy summing a large float64 array (the best of `repeats`)."""
    source = np.ones(megabytes * 2**20 // 8)
    best = np.inf
    for _ in range(repeats):
        started = time.perf_counter()
        source.sum()
        best = min(best, time.perf_counter() - started)
    return source.nbytes / best


def report(name, nnz, shape, runs, memory):
    print(f"\n{name}: {shape[0]:,} x {shape[1]:,}, {nnz:,} nonzeros, 2 shard files; "
          f"memory read bandwidth {memory / 1e9:.2f} GB/s; load average {os.getloadavg()[0]:.1f}")
    print(f"{'ranks':>5} {'risk s/it':>10} {'sub s/it':>10} {'comm s/it':>10} {'iter s':>9} "
          f"{'sub share @200':>15} {'risk GB/s':>10} {'of memory':>10} {'best GB/s':>10} {'of memory':>10}")
    for ranks, run in runs.items():
        h = {k: np.asarray(v) for k, v in run["history"].items()}
        per_iteration = h["seconds_risk"] + h["seconds_subproblem"] + h["seconds_comm"]
        near = (h["planes"] >= 190) & (h["planes"] <= 210)
        share = (h["seconds_subproblem"][near].mean() / per_iteration[near].mean()
                 if near.any() else float("nan"))  # nan: a run too short to reach 190 planes
        n = len(h["iteration"])
        bandwidth = sum(b / (s / n) for b, s in zip(run["bytes"], run["risk_seconds"]))
        # Rank 0's fastest risk phase, like the best-of-5 streaming read: what load did not slow
        # (the other ranks' shards are as large, so their bytes go at rank 0's speed).
        best = sum(run["bytes"]) / h["seconds_risk"].min()
        print(f"{ranks:5d} {h['seconds_risk'].mean():10.5f} {h['seconds_subproblem'].mean():10.5f} "
              f"{h['seconds_comm'].mean():10.5f} {per_iteration.mean():9.5f} {share:14.1%} "
              f"{bandwidth / 1e9:10.2f} {bandwidth / memory:10.1%} {best / 1e9:10.2f} {best / memory:10.1%}")
    one, two = (max(runs[r]["risk_seconds"]) for r in (1, 2))
    median_one, median_two = (np.median(runs[r]["history"]["seconds_risk"]) for r in (1, 2))
    # The median per iteration is robust to the load spikes of a shared machine; the
    # totals include them and take the slowest rank.
    print(f"risk phase speedup 1 -> 2 ranks: {median_one / median_two:.2f} by rank 0's median "
          f"iteration, {one / two:.2f} by total seconds of the slowest rank ({one:.3f} -> {two:.3f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=220)
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--workdir", help="where to write the shards (default: a temporary directory)")
    parser.add_argument("--synthetic-rows", type=int, default=2_000_000)
    parser.add_argument("--synthetic-features", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--synthetic-per-row", type=int, default=10)
    parser.add_argument("--sets", nargs="+", choices=["fashion", "kdd", "synthetic"],
                        default=["fashion", "kdd", "synthetic"])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.iterations, args.lam)
        return
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        sets = {"fashion": [("Fashion-MNIST (held dense)", make_fashion, ())],
                "kdd": [("KDD Cup 99 10%", make_kdd, ())],
                "synthetic": [(f"synthetic sparse, d = {d:,}", make_synthetic,
                               (args.synthetic_rows, d, args.synthetic_per_row))
                              for d in args.synthetic_features]}
        chosen = [entry for key in args.sets for entry in sets[key]]
        for number, (name, make, extra) in enumerate(chosen):
            directory = os.path.join(workdir, str(number))
            nnz, shape = make(directory, *extra)
            runs, memory = {}, 0.0
            for ranks in (1, 2):
                # Measured just before each run (the best counts), so that load hits both alike.
                memory = max(memory, read_bandwidth())
                runs[ranks] = run_worker(directory, ranks, args.iterations, args.lam)
            report(name, nnz, shape, runs, memory)


if __name__ == "__main__":
    main()
