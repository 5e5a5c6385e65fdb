"""Iterations and seconds of BMRM, LS-BMRM and the proximal bundle method to come within 1% of the optimum.

For each data set and lam, every run starts from w = 0 and is scored by paper
000's eq. 17, ``J(w_t) - J* <= 0.01 J*`` (Fig. 8): the iterations (risk
evaluations) and seconds until the best objective so far first satisfies it.
The runs are BMRM (``bmrm``, unlimited bundle), LS-BMRM (``lsbmrm``, theta
0.9), the proximal bundle method (``proximal``) and BMRM with bundle sizes
k = 50, 10 and 2 (``bundle_size``, Fig. 5; unlimited k is the BMRM run).

J*: all runs of one (set, lam) share a bracket [largest certified lower bound,
smallest objective] of min J. J* is its upper end, the smallest objective any
run reached, reported with the bracket's relative width. The first run
(``proximal``, which certifies tight gaps fastest here, unless ``--runs``
leaves it out) is the reference: it
runs until the bracket is within ``--ref-gap`` (default 1e-4) relative, or its
caps. Each later run stops as soon as its best objective is within 1% of the
bracket's lower end (so within 1% of the final J* too), but only once the
bracket is tight: if the reference did not certify it, the next run goes on
as the reference. A bracket left wider than ``--ref-gap`` is flagged ``!`` in
the tables (J* is then an upper estimate, and the counts are optimistic by at
most that width). A run that never gets within 1% within ``--max-iter``
iterations or ``--max-seconds`` seconds is reported as ``>N`` (N: its
iterations). Seconds are CPU seconds of this process (BLAS limited to one
thread), so that the caps and the figures depend less on the machine's load.

Writes the tables (markdown) to stdout, ``figures.json`` (every figure of the
tables) and one PNG per data set of ``(min_{i<=t} J(w_i) - J*) / J*`` against
the iteration t (one panel per lam, log scale) to ``--out``.

With ``--certified GAP`` it measures instead what ``--solver auto`` (:mod:`prbmrm.solvers.auto`) is
judged by: for each set, loss and lam, every solver that applies (``dcd`` for the hinge loss, ``tron``
for twice differentiable losses, ``proximal``, ``bmrm``, ``lsbmrm``) and ``auto`` from w = 0 to the
certified absolute gap GAP (``--epsilon GAP --rel-epsilon 0``): CPU seconds, iterations (dcd: its
certificates and passes), auto's pick, and auto's CPU over the fastest solver's. The sets then include
``kddcup99`` and planted ones made with a fixed seed (:func:`planted_sets`): sparse rows of values
+-[1, 2] (``planted30k``: 30,000 x 2,000, 1% nonzeros; ``planted200k``: 200,000 x 1,000, 10 a row),
0/1 rows (``planted01``: 50,000 x 500, 15 ones a row) and dense Gaussian rows (``dense20k``: 20,000 x
50), labels from a random w plus noise.

Usage (from the repository root, with prbmrm installed or on PYTHONPATH)::

    python scripts/bench_solvers.py [--sets a9a w8a dna letter] [--lams 1e-3 1e-4 1e-5 1e-6]
        [--max-iter 5000] [--max-seconds 60] [--ref-gap 1e-4] [--theta 0.9] [--runs proximal lsbmrm ...]
        [--out bench_solvers_out]
    python scripts/bench_solvers.py --certified 1e-4 [--sets a9a w8a kddcup99 planted01 ...] [--lams ...]
        [--losses hinge logistic] [--runs dcd proximal bmrm lsbmrm tron] [--max-seconds 60]
"""

import argparse
import json
import lzma
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_svmlight_file
from threadpoolctl import threadpool_limits

from prbmrm.distributed.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import minimize

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SETS = {"a9a": ("a9a.xz", "hinge"), "w8a": ("w8a.xz", "hinge"),
        "dna": ("dna.scale.xz", "multiclass_hinge"), "letter": ("letter.scale.xz", "multiclass_hinge"),
        "kddcup99": ("kddcup99_10pct.binary.xz", "hinge")}
CERTIFIED_SOLVERS = ("dcd", "tron", "proximal", "bmrm", "lsbmrm")
"""The solvers ``--certified`` runs where they apply, against ``auto``."""
TOLERANCE = 0.01
"""Eq. 17's relative tolerance."""


def runs(theta=0.9):
    """The runs as (label, solver, options), the J* reference first."""
    return [("proximal", "proximal", {}), ("lsbmrm", "lsbmrm", {"theta": theta}), ("bmrm", "bmrm", {}),
            ("bmrm k=50", "bmrm", {"bundle_size": 50}), ("bmrm k=10", "bmrm", {"bundle_size": 10}),
            ("bmrm k=2", "bmrm", {"bundle_size": 2})]


def planted_sets():
    """The generated sets of ``--certified``: name -> function returning (X, y), labels from a random w plus noise."""
    from bench_liblinear import planted

    def planted01(rows=50_000, d=500, per_row=15, seed=0):
        import scipy.sparse as sp

        rng = np.random.default_rng(seed)
        indices = np.sort(rng.integers(0, d, size=(rows, per_row)), axis=1)
        X = sp.csr_matrix((np.ones(rows * per_row), indices.ravel(), np.arange(0, rows * per_row + 1, per_row)),
                          shape=(rows, d))
        X.sum_duplicates()
        X.data[:] = 1.0  # a column drawn twice in a row is one indicator
        return X, noisy_labels(X, rng)

    def dense(rows=20_000, d=50, seed=0):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(rows, d))
        return X, noisy_labels(X, rng)

    return {"planted30k": lambda: planted(30_000, d=2_000, per_row=20), "planted200k": lambda: planted(200_000),
            "planted01": planted01, "dense20k": dense}


def noisy_labels(X, rng):
    """sign(<w, x> + noise) for a random w, the noise half the margins' standard deviation (as bench_liblinear's)."""
    f = X @ rng.normal(size=X.shape[1])
    return np.where(f + 0.5 * np.std(f) * rng.normal(size=X.shape[0]) > 0, 1.0, -1.0)


def load(name):
    """(X as CSR, y, loss name) of a data set."""
    if name in planted_sets():
        X, y = planted_sets()[name]()
        return X, y, "hinge"
    path, loss_name = SETS[name]
    with lzma.open(DATA / path) as f:
        X, y = load_svmlight_file(f)
    return X.tocsr(), y, loss_name


def oracle(X, y, loss_name):
    """The serial risk oracle of the examples (X, y) with the loss `loss_name`."""
    loss = get_loss(loss_name)
    if loss_name == "multiclass_hinge":
        loss.prepare(np.unique(y), "integer")
    return DistributedRisk(loss, X, y, len(y), SerialComm())


def reached(history, optimum):
    """First iteration (from 1) whose best objective satisfies eq. 17 for `optimum` (None if never)."""
    hits = np.flatnonzero(history["best_objective"] - optimum <= TOLERANCE * optimum)
    return int(hits[0]) + 1 if hits.size else None


def bench(risk, lam, plan, *, max_iter=5000, max_seconds=60.0, ref_gap=1e-4):
    """Run every solver of `plan` on `risk` at `lam` and score it by eq. 17.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp, a)`` with a ``dim`` attribute.
    lam : float
    plan : list of (str, str, dict)
        (label, solver name, solver options) per run, the J* reference first (see :func:`runs`).
    max_iter : int
        Most iterations per run.
    max_seconds : float
        Each run stops at its first iteration past this many CPU seconds.
    ref_gap : float
        Runs go on until the shared bracket of min J is this tight (relative).

    Returns
    -------
    dict
        ``optimum`` (J*), ``lower_bound`` (the bracket's lower end), ``width``
        (``(J* - lower_bound) / J*``) and ``runs``: per run its label,
        solver, options, ``iterations`` and ``seconds`` to eq. 17 (None if
        never), ``nit``, ``seconds_total``, ``message``, ``fun``,
        ``run_lower_bound``, ``history`` (the solver's, arrays) and
        ``cpu_seconds`` (array, per iteration). Seconds are CPU seconds of
        this process since the run started.
    """
    bracket = [-np.inf, np.inf]  # largest lower bound, smallest objective so far
    results = []
    for label, method, options in plan:
        started = time.process_time()
        seconds = []  # CPU seconds at each iteration

        def callback(row):
            seconds.append(time.process_time() - started)
            bracket[0] = max(bracket[0], row.lower_bound)
            bracket[1] = min(bracket[1], row.best_objective)
            tight = bracket[1] - bracket[0] <= ref_gap * bracket[1]
            if (tight and row.best_objective - bracket[0] <= TOLERANCE * bracket[0]) or seconds[-1] > max_seconds:
                raise StopIteration

        result = minimize(risk, np.zeros(risk.dim), lam, method=method, rel_epsilon=ref_gap, max_iter=max_iter,
                          callback=callback, **options)
        results.append({"label": label, "solver": method, "options": options, "nit": result.nit,
                        "seconds_total": seconds[-1], "message": result.message, "fun": result.fun,
                        "run_lower_bound": result.lower_bound, "history": result.history,
                        "cpu_seconds": np.asarray(seconds)})
    optimum, lower = bracket[1], bracket[0]
    for run in results:
        hit = reached(run["history"], optimum)
        run["iterations"] = hit
        run["seconds"] = None if hit is None else float(run["cpu_seconds"][hit - 1])
    return {"optimum": optimum, "lower_bound": lower, "width": (optimum - lower) / optimum, "runs": results}


def certified(risk, lam, solvers, gap, *, max_iter=100_000, max_seconds=60.0, rounds=1):
    """CPU seconds of each of `solvers` and of ``auto`` from w = 0 to the certified absolute gap `gap`.

    Returns
    -------
    dict
        solver name -> ``seconds`` (CPU seconds of this process, the least over `rounds` rounds, each running
        every solver in turn; None if the gap was not certified within `max_iter` iterations or
        `max_seconds`), and of the last round ``nit``, ``gap``, ``fun``, ``lower_bound`` and ``message``;
        ``auto`` also ``pick``, :func:`~prbmrm.solvers.auto.pick_solver`'s.
    """
    from prbmrm.regularizers import get_regularizer
    from prbmrm.solvers.auto import pick_solver

    outcome = {}
    for method in [*solvers, "auto"] * rounds:
        if method in outcome and outcome[method]["seconds"] is None:
            continue  # not certified within the limits: not run again
        started = time.process_time()

        def callback(row):
            if time.process_time() - started > max_seconds:
                raise StopIteration

        result = minimize(risk, np.zeros(risk.dim), lam, method=method, epsilon=gap, rel_epsilon=0.0,
                          max_iter=max_iter, callback=callback)
        seconds = time.process_time() - started if result.gap <= gap else None
        if method in outcome:
            seconds = None if seconds is None else min(seconds, outcome[method]["seconds"])
        outcome[method] = {"seconds": seconds, "nit": result.nit, "gap": result.gap, "fun": result.fun,
                           "lower_bound": result.lower_bound, "message": result.message}
    outcome["auto"]["pick"] = pick_solver(risk, get_regularizer("l2"))[0]
    return outcome


def certified_table(outcomes, solvers):
    """Markdown: per (set, loss, lam) each solver's 'CPU s (iterations)', auto's pick and its ratio to the fastest."""
    lines = ["| data | loss | lam | " + " | ".join(solvers) + " | auto (pick) | auto / fastest |",
             "| --- | --- | --- | " + " | ".join("---" for _ in solvers) + " | --- | --- |"]
    for (name, loss_name, lam), outcome in outcomes.items():
        cells, times = [], []
        for method in solvers:
            run = outcome.get(method)
            if run is None:
                cells.append("")
                continue
            passes = run["message"].rsplit("after ", 1)[-1] if method == "dcd" and "passes" in run["message"] else ""
            iterations = f"{run['nit']:,}" + (f", {passes}" if passes else "")
            cells.append(f"{run['seconds']:.2f} ({iterations})" if run["seconds"] is not None
                         else f"gap {run['gap']:.1e} ({iterations})")
            if run["seconds"] is not None:
                times.append(run["seconds"])
        auto = outcome["auto"]
        ratio = f"{auto['seconds'] / min(times):.2f}" if auto["seconds"] is not None and times else "-"
        handed = " + bmrm" if "then bmrm" in auto["message"] else ""
        lines.append(f"| {name} | {loss_name} | {lam:.0e} | " + " | ".join(cells)
                     + f" | {auto['seconds'] or float('nan'):.2f} ({auto['pick']}{handed}) | {ratio} |")
    return "\n".join(lines)


def main_certified(args):
    """The ``--certified`` mode: the table of :func:`certified_table`, and the runs as JSON in ``--out``."""
    from prbmrm.regularizers import get_regularizer
    from prbmrm.solvers.tron import newton_ready

    outcomes = {}
    for name in args.sets:
        X, y, _ = load(name)
        for loss_name in args.losses:
            risk = oracle(X, y, loss_name)
            newton = newton_ready(risk, get_regularizer("l2")) is None and risk.loss.twice_differentiable
            solvers = [method for method in args.runs
                       if (method != "dcd" or loss_name == "hinge") and (method != "tron" or newton)]
            for lam in args.lams:
                outcome = certified(risk, lam, solvers, args.certified, max_seconds=args.max_seconds,
                                    rounds=args.rounds)
                outcomes[name, loss_name, lam] = outcome
                print(f"{name} {loss_name} lam {lam:.0e}: " + "; ".join(
                    f"{method} {run['seconds'] if run['seconds'] is None else round(run['seconds'], 3)} s "
                    f"nit {run['nit']}" for method, run in outcome.items()), flush=True)
    print(f"\nCPU seconds (iterations) from w = 0 to the certified gap {args.certified:g}, the least of "
          f"{args.rounds} round(s); gap G: not certified within --max-seconds {args.max_seconds:g}.\n")
    print(certified_table(outcomes, [method for method in CERTIFIED_SOLVERS if method in args.runs]))
    figures = [{"set": name, "loss": loss_name, "lam": lam, "runs": outcome}
               for (name, loss_name, lam), outcome in outcomes.items()]
    (args.out / "certified.json").write_text(json.dumps(figures, indent=1))


def cell(run):
    """'iterations (seconds)', or '>nit (seconds_total)' if the run never satisfied eq. 17."""
    if run["iterations"] is None:
        return f">{run['nit']:,} ({run['seconds_total']:.2f} s)"
    return f"{run['iterations']:,} ({run['seconds']:.2f} s)"


def table(outcomes, labels, ref_gap):
    """Markdown table: one row per (set, lam), one column per run label."""
    lines = ["| data | lam | J* (bracket width) | " + " | ".join(labels) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in labels) + " |"]
    for (name, lam), outcome in outcomes.items():
        by_label = {run["label"]: run for run in outcome["runs"]}
        flag = " !" if outcome["width"] > ref_gap else ""
        lines.append(f"| {name} | {lam:.0e} | {outcome['optimum']:.6g} ({outcome['width']:.1e}{flag}) | "
                     + " | ".join(cell(by_label[label]) for label in labels) + " |")
    return "\n".join(lines)


def plot(outcomes, name, lams, out):
    """One PNG for the data set `name`: relative suboptimality against iteration, a panel per lam."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(lams), figsize=(4.5 * len(lams), 4), squeeze=False)
    for ax, lam in zip(axes[0], lams):
        outcome = outcomes[name, lam]
        optimum = outcome["optimum"]
        for run in outcome["runs"]:
            gap = (run["history"]["best_objective"] - optimum) / optimum
            # The run that found J* ends at gap 0, which a log scale cannot show.
            gap = np.where(gap > 0, gap, np.nan)
            ax.plot(np.arange(1, len(gap) + 1), gap, label=run["label"])
        ax.axhline(TOLERANCE, color="gray", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{name}, lam {lam:.0e}")
        ax.set_xlabel("iteration t")
    axes[0, 0].set_ylabel("(min_{i<=t} J(w_i) - J*) / J*")
    axes[0, -1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["a9a", "w8a", "dna", "letter"],
                        choices=[*SETS, *planted_sets()])
    parser.add_argument("--lams", nargs="+", type=float, default=[1e-3, 1e-4, 1e-5, 1e-6])
    parser.add_argument("--max-iter", type=int, default=5000, help="iterations per run (default 5000)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="CPU seconds per run (default 60)")
    parser.add_argument("--ref-gap", type=float, default=1e-4,
                        help="relative width of the J* bracket the runs certify (default 1e-4)")
    parser.add_argument("--theta", type=float, default=0.9, help="LS-BMRM's theta (default 0.9)")
    labels = [label for label, _, _ in runs()]
    parser.add_argument("--runs", nargs="+", default=None, choices=[*labels, *CERTIFIED_SOLVERS],
                        help="the runs to make (default all; the first made is the J* reference)")
    parser.add_argument("--certified", type=float, default=None, metavar="GAP",
                        help="time every solver and auto to this certified absolute gap instead")
    parser.add_argument("--losses", nargs="+", default=["hinge"], help="with --certified (default hinge)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --certified: rounds of every solver in turn, the least CPU time kept (default 1)")
    parser.add_argument("--out", type=Path, default=Path("bench_solvers_out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.certified is not None:
        args.runs = args.runs or [method for method in CERTIFIED_SOLVERS]
        return main_certified(args)
    args.runs = args.runs or labels
    plan = [run for run in runs(args.theta) if run[0] in args.runs]
    outcomes = {}
    for name in args.sets:
        X, y, loss_name = load(name)
        risk = oracle(X, y, loss_name)
        for lam in args.lams:
            outcome = bench(risk, lam, plan, max_iter=args.max_iter, max_seconds=args.max_seconds,
                            ref_gap=args.ref_gap)
            outcomes[name, lam] = outcome
            print(f"{name} lam {lam:.0e}: J* {outcome['optimum']:.6g} in [{outcome['lower_bound']:.6g}, "
                  f"{outcome['optimum']:.6g}]; " + "; ".join(f"{run['label']} {cell(run)}"
                                                             for run in outcome["runs"]), flush=True)
        plot(outcomes, name, args.lams, args.out)
    print("\nIterations (CPU seconds) to J(w_t) - J* <= 0.01 J* (paper 000, eq. 17); >N: not within N "
          f"iterations (--max-iter {args.max_iter}, --max-seconds {args.max_seconds:g}); ! marks a J* bracket "
          f"wider than {args.ref_gap:g}.\n")
    print(table(outcomes, [label for label in ("bmrm", "lsbmrm", "proximal") if label in args.runs], args.ref_gap))
    sizes = [label for label in ("bmrm k=2", "bmrm k=10", "bmrm k=50", "bmrm") if label in args.runs]
    if len(sizes) > 1:
        print("\nBMRM by bundle size k (paper 000, Fig. 5; k = unlimited is the bmrm run above):\n")
        print(table(outcomes, sizes, args.ref_gap))
    arrays = ("history", "cpu_seconds")
    figures = [{"set": name, "lam": lam, **{k: v for k, v in outcome.items() if k != "runs"},
                "runs": [{k: v for k, v in run.items() if k not in arrays} for run in outcome["runs"]]}
               for (name, lam), outcome in outcomes.items()]
    (args.out / "figures.json").write_text(json.dumps(figures, indent=1))
    print(f"\nPlots and figures.json in {args.out}/")


if __name__ == "__main__":
    with threadpool_limits(1):
        main()
