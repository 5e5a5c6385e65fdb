"""Benchmark what the timeout-capable waiting (--rank-timeout) costs per BMRM iteration.

Trains hinge BMRM on a9a (32,561 x 123, sharded in 3) on 3 ranks for a fixed
number of iterations (no stopping test), alternately with the default
``--rank-timeout`` (collectives polled with Test and short sleeps, a ping
thread per rank) and with ``--rank-timeout 0`` (the same nonblocking
collectives completed by a blocking MPI_Wait, no deadline: MPICH's own busy
wait), so load on the machine hits both alike. Printed per run: seconds per
iteration (the solver loop: the last row's ``seconds_total`` over the
iterations) and the CPU seconds of all ranks per iteration (from
getrusage of the children); then the medians and the overhead of polling
over blocking per iteration.

    python scripts/bench_wait.py [--repeats 5] [--iterations 300] [--ranks 3]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data", "a9a.xz")


def run(shards, out, ranks, iterations, timeout):
    """Train once; return (iterations, wall seconds per iteration, CPU seconds per iteration)."""
    from prbmrm.model import load_model

    command = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "prbmrm.cli.train", "--data", shards,
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=3)
    args = parser.parse_args()
    from prbmrm.distributed.watch import DEFAULT_TIMEOUT

    with tempfile.TemporaryDirectory() as work:
        shards = os.path.join(work, "shards")
        subprocess.run([sys.executable, "-m", "prbmrm.cli.shard", DATA, "--parts", str(args.ranks), "--out", shards,
                        "--quiet"], check=True, env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.DEVNULL)
        modes = {"polled (--rank-timeout %g)" % DEFAULT_TIMEOUT: DEFAULT_TIMEOUT, "blocking (--rank-timeout 0)": 0}
        results = {name: [] for name in modes}
        print(f"a9a, {args.ranks} ranks, {args.iterations} iterations per run, runs alternating")
        for repeat in range(args.repeats):
            for name, timeout in modes.items():
                nit, wall, cpu = run(shards, os.path.join(work, "m.h5"), args.ranks, args.iterations, timeout)
                results[name].append((wall, cpu))
                print(f"  run {repeat + 1} {name:30s} {nit} iterations: {1e3 * wall:7.2f} ms/iteration, "
                      f"CPU {1e3 * cpu:7.2f} ms/iteration (all ranks, load and setup included)", flush=True)
        medians = {name: (statistics.median(w for w, _ in rows), statistics.median(c for _, c in rows))
                   for name, rows in results.items()}
        for name, (wall, cpu) in medians.items():
            print(f"median {name:30s} {1e3 * wall:7.2f} ms/iteration, CPU {1e3 * cpu:7.2f} ms/iteration")
        (polled, _), (blocking, _) = medians.values()
        print(f"overhead of timeout-capable waiting per iteration: {100 * (polled / blocking - 1):+.1f}%")


if __name__ == "__main__":
    main()
