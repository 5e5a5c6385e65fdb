"""TRON with and without its diagonal preconditioner against LIBLINEAR's Newton method, in one process, interleaved.

For each data set, smooth loss (logistic, squared hinge) and lam: TRON (``--solver tron``) to a certified gap
of 1e-4 (``epsilon 1e-4, rel_epsilon 0``) with ``precondition=0`` (none) and with its default, and LIBLINEAR
(the ``liblinear-official`` package; ``-s 0`` for the logistic loss, C = 1 / (lam m), ``-s 2`` for the squared
hinge, C = 1 / (2 lam m) as its loss is twice ours; no bias) at the largest eps (tenfold steps from 0.01) whose primal objective is within 1e-4 of a
certified lower bound of min J (the bound of a TRON run to a gap of 1e-8, not timed). Each round runs the
three in turn; the table shows the median CPU seconds (``time.process_time``, fair on a loaded machine) over the
rounds, TRON's rows (evaluated points: one data pass each) and Hessian products (two data passes each), the
ratios to LIBLINEAR and the 1-minute load average.

Usage (from the repository root)::

    PYTHONPATH=$PWD PRBMRM_DATA=/work/shared/data python scripts/bench_tron.py
        [--sets a9a kddcup99] [--losses logistic squared_hinge] [--lams 1e-4 1e-5 1e-6] [--rounds 3]
"""

import argparse
import lzma
import os
import statistics
import time

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import numpy as np  # noqa: E402

TARGET = 1e-4
LIBLINEAR = {"logistic": "0", "squared_hinge": "2"}
FILES = {"a9a": "a9a.xz", "kddcup99": "kddcup99_10pct.binary.xz"}


def load_set(name):
    """(X as CSR, y in {-1, +1}) of a data set of ``$PRBMRM_DATA``."""
    from sklearn.datasets import load_svmlight_file

    with lzma.open(os.path.join(os.environ.get("PRBMRM_DATA", "/work/shared/data"), FILES[name])) as f:
        X, y = load_svmlight_file(f)
    return X.tocsr(), np.where(y > 0, 1.0, -1.0)


def run_tron(X, y, loss, lam, epsilon=TARGET, **options):
    """One TRON run on one process; returns (CPU seconds, rows, Hessian products, result)."""
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.distributed.oracle import DistributedRisk
    from prbmrm.losses import get_loss
    from prbmrm.solvers import minimize

    risk_loss = get_loss(loss)
    risk_loss.prepare(np.array([-1.0, 1.0]), "binary")
    risk = DistributedRisk(risk_loss, X, y, len(y), SerialComm())
    requests = []
    request = risk.request

    def counted(code):
        requests.append(code)
        return request(code)

    risk.request = counted  # every request is a point (one per row) or a Hessian product (a smooth loss)
    started = time.process_time()
    result = minimize(risk, np.zeros(X.shape[1]), lam, method="tron", epsilon=epsilon, rel_epsilon=0, **options)
    return time.process_time() - started, result.nit, len(requests) - result.nit, result


def objective(X, y, w, loss, lam):
    z = y * (X @ w)
    risk = np.logaddexp(0.0, -z) if loss == "logistic" else 0.5 * np.maximum(0.0, 1.0 - z) ** 2
    return 0.5 * lam * float(w @ w) + float(np.mean(risk))


def run_liblinear(problem, X, y, loss, lam, bound, eps):
    """One LIBLINEAR train(); returns (CPU seconds, within the target)."""
    from liblinear import liblinearutil

    C = 1.0 / (lam * X.shape[0]) / (2.0 if loss == "squared_hinge" else 1.0)  # its L2 loss is ours times 2
    started = time.process_time()
    model = liblinearutil.train(problem, liblinearutil.parameter(f"-s {LIBLINEAR[loss]} -c {C!r} -e {eps!r} -q"))
    seconds = time.process_time() - started
    w = np.array([model.w[i] for i in range(X.shape[1])])
    if model.label[0] != 1:
        w = -w
    return seconds, objective(X, y, w, loss, lam) - bound <= TARGET


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["a9a"], choices=sorted(FILES))
    parser.add_argument("--losses", nargs="+", default=["logistic", "squared_hinge"], choices=sorted(LIBLINEAR))
    parser.add_argument("--lams", nargs="+", type=float, default=[1e-4, 1e-5, 1e-6])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from liblinear import liblinearutil

    print("| set | loss | lam | TRON, no preconditioner: rows / products / CPU s | TRON, default: rows / products / "
          "CPU s | LIBLINEAR: eps, CPU s | none / LIBLINEAR | default / LIBLINEAR | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.sets:
        X, y = load_set(name)
        problem = liblinearutil.problem(y, X)
        for loss in args.losses:
            for lam in args.lams:
                bound = run_tron(X, y, loss, lam, epsilon=1e-8)[3].lower_bound
                eps = 0.01
                while eps >= 1e-7 and not run_liblinear(problem, X, y, loss, lam, bound, eps)[1]:
                    eps /= 10
                plain, default, theirs = [], [], []
                for _ in range(args.rounds):
                    plain.append(run_tron(X, y, loss, lam, precondition=0.0))
                    default.append(run_tron(X, y, loss, lam))
                    theirs.append(run_liblinear(problem, X, y, loss, lam, bound, eps)[0])
                cells = []
                for runs in (plain, default):
                    status = "" if runs[-1][3].success else f" (status {runs[-1][3].status})"
                    cells.append(f"{runs[-1][1]} / {runs[-1][2]} / {statistics.median(r[0] for r in runs):.3f}"
                                 f"{status}")
                peer = statistics.median(theirs)
                ratios = [f"{statistics.median(r[0] for r in runs) / peer:.2f}x" for runs in (plain, default)]
                print(f"| {name} | {loss} | {lam:g} | {cells[0]} | {cells[1]} | {eps:g}, {peer:.3f} | {ratios[0]} "
                      f"| {ratios[1]} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
