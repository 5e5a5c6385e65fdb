"""Train with two source trees of prbmrm and check the results are bitwise the same.

For a layout change (modules moved, nothing computed differently): each tree
shards the same input with its own ``prbmrm.cli.shard`` and trains with its own
``prbmrm.cli.train`` on 1, 2 and 3 ranks; the model files must hold the same
weights (bytes of ``/w`` and ``/bias``) and the same history (every column but
the seconds), and the shard files the same arrays.

Usage::

    git worktree add /tmp/base 5d8d09f
    python scripts/compare_trees.py --base /tmp/base [--new .] [--ranks 1 2 3] [--cases demo a9a dna]

Prints one line per case and rank count (iterations, CPU and wall seconds of
each tree, and whether w and the history match) and exits 1 on any mismatch.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")

# name: (input file or None for the embedded demo, shard options, train options)
CASES = {
    "demo": (None, [], ["--lam", "1e-3"]),
    "a9a": ("a9a.xz", [], ["--lam", "1e-4", "--bias"]),
    "dna": ("dna.scale.xz", [], ["--loss", "multiclass_hinge", "--lam", "1e-3"]),
}
PARTS = 6  # shard files of a set: 1, 2 and 3 ranks all divide them


def run(tree, args, ranks=1):
    """Run ``python -m ARGS`` with `tree` first on the path; return (stdout, CPU seconds of children, wall)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    command = [sys.executable, "-m", *args]
    if ranks > 1:
        command = ["mpiexec", "-n", str(ranks), *command]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=3600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{tree}: {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def model_arrays(path):
    """The bytes of the weights and of the bias attribute, and the history columns but the seconds."""
    with h5py.File(path, "r") as f:
        history = {name: f["history"][name][()] for name in f["history"] if not name.startswith("seconds")}
        return f["w"][()].tobytes(), np.asarray(f.attrs["bias"]).tobytes(), history


def shard_arrays(directory):
    """Every dataset of every shard file of `directory`, by file and name."""
    arrays = {}
    for name in sorted(os.listdir(directory)):
        with h5py.File(os.path.join(directory, name), "r") as f:
            f.visititems(lambda key, item: arrays.__setitem__((name, key), item[()])
                         if isinstance(item, h5py.Dataset) else None)
    return arrays


def same_arrays(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the reference tree (e.g. a worktree of main)")
    parser.add_argument("--new", default=".", help="the tree to check (default: .)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    trees = {"base": args.base, "new": args.new}
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            source, shard_options, train_options = CASES[case]
            data = {}
            for label, tree in trees.items():
                if source is None:
                    data[label] = []
                    continue
                out = os.path.join(tmp, f"{case}-{label}")
                run(tree, ["prbmrm.cli.shard", os.path.join(DATA, source), "--parts", str(PARTS), "--out", out,
                           "--quiet", *shard_options])
                data[label] = ["--data", out]
            if source is not None:
                shards_same = same_arrays(*(shard_arrays(data[label][1]) for label in trees))
                print(f"{case}: shard files {'identical arrays' if shards_same else 'DIFFER'}", flush=True)
                failures += not shards_same
            for ranks in args.ranks:
                results, figures = {}, []
                for label, tree in trees.items():  # base, then new: alternating, so load hits both alike
                    model = os.path.join(tmp, f"{case}-{label}-{ranks}.h5")
                    _, cpu, wall = run(tree, ["prbmrm.cli.train", *data[label], *train_options, "--out", model,
                                              "--quiet"], ranks)
                    results[label] = model_arrays(model)
                    figures.append(f"{label} {len(results[label][2]['iteration'])} it, "
                                   f"cpu {cpu:.2f} s, wall {wall:.2f} s")
                (w0, b0, h0), (w1, b1, h1) = results["base"], results["new"]
                w_same, h_same = w0 == w1 and b0 == b1, same_arrays(h0, h1)
                failures += not (w_same and h_same)
                print(f"{case} on {ranks} rank(s): w {'bitwise equal' if w_same else 'DIFFERS'}, history "
                      f"{'bitwise equal' if h_same else 'DIFFERS'} ({'; '.join(figures)})", flush=True)
    print("all equal" if not failures else f"{failures} mismatch(es)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
