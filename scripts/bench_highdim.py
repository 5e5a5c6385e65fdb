"""Benchmark text-like sparse data with millions of features: cost per iteration and memory.

Synthetic data of the shape of the papers' text sets (news20-b, rcv1,
reuters-ccat): rows of about `--mean-len` nonzeros (Poisson) at features drawn
with Zipf frequencies (exponent 1: feature rank k has probability about
``1 / (k ln d)``, the ranks scattered over the columns by a random
permutation), term-frequency values ``1 + log(count)`` normalised to unit
rows and rounded to 6 decimals (so that the text files of BMRM 2.1 hold the
very same numbers), labels from a random hyperplane with Gaussian noise.
About `--nnz` nonzeros (1e7 by default) in every set; d = 2^20, 2^22, 2^24;
seeds fixed. Each set is generated once (vectorised numpy, a few seconds)
into `--workdir` as `--parts` shards (and, for the peer, a feature file and
a label file), and reused by later runs.

Each configuration ``EXP:RANKS`` trains hinge (lam 1e-5, `--solver`: by default
the solver the CLI picks for one lam) on RANKS ranks
to the relative gap `--rel-epsilon` and prints: iterations, seconds per
iteration in each phase (risk: the data pass on rank 0; comm: broadcast and
the Allreduce of the sums, waiting included; subproblem: rank 0's QP and plane
management), wall seconds, CPU seconds and peak RSS of every rank, and a
digest of the final w (1 and 2 ranks on the same shards give the same one).

At d = 2^22 BMRM 2.1 (``--peer-dir``: a built ``linear-bmrm``, or it is
built from ../shared/peers into a temporary directory) runs on the same data
for at most `--peer-iterations` iterations: its per-iteration loss-and-
gradient and QP CPU seconds (verbosity 3 prints the CPU time of every
iteration, the summary the totals) next to prbmrm's, its peak RSS (from
``/usr/bin/time -v``) next to prbmrm's on 1 rank, and the seconds each
takes to reach the gap the peer reached last. prbmrm and the peer run
alternately `--repeat` times, so machine load hits both alike.

    python scripts/bench_highdim.py [--nnz 1e7] [--configs 20:1,22:1,22:2,24:2]
        [--peer-dir DIR] [--peer-iterations 40] [--bundle-memory 2GB] [--solver bmrm] [--workdir DIR]
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_PEER = "/work/peers/s/linear-bmrm"


def make_text_like(d, nnz, mean_len=40, seed=0):
    """Return ``(X, y)``: CSR rows with Zipf-distributed features, about `nnz` nonzeros in all.

    Vectorised: one draw per nonzero, one sort, no Python loop over rows.
    """
    rng = np.random.default_rng(seed)
    n = max(1, int(nnz) // mean_len)
    lengths = rng.poisson(mean_len - 1, n) + 1
    rows = np.repeat(np.arange(n, dtype=np.int64), lengths)
    # Zipf with exponent 1 by inversion of its continuous CDF: rank = floor((d + 1)^u) - 1.
    ranks = np.minimum(np.exp(rng.random(rows.size) * np.log(d + 1.0)).astype(np.int64) - 1, d - 1)
    columns = rng.permutation(d).astype(np.int64)[ranks]
    keys, counts = np.unique(rows * d + columns, return_counts=True)  # sorted: CSR order
    rows = keys // d
    values = 1.0 + np.log(counts)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    norms = np.sqrt(np.add.reduceat(values ** 2, indptr[:-1]))
    values = np.maximum(np.round(values / np.repeat(norms, np.diff(indptr)), 6), 1e-6)
    X = sp.csr_matrix((values, (keys - rows * d).astype(np.int32), indptr.astype(np.int32)),
                      shape=(n, d))
    f = X @ rng.standard_normal(d)
    y = np.where(f + 0.3 * f.std() * rng.standard_normal(n) >= 0, 1.0, -1.0)
    return X, y


def write_peer_files(X, y, stem, rows_per_write=20000):
    """Write BMRM 2.1's feature file (``index:value``, 1-based) and label file."""
    with open(stem + ".feat", "w") as out:
        for start in range(0, X.shape[0], rows_per_write):
            block = X[start:start + rows_per_write]
            tokens = np.strings.add(np.strings.add((block.indices + 1).astype(np.str_), ":"),
                                    np.char.mod("%.6f", block.data))
            ends = block.indptr[1:] - 1
            separators = np.full(len(tokens), " ")
            separators[ends] = "\n"
            out.write("".join(np.strings.add(tokens, separators).tolist()))
    np.savetxt(stem + ".lab", y, fmt="%d")


def prepare(workdir, exponent, nnz, mean_len, seed, parts, float32, peer):
    """Generate (once) the set of d = 2^exponent; return its shard directory and peer file stem."""
    from prbmrm.io import write_shards

    base = os.path.join(workdir, f"d{exponent}-nnz{int(nnz)}-len{mean_len}-seed{seed}")
    shards = os.path.join(base, f"shards{parts}" + ("-f32" if float32 else ""))
    stem = os.path.join(base, "peer")
    need_shards = not os.path.isdir(shards)
    need_peer = peer and not os.path.exists(stem + ".lab")
    if need_shards or need_peer:
        started = time.perf_counter()
        X, y = make_text_like(2 ** exponent, nnz, mean_len, seed)
        print(f"generated d=2^{exponent}: {X.shape[0]:,} rows, {X.nnz:,} nonzeros, "
              f"{np.count_nonzero(np.bincount(X.indices, minlength=X.shape[1])):,} features in use "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
        os.makedirs(base, exist_ok=True)
        if need_shards:
            write_shards(X, y, shards, parts, float32=float32)
        if need_peer:
            write_peer_files(X, y, stem)
    return shards, stem


class _CpuTimed:
    """The risk oracle as the solver sees it, with the CPU seconds of its calls counted (rank 0).

    Every other attribute is the oracle's (its blocks, loss, dimension, line searches, services): the
    default solver measures them to pick, as it does in a CLI run, and TRON and LS-BMRM use them.
    """

    def __init__(self, oracle):
        self.oracle = oracle
        self.cpu = 0.0

    def __getattr__(self, name):
        return getattr(self.oracle, name)

    def __call__(self, w, out=None):
        # out= passes through: the solver's own array for the subgradient, as the oracle gets it without this wrapper.
        started = time.process_time()
        values = self.oracle(w, out=out)
        self.cpu += time.process_time() - started
        return values


def peak_rss():
    """This process's peak RSS so far in bytes (the kernel's high-water mark, VmHWM)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024.0 for line in status if line.startswith("VmHWM:"))


def worker(args):
    """Run under mpiexec: train, then print rank 0's history and every rank's resources as JSON."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.io import load_local
    from prbmrm.losses import get_loss
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed
    from prbmrm.solvers import default_solver, minimize
    from prbmrm.options import memory_bytes
    from prbmrm.regularizers import get_regularizer

    comm = get_comm()
    started, cpu = time.perf_counter(), time.process_time()
    local = load_local(args.worker, comm)
    loss = get_loss("hinge")
    loss.prepare(local.classes, local.label_kind)
    oracle = DistributedRisk(loss, local.X, local.y, local.n_examples_total, comm, local.blocks)
    budget = memory_bytes(args.bundle_memory)
    # The regularizer and the solver as a CLI run makes them (prbmrm.training.run).
    regularizer = get_regularizer("l2")
    regularizer.prepare(oracle.dim, loss.risk_floor)
    solver = default_solver(args.lam, regularizer) if args.solver == "default" else args.solver
    timed = _CpuTimed(oracle)
    solve_cpu = time.process_time()
    cpu_total, rss = [], []  # rank 0's CPU seconds from the solver's start and peak RSS, per iteration

    def record(row):
        cpu_total.append(time.process_time() - solve_cpu)
        rss.append(peak_rss())
        if row.iteration % 10 == 0:  # progress for whoever watches a long run's output (the driver ignores it)
            print(f"iteration {row.iteration}: relative gap {row.gap / row.best_objective:.3e}, "
                  f"{row.planes} planes, CPU {cpu_total[-1]:.1f} s, peak RSS {rss[-1] / 2**30:.2f} GiB", flush=True)

    result = run_distributed(oracle, lambda risk: minimize(
        timed, regularizer.initial_point(oracle.dim), args.lam, solver, regularizer, epsilon=0.0, rel_epsilon=args.rel_epsilon,
        max_iter=args.max_iter, bundle_memory=budget, callback=record))
    solve_cpu = time.process_time() - solve_cpu
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over execve, so a worker forked by a driver that holds the
    # data it just generated would report the driver's RSS (0.33 GiB against its own 0.28 at d = 2^22).
    usage = np.array([peak_rss(),
                      time.process_time() - cpu, time.perf_counter() - started])
    everyone = comm.gather_scalars(usage)
    if comm.is_root:
        history = dict({k: np.asarray(v).tolist() for k, v in result.history.items()}, cpu_total=cpu_total,
                       rss=rss)
        solver = f"{solver}: {result.message}"
        print("RESULT " + json.dumps({
            "nit": result.nit, "fun": result.fun, "gap": result.gap, "history": history, "budget": budget,
            "solver": solver,
            "risk_cpu": timed.cpu, "solve_cpu": solve_cpu, "ranks": everyone.reshape(-1, 3).tolist(),
            "w_digest": hashlib.sha256(np.ascontiguousarray(result.w).tobytes()).hexdigest()[:16]}))


def run_prbmrm(args, shards, ranks):
    """Train on `ranks` ranks in a fresh process group; return the worker's JSON."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", shards, "--lam", str(args.lam),
               "--rel-epsilon", str(args.rel_epsilon), "--max-iter", str(args.max_iter),
               "--bundle-memory", str(args.bundle_memory), "--solver", args.solver]
    if ranks > 1:
        command = ["mpiexec", "-n", str(ranks)] + command
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                          timeout=args.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"bench_highdim: prbmrm on {ranks} rank(s) failed (status {done.returncode}):\n"
                 f"{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def peer_binary(args):
    """The path of linear-bmrm-train: from --peer-dir, the machine's build, or built under --workdir."""
    from peer_build import build_peer

    if args.peer_dir:
        return os.path.join(args.peer_dir, "linear-bmrm-train")
    if os.path.exists(os.path.join(DEFAULT_PEER, "linear-bmrm-train")):
        return os.path.join(DEFAULT_PEER, "linear-bmrm-train")
    os.makedirs(args.workdir, exist_ok=True)
    built = build_peer(tempfile.mkdtemp(prefix="bmrm21-", dir=args.workdir))
    return None if built is None else str(built / "linear-bmrm-train")


def run_peer(binary, stem, args, workdir):
    """Run BMRM 2.1 for at most --peer-iterations iterations; return its figures."""
    run_dir = tempfile.mkdtemp(prefix="peer-", dir=workdir)
    config = os.path.join(run_dir, "config")
    with open(config, "w") as f:
        f.write("\n".join([
            "string Solver.type BMRM", "int BMRM.verbosity 3", f"int BMRM.maxNumOfIter {args.peer_iterations}",
            "double BMRM.epsilonTol 0", f"double BMRM.lambda {args.lam}",
            "string BMRM.innerSolverType L2N2_DaiFletcherPGM", "string Loss.lossFunctionType HINGE",
            "bool Loss.nonNegative true", "bool Data.bias false", "string Data.format VECTOR_LABEL_VECTOR_FEATURE",
            f"string Data.featureFile {stem}.feat", f"string Data.labelFile {stem}.lab",
            f"string Model.modelFile {os.path.join(run_dir, 'model.txt')}", ""]))
    done = subprocess.run(["/usr/bin/time", "-v", binary, config], capture_output=True, text=True,
                          cwd=run_dir, stdin=subprocess.DEVNULL, timeout=args.timeout)
    out = done.stdout
    rows = re.findall(r"#(\d+)\s+pobj (\S+)\s+aobj (\S+)\s+eps (\S+).*time (\S+)", out)
    loss = re.search(r"loss and gradient:\s+(\S+)", out)
    solver = re.search(r"2\. solver:\s+(\S+)", out)
    wall = re.search(r"Wall-clock total:\s+(\S+)", out)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if not (rows and loss and solver and wall and rss):
        sys.exit(f"bench_highdim: BMRM 2.1 output not understood (status {done.returncode}):\n"
                 f"{out[-2000:]}{done.stderr[-2000:]}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"nit": len(rows), "gap": [float(r[3]) for r in rows], "cpu": [float(r[4]) for r in rows],
            "objective": [float(r[1]) for r in rows], "loss_cpu": float(loss.group(1)),
            "qp_cpu": float(solver.group(1)), "wall": float(wall.group(1)),
            "rss": int(rss.group(1)) * 1024.0}


def seconds_to_gap(history, gap, column="seconds_total"):
    """The value of `column` (wall seconds; ``cpu_total``: CPU seconds, ``rss``: peak RSS) at the first
    iteration whose gap is at most `gap` (None if never)."""
    reached = np.flatnonzero(np.asarray(history["gap"]) <= gap)
    return None if len(reached) == 0 else history[column][reached[0]]


def describe(name, figures):
    history = figures["history"]
    nit = figures["nit"]
    per = {k: float(np.mean(history[f"seconds_{k}"])) for k in ("risk", "comm", "subproblem")}
    iteration = history["seconds_total"][-1] / nit
    ranks = figures["ranks"]
    limit = f"within {figures['budget'] / 2**30:.2f} GiB, at most {max(history['planes']):.0f}" if figures["budget"] \
        else f"unlimited, at most {max(history['planes']):.0f}"
    print(f"{name}, {figures['solver']}: {nit} iterations to gap {figures['gap']:.3e} (J = {figures['fun']:.8e}), "
          f"wall {history['seconds_total'][-1]:.1f} s, bundle {limit} planes, "
          f"w digest {figures['w_digest']}")
    print(f"    per iteration (wall): risk {per['risk']:.4f} s, comm {per['comm']:.4f} s "
          f"({100 * per['comm'] / iteration:.1f}% of {iteration:.4f} s), subproblem {per['subproblem']:.4f} s")
    print(f"    per iteration (CPU, rank 0): risk and comm {figures['risk_cpu'] / nit:.4f} s, "
          f"subproblem {(figures['solve_cpu'] - figures['risk_cpu']) / nit:.4f} s")
    for rank, (rss, cpu, wall) in enumerate(ranks):
        print(f"    rank {rank}: peak RSS {rss / 2**30:.2f} GiB, CPU {cpu:.1f} s, wall {wall:.1f} s")
    return per


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nnz", type=float, default=1e7, help="nonzeros per data set (about)")
    p.add_argument("--mean-len", type=int, default=40, help="mean nonzeros per row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default="20:1,22:1,22:2,24:2",
                   help="comma-separated EXP:RANKS (d = 2^EXP on RANKS ranks)")
    p.add_argument("--parts", type=int, default=2, help="shards per set (at least the most ranks)")
    p.add_argument("--float32", action="store_true", help="store the shards' values as float32")
    p.add_argument("--lam", type=float, default=1e-5)
    p.add_argument("--rel-epsilon", type=float, default=1e-4)
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--bundle-memory", default="2GB", help="prbmrm's budget for the bundle's planes (0: no limit)")
    p.add_argument("--solver", default="default",
                   help="prbmrm's solver: a key of prbmrm.solvers.SOLVERS, or default (the CLI's for one lam)")
    p.add_argument("--peer-dir", help="a built linear-bmrm directory (with linear-bmrm-train)")
    p.add_argument("--peer-iterations", type=int, default=40, help="cap on BMRM 2.1's iterations (0: skip it)")
    p.add_argument("--peer-exp", type=int, default=22, help="the d = 2^EXP at which BMRM 2.1 runs")
    p.add_argument("--repeat", type=int, default=1, help="alternate prbmrm and BMRM 2.1 this many times")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "prbmrm-bench-highdim"),
                   help="where the generated sets are cached")
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, REPO)
    if args.worker:
        return worker(args)
    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
    sys.path.insert(0, HERE)
    binary = peer_binary(args) if args.peer_iterations > 0 else None
    for exponent, ranks in configs:
        peer = binary is not None and exponent == args.peer_exp and ranks == 1
        shards, stem = prepare(args.workdir, exponent, args.nnz, args.mean_len, args.seed, args.parts,
                               args.float32, peer)
        for attempt in range(args.repeat):
            label = f"prbmrm d=2^{exponent} on {ranks} rank(s)" + (f" [run {attempt + 1}]" if args.repeat > 1 else "")
            mine = run_prbmrm(args, shards, ranks)
            per = describe(label, mine)
            if not peer:
                continue
            theirs = run_peer(binary, stem, args, args.workdir)
            n = theirs["nit"]
            print(f"BMRM 2.1 d=2^{exponent}: {n} iterations (capped) to gap {theirs['gap'][-1]:.3e} "
                  f"(J = {min(theirs['objective']):.8e}), wall {theirs['wall']:.1f} s, "
                  f"peak RSS {theirs['rss'] / 2**30:.2f} GiB")
            loss_per, qp_per = theirs["loss_cpu"] / n, theirs["qp_cpu"] / n
            print(f"    per iteration (CPU): loss and gradient {loss_per:.4f} s, QP {qp_per:.4f} s")
            history = mine["history"]
            cpu_per_iteration = mine["ranks"][0][1] / mine["nit"]
            print(f"    prbmrm risk and comm / BMRM 2.1 loss and gradient, CPU per iteration: "
                  f"{mine['risk_cpu'] / mine['nit'] / loss_per:.2f}x; prbmrm wall risk / their CPU "
                  f"{per['risk'] / loss_per:.2f}x (prbmrm CPU per iteration, all phases and start-up: "
                  f"{cpu_per_iteration:.4f} s)")
            target = theirs["gap"][-1]
            ours = seconds_to_gap(history, target)
            # The peer prints CPU seconds per iteration; its wall to the gap is their share of its wall.
            first = int(np.flatnonzero(np.asarray(theirs["gap"]) <= target)[0])
            their_wall = theirs["wall"] * theirs["cpu"][first] / max(theirs["cpu"][-1], 1e-9)
            if ours is None:
                print(f"    prbmrm did not reach the peer's gap {target:.3e}")
            else:
                ours_cpu = seconds_to_gap(history, target, "cpu_total")
                print(f"    wall to gap {target:.3e}: prbmrm {ours:.1f} s, BMRM 2.1 {their_wall:.1f} s "
                      f"({ours / their_wall:.3f}x); CPU to that gap (the solver's, rank 0): prbmrm "
                      f"{ours_cpu:.1f} s at iteration {seconds_to_gap(history, target, 'iteration')}, "
                      f"BMRM 2.1 {theirs['cpu'][first]:.1f} s at iteration {first + 1} "
                      f"({ours_cpu / theirs['cpu'][first]:.3f}x); peak RSS by then prbmrm "
                      f"{seconds_to_gap(history, target, 'rss') / 2**30:.2f} GiB vs BMRM 2.1's "
                      f"{theirs['rss'] / 2**30:.2f} GiB over its run "
                      f"({seconds_to_gap(history, target, 'rss') / theirs['rss']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
