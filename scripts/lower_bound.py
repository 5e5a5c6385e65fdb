"""BMRM on the Hadamard lower-bound problem of paper 001, Sec. 3: its gap is 1/(2 lam t), Omega(1/eps).

The problem is ``J(w) = max_i <a_i, w> + (lam/2) ||w||^2`` over the columns
a_i of a d x d matrix with orthonormal columns built from a Hadamard matrix
(d = 2^k). BMRM starts at w = 0, where every <a_i, w> is 0; after t
iterations it holds t orthonormal planes, the dual optimum is alpha = e/t and
``J_t(w_t) = -1/(2 lam t)``, while ``w_t = -A_t e / (lam t)`` leaves every
unused column at 0, so the next plane is a new column: the certified gap
``eps_t = min_i J(w_i) - J_t(w_t)`` is exactly ``1/(2 lam t)`` for t < d, and
reaching eps takes ``1/(2 lam eps)`` iterations (Theorem 6).

Two matrices:

``orthonormal`` (default)
    ``A = H_d / sqrt(d)``: the argument above holds as stated. J takes
    negative values (min J = -1/(2 lam d)), which changes nothing: a constant
    added to R moves J and every bound alike.
``paper``
    The matrix printed in Sec. 3, ``A = [[H, -H], [-H, H]] / sqrt(d)`` with
    H = H_{d/2}, chosen there so that J >= 0. Its columns come in opposite
    pairs (a_{i + d/2} = -a_i), so at ``w_1 = -a_1 / lam`` the largest
    ``<a_i, w_1>`` is the opposite column's, ``+1/lam`` (Theorem 7's proof
    says 0), the second plane is ``-a_1``, and ``max(<a_1, w>, <-a_1, w>) >=
    0`` closes the gap at iteration 2. The script shows it.

The oracle is a plain function ``risk(w) -> (R, a)`` handed to
:func:`prbmrm.solvers.minimize` (BMRM, no plane pruning: every plane stays
active). Prints, at t = 1, 2, 4, ..., the gap, the prediction 1/(2 lam t),
J(w_t) of the t-th iterate (also 1/(2 lam t) plus the constant) and the
iterations the prediction needs for that gap; optionally a log-log PNG.

Usage (from the repository root)::

    PYTHONPATH=$PWD python scripts/lower_bound.py [--dim 512] [--lam 0.01] [--png gap.png]
"""

import argparse

import numpy as np
from scipy.linalg import hadamard

from prbmrm.solvers import minimize


def hadamard_columns(dim, construction):
    """The d x d matrix whose columns are the planes' subgradients."""
    if construction == "paper":
        H = hadamard(dim // 2).astype(np.float64)
        return np.block([[H, -H], [-H, H]]) / np.sqrt(dim)
    return hadamard(dim).astype(np.float64) / np.sqrt(dim)


def max_of_columns(A):
    """The oracle of ``R(w) = max_i <a_i, w>``: its value and the maximizing column (first on ties)."""
    def risk(w):
        values = A.T @ w
        i = int(np.argmax(values))
        return float(values[i]), A[:, i].copy()
    return risk


def run(dim, lam, construction, max_iter):
    """Return BMRM's Result on the problem (w0 = 0, no pruning, stopping only at max_iter)."""
    A = hadamard_columns(dim, construction)
    return minimize(max_of_columns(A), np.zeros(dim), lam, epsilon=1e-12, rel_epsilon=0.0,
                    max_iter=max_iter, idle_age=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=512, help="d, a power of 2 (default 512)")
    parser.add_argument("--lam", type=float, default=0.01, help="lambda (default 0.01)")
    parser.add_argument("--png", help="also write a log-log plot of the gap against t to this file")
    args = parser.parse_args()
    if args.dim < 4 or args.dim & (args.dim - 1):
        parser.error("--dim must be a power of 2, >= 4")
    lam = args.lam
    # Theorem 6 states t < d/2; with the orthonormal matrix the argument holds up to t = d - 1.
    iterations = args.dim - 1
    result = run(args.dim, lam, "orthonormal", iterations + 1)   # one more: J at w_t of the last t
    gap, objective = result.history["gap"][:iterations], result.history["objective"]
    predicted = 1.0 / (2.0 * lam * np.arange(1, len(gap) + 1))
    print(f"BMRM on max_i <a_i, w> + lam/2 ||w||^2, A = H_d / sqrt(d), d = {args.dim}, lam = {lam:g}\n")
    print(f"{'t':>6} {'gap eps_t':>12} {'1/(2 lam t)':>12} {'ratio':>8} {'J(w_t)':>12} "
          f"{'t for eps_t':>12}")
    shown = sorted({2 ** k for k in range(int(np.log2(len(gap))) + 1)} | {len(gap)})
    for t in shown:
        # objective[t] is J at the t-th iterate w_t (objective[0] is J(w_0) = 0).
        print(f"{t:6d} {gap[t - 1]:12.6g} {predicted[t - 1]:12.6g} {gap[t - 1] / predicted[t - 1]:8.5f} "
              f"{objective[t]:12.6g} {1.0 / (2.0 * lam * gap[t - 1]):12.1f}")
    worst = float(np.max(np.abs(gap / predicted - 1.0)))
    print(f"\nlargest relative deviation of eps_t from 1/(2 lam t) over t = 1..{len(gap)}: {worst:.2e}")
    paper = run(args.dim, lam, "paper", args.dim // 2 - 1)
    print(f"the matrix printed in the paper ([[H, -H], [-H, H]] / sqrt(d)): gap "
          f"{', '.join(f'{g:.4g}' for g in paper.history['gap'][:3])} at t = 1, 2, ...: "
          f"closed at t = {int(np.argmax(paper.history['gap'] <= 1e-12)) + 1} (opposite columns)")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t = np.arange(1, len(gap) + 1)
        figure, axes = plt.subplots(figsize=(6, 4))
        axes.loglog(t, gap, "o", markersize=3, label="BMRM gap $\\epsilon_t$")
        axes.loglog(t, predicted, "-", label="$1/(2\\lambda t)$ (Theorem 6)")
        axes.set_xlabel("iteration t")
        axes.set_ylabel("gap")
        axes.set_title(f"Hadamard lower bound, d = {args.dim}, $\\lambda$ = {lam:g}")
        axes.legend()
        figure.tight_layout()
        figure.savefig(args.png, dpi=120)
        print(f"plot written to {args.png}")


if __name__ == "__main__":
    main()
