"""Plot training runs: ``python -m prbmrm.cli.plot MODEL.h5 [MODEL.h5 ...] --out PREFIX``.

Reads the progress table (``/history``) of each model file and writes two PNG
files: ``PREFIX-gap.png``, the gap (best objective - lower bound) against
the iteration on a log scale, and ``PREFIX-objective.png``, the best
objective against the elapsed seconds. Each run is labelled by its solver,
loss and lam. Needs matplotlib (``pip install 'prbmrm[plot]'``); it is
imported only here, with the Agg backend, so no display is needed.

Imports: matplotlib, numpy; of prbmrm: :mod:`prbmrm.cli.common`, :mod:`prbmrm.errors`,
:mod:`prbmrm.model`.
"""

import os
import sys
from collections import Counter

import numpy as np

from .common import ArgumentParser, run
from ..errors import InputError
from ..model import check_writable, load_model

PLOTS = {
    "gap": ("iteration", "gap", "iteration", "gap (best objective - lower bound)"),
    "objective": ("seconds_total", "best_objective", "seconds", "best objective J(w)"),
}
"""Plot name: (x column, y column, x label, y label); written to ``PREFIX-NAME.png``."""


def read_runs(paths):
    """Return ``[(label, history)]`` of the model files, labelled by solver, loss and lam.

    A label shared by several runs gets the file name appended.

    Raises
    ------
    InputError
        If a file is missing, not a prbmrm model, or has no progress table.
    """
    runs = []
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such model file")
        model = load_model(path)
        missing = sorted({column for spec in PLOTS.values() for column in spec[:2]} - set(model.history))
        if missing:
            raise InputError(f"{path}: the model has no training history to plot "
                             f"(/history lacks {', '.join(missing)})")
        if not len(model.history["iteration"]):
            raise InputError(f"{path}: the model's training history is empty")
        attrs = model.attrs
        label = f"{attrs.get('solver', '?')} / {attrs.get('loss', '?')} / lam={attrs.get('lam', float('nan')):g}"
        runs.append((label, model.history, path))
    counts = Counter(label for label, _, _ in runs)
    return [(f"{label} ({os.path.basename(path)})" if counts[label] > 1 else label, history)
            for label, history, path in runs]


def pyplot():
    """Return matplotlib.pyplot on the Agg backend.

    Raises
    ------
    InputError
        If matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'prbmrm[plot]'") from None
    return plt


def write_plots(runs, prefix):
    """Write ``PREFIX-gap.png`` and ``PREFIX-objective.png`` of `runs` atomically; return their paths."""
    plt = pyplot()
    written = []
    for name, (x, y, x_label, y_label) in PLOTS.items():
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for label, history in runs:
            axes.plot(history[x], history[y], label=label)
        values = np.concatenate([np.asarray(history[y], dtype=np.float64) for _, history in runs])
        if np.all(values > 0):  # a gap reaching exactly 0 would vanish from a log axis
            axes.set_yscale("log")
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        path = f"{prefix}-{name}.png"
        temporary = os.path.join(os.path.dirname(os.path.abspath(path)),
                                 f".{os.path.basename(path)}.tmp-{os.getpid()}")
        try:
            figure.savefig(temporary, format="png", dpi=100)
            os.replace(temporary, path)
        finally:
            plt.close(figure)
            if os.path.exists(temporary):
                os.remove(temporary)
        written.append(path)
    return written


def main(argv, comm):
    """Entry point of ``python -m prbmrm.cli.plot``; returns the exit status."""
    parser = ArgumentParser(prog="prbmrm.cli.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", metavar="MODEL.h5", help="model files written by prbmrm.cli.train")
    parser.add_argument("--out", required=True, metavar="PREFIX",
                        help="write PREFIX-gap.png and PREFIX-objective.png")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    args = parser.parse_args(argv)
    error, runs = None, None
    if comm.is_root:  # plotting is serial: rank 0 reads and writes, the others wait for its verdict
        try:
            pyplot()
            runs = read_runs(args.models)
            for name in PLOTS:
                check_writable(f"{args.out}-{name}.png")
        except InputError as problem:
            error = problem
    comm.check(error)
    if not comm.is_root:
        return 0
    for path in write_plots(runs, args.out):
        if not args.quiet:
            print(f"plot written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main, "prbmrm.cli.plot"))
