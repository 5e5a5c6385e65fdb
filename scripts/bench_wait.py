"""Benchmark the waits of the ranks: what the rank timeout costs, and the polled wait against MPI's own.

Two measurements, each alternating its runs so that load on the machine hits all alike.

Default: the rank timeout's cost per BMRM iteration. Trains hinge BMRM on a9a (32,561 x 123, in as many
shards as ranks) for a fixed number of iterations (no stopping test) with the default ``--rank-timeout``
and with ``--rank-timeout 0``. Both poll their nonblocking collectives with ``Test`` and short sleeps
(:mod:`prbmrm.distributed.watch`); the second never checks a deadline nor pings. Printed per run:
seconds per iteration (the solver loop: the last row's ``seconds_total`` over the iterations) and the
CPU seconds of all ranks per iteration (getrusage of the children, start-up included); then the medians.

``--pattern``: one BMRM iteration's communication without the rest of prbmrm, on P ranks, the watch's
polled wait (:meth:`prbmrm.distributed.watch.Watch.wait`) against MPI's blocking ``MPI_Wait`` on the same
requests (MPICH's own wait: it spins), and, where the ranks outnumber the cores, against the node relay
(:mod:`prbmrm.distributed.relay`: the same broadcast and Allreduce through the node's leader, the other
ranks sleeping in the kernel). Per iteration rank 0 computes ``--subproblem-ms`` (the QP), an
``Ibcast`` of d doubles (w) follows, every rank computes ``--work-ms / P`` (its share of the risk, CPU
time), then an ``Iallreduce`` of ``2 (d + 1) + 5`` int64 (the limbs and the status words). The defaults
are kddcup99's (d = 118; the 1-process risk and subproblem of ``bench_scale.py --data kdd64``). Printed:
per run, rank 0's communication (both waits, the wait for the other ranks' work included) and wall ms
per iteration, medians over the iterations after the first 10, and the CPU ms per iteration of all ranks
in the loop; then per wait the medians over the rounds and the communication against the smallest P's.
Where MPI's own wait grows as much with P as the polled one, the growth is the machine's (ranks that
share cores), not the waiting's.

    python scripts/bench_wait.py [--repeats 5] [--iterations 300] [--ranks 3]
    python scripts/bench_wait.py --pattern --ranks 8 64 [--repeats 3] [--iterations 300]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data", "a9a.xz")
WAITS = ("polled (Watch.wait)", "MPI_Wait", "node relay")
MODES = ("polled", "blocking", "relay")


def mpiexec():
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else "mpiexec"


def train(shards, out, ranks, iterations, timeout):
    """Train once; return (iterations, wall seconds per iteration, CPU seconds per iteration)."""
    from prbmrm.model import load_model

    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "prbmrm.cli.train", "--data", shards,
               "--lam", "1e-4", "--rel-epsilon", "0", "--max-iter", str(iterations), "--quiet",
               "--out", out, "--rank-timeout", str(timeout)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, timeout=1800, stdin=subprocess.DEVNULL,
                   env=dict(os.environ, PYTHONPATH=REPO))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    model = load_model(out)
    nit = int(model.attrs["iterations"])
    return nit, float(model.history["seconds_total"][-1]) / nit, cpu / nit


def timeout_cost(args):
    """The default measurement: a9a trained with the default --rank-timeout and with 0, alternately."""
    from prbmrm.distributed.watch import DEFAULT_TIMEOUT

    with tempfile.TemporaryDirectory() as work:
        for ranks in args.ranks:
            shards = os.path.join(work, f"shards{ranks}")
            subprocess.run([sys.executable, "-m", "prbmrm.cli.shard", DATA, "--parts", str(ranks), "--out", shards,
                            "--quiet"], check=True, env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.DEVNULL)
            modes = {f"--rank-timeout {DEFAULT_TIMEOUT:g}": DEFAULT_TIMEOUT, "--rank-timeout 0": 0}
            results = {name: [] for name in modes}
            print(f"a9a, {ranks} ranks, {args.iterations} iterations per run, runs alternating")
            for repeat in range(args.repeats):
                for name, timeout in modes.items():
                    nit, wall, cpu = train(shards, os.path.join(work, "m.h5"), ranks, args.iterations, timeout)
                    results[name].append((wall, cpu))
                    print(f"  run {repeat + 1} {name:20s} {nit} iterations: {1e3 * wall:7.2f} ms/iteration, "
                          f"CPU {1e3 * cpu:7.2f} ms/iteration (all ranks, start-up included)", flush=True)
            for name, rows in results.items():
                print(f"median {name:20s} {1e3 * statistics.median(w for w, _ in rows):7.2f} ms/iteration, "
                      f"CPU {1e3 * statistics.median(c for _, c in rows):7.2f} ms/iteration")


def busy(seconds):
    """Compute for `seconds` of this thread's CPU time (a share of the risk, or the QP)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def pattern_rank(args):
    """One rank of ``--pattern``: the iterations, then rank 0 prints the figures as one JSON line."""
    import numpy as np
    from mpi4py import MPI

    from prbmrm.distributed.comm import MPIComm

    comm = MPIComm()  # initializes MPI as a training does, and starts the rank's watch
    mpi = comm.comm

    if args.pattern_rank == "polled":
        wait = comm.watch.wait
    else:
        def wait(request, what):
            request.Wait()
    size, rank = mpi.Get_size(), mpi.Get_rank()
    w = np.zeros(args.dim)
    limbs = np.ones(2 * (args.dim + 1) + 5, dtype=np.int64)
    total = np.empty_like(limbs)
    if args.pattern_rank == "relay":
        if comm.relay is None:
            raise SystemExit("bench_wait: the node relay is off (this node's ranks do not share cores)")

        def broadcast():
            comm.bcast_array(w)

        def reduce():
            total[:] = limbs
            comm.allreduce_sum(total)
    else:
        def broadcast():
            wait(mpi.Ibcast(w, root=0), "a broadcast")

        def reduce():
            wait(mpi.Iallreduce(limbs, total, op=MPI.SUM), "a sum over ranks")
    comm_seconds, wall_seconds = [], []
    mpi.Barrier()
    cpu0 = time.process_time()
    for _ in range(args.iterations):
        started = time.perf_counter()
        if rank == 0:
            busy(args.subproblem_ms / 1e3)
        before = time.perf_counter()
        broadcast()
        after = time.perf_counter()
        busy(args.work_ms / 1e3 / size)
        reduced = time.perf_counter()
        reduce()
        done = time.perf_counter()
        assert total[0] == size
        comm_seconds.append((after - before) + (done - reduced))
        wall_seconds.append(done - started)
    cpus = mpi.gather(time.process_time() - cpu0, root=0)
    if rank == 0:
        steady = slice(10, None) if args.iterations > 20 else slice(None)
        print(json.dumps({"comm": 1e3 * statistics.median(comm_seconds[steady]),
                          "wall": 1e3 * statistics.median(wall_seconds[steady]),
                          "cpu": 1e3 * sum(cpus) / args.iterations}), flush=True)


def pattern(args):
    """``--pattern``: the polled wait against MPI_Wait at each rank count, alternating."""
    rows = []
    print(f"one iteration's communication, d = {args.dim}, rank 0 computes {args.subproblem_ms:g} ms, the "
          f"ranks {args.work_ms:g} ms between them; {args.iterations} iterations per run, runs alternating")
    print("\n| round | P | wait | comm ms/iteration | wall ms/iteration | CPU ms/iteration (all ranks) |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for repeat in range(args.repeats):
        for ranks in args.ranks:
            for wait, mode in zip(WAITS, MODES):
                if mode == "relay" and ranks <= (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                                 else os.cpu_count()):
                    continue  # the ranks have a core each: no relay
                command = [mpiexec(), "-n", str(ranks), sys.executable, os.path.abspath(__file__),
                           "--pattern-rank", mode, "--iterations", str(args.iterations), "--dim", str(args.dim),
                           "--work-ms", str(args.work_ms), "--subproblem-ms", str(args.subproblem_ms)]
                done = subprocess.run(command, check=True, timeout=1800, stdin=subprocess.DEVNULL,
                                      capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO))
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append((ranks, wait, figures))
                print(f"| {repeat + 1} | {ranks} | {wait} | {figures['comm']:.2f} | {figures['wall']:.2f} | "
                      f"{figures['cpu']:.1f} |", flush=True)
    print("\n| wait | P | rounds | comm ms/iteration | comm / smallest P's | wall ms/iteration |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for wait in WAITS:
        smallest = None
        for ranks in args.ranks:
            runs = [figures for p, name, figures in rows if p == ranks and name == wait]
            if not runs:
                continue
            comm = statistics.median(f["comm"] for f in runs)
            smallest = comm if smallest is None else smallest
            print(f"| {wait} | {ranks} | {len(runs)} | {comm:.2f} | {comm / smallest:.2f}x | "
                  f"{statistics.median(f['wall'] for f in runs):.2f} |")
    print(f"\nload average (1 min) at the end: {os.getloadavg()[0]:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--ranks", type=int, nargs="+", default=[3])
    parser.add_argument("--pattern", action="store_true", help="one iteration's communication: the polled wait "
                        "against MPI_Wait")
    parser.add_argument("--dim", type=int, default=118, help="--pattern: d (default kddcup99's 118)")
    parser.add_argument("--work-ms", type=float, default=12.0,
                        help="--pattern: the risk's CPU ms per iteration, shared by the ranks (default 12)")
    parser.add_argument("--subproblem-ms", type=float, default=0.7,
                        help="--pattern: rank 0's CPU ms per iteration before the broadcast (default 0.7)")
    parser.add_argument("--pattern-rank", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pattern_rank:
        pattern_rank(args)
    elif args.pattern:
        pattern(args)
    else:
        timeout_cost(args)


if __name__ == "__main__":
    main()
