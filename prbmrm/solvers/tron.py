"""TRON: a trust-region Newton method for smooth losses, with distributed Hessian products and a certified gap.

The method of Lin, Weng and Keerthi (JMLR 2008), as LIBLINEAR's ``tron.cpp`` runs it: each iteration
minimizes the quadratic model ``g^T s + s^T H s / 2`` within ``||s|| <= delta`` by conjugate gradients
(stopped at ``||r|| <= cg_tol ||g||``, on the boundary, or at a step whose residual, the model's next
gradient, is small enough for the gap wanted: :func:`_conjugate_gradient`), takes the step if the objective's
actual reduction is at least ``eta0`` times the predicted one, and updates delta by the paper's rules. For
``J(w) = lam * Omega(w) + R_emp(w)`` with a quadratic Omega (``w^T B w / 2``) and a scalar loss::

    H v = lam * B v + (1/m) X^T (D * (X v)),   D_i = l''(f_i, y_i)   (generalized where l' has a kink)

Every rank holds D of its own rows; a Hessian product is one broadcast of v and one Allreduce of the
blocks' ``X_b^T (D_b * (X_b v))`` (as MPI-LIBLINEAR does it, one per CG step; exact fixed-point sums,
:meth:`prbmrm.distributed.comm.SerialComm.exact_sum`, so any number of ranks gives bitwise the same
products, the same path and the same w). Each evaluated point also gives the value, gradient and
curvature in one request.

On few weights (:data:`MATRIX_DIM`; by default for the hinge's smoothing) the Hessian is formed instead as a
d x d matrix at each accepted point, in one pass whose blocks' triangles are added exactly like the products;
rank 0 factors it (Cholesky) and takes it as CG's preconditioner and the trust region's norm, so that CG takes
the Newton step at once, its products are rank 0's own, and the step does not depend on the columns' scales.

The certified gap: at any w, ``alpha_i = -l'(f_i, y_i)`` is dual feasible, and for a differentiable
loss Fenchel-Young's equality turns its dual value into::

    D(alpha) = R_emp(w) - <a, w> - lam * Omega^*(-a / lam),   a = grad R_emp(w)

(paper 002, eq. 15 for ``Omega = ||w||^2 / 2``), a lower bound of min J at every point TRON evaluates;
the gap is the best J minus the best such bound. Near the optimum a -> -lam B w*, so the gap
closes as fast as the gradient does.

The hinge loss has no second derivative: TRON then steps on Chapelle's Huberized hinge
(``huber_hinge``, smoothing ``delta``; paper 004's smoothing of the hinge, up to its scale) and certifies
the hinge problem itself: the rows report the hinge J, and the smoothed loss's ``alpha_i = -y_i l'_delta``
lie in [0, 1], dual feasible for the hinge, whose conjugate makes their dual value::

    D(alpha) = mean(alpha) - lam * Omega^*(-a / lam),   a = -(1/m) sum_i alpha_i y_i x_i

When the smoothed problem is solved much more closely than the hinge gap (the smoothing dominates the
gap), delta shrinks in proportion to the gap still to close, and TRON goes on from the same w.

Imports: numpy, scipy (scipy.linalg where rank 0 factors a Hessian); of prbmrm: :mod:`prbmrm.distributed.exact`,
:mod:`prbmrm.distributed.oracle`, :mod:`prbmrm.errors`,
:mod:`prbmrm.kernels.blocks`, :mod:`prbmrm.kernels.scalar`, :mod:`prbmrm.kernels.sparse`,
:mod:`prbmrm.solvers.base`.
"""

import math
import time

import numpy as np
import scipy.sparse as sp

from ..distributed.exact import FixedPointSum
from ..distributed.oracle import service
from ..errors import InputError, UsageError
from ..kernels.blocks import same_index_dtype
from ..kernels.scalar import (csr_gram_sums, csr_hessian_sums, csr_newton_sums, dense_gram_sums, dense_hessian_sums,
                              dense_matvec, dense_newton_sums)
from ..kernels.sparse import csr_matvec
from .base import Progress, Recorder, check_finite, snapshot

_POINT, _HESSIAN_NEW, _HESSIAN_OLD, _SMOOTHING, _RESTORE, _MATRIX = 0, 1, 2, 3, 4, 5

# Lin, Weng and Keerthi (2008), Sec. 2.1, as in LIBLINEAR's tron.cpp.
_ETA0, _ETA1, _ETA2 = 1e-4, 0.25, 0.75
_SIGMA1, _SIGMA2, _SIGMA3 = 0.25, 0.5, 4.0

SMOOTHED = {"hinge": "huber_hinge"}
"""The nonsmooth losses TRON takes, by name: the smooth loss (its parameter ``delta``) it steps on, whose
``alpha_i = -y_i l'`` lie in [0, 1], dual feasible for the hinge (``-l^*(-alpha) = alpha``)."""

SHRINK_AT = 0.1
"""Shrink the hinge's smoothing once the smoothed problem's own gap is at most this fraction of the hinge gap."""

PRECONDITION = 0.01
"""The weight of the Hessian's diagonal in TRON's preconditioner by default: LIBLINEAR's (since 2.20)."""

MIN_SMOOTHING = 1e-9
"""The least smoothing delta: below it TRON stops (status 4) when it makes no more progress."""

MATRIX_DIM = 256
"""TRON forms the Hessian as a matrix on at most this many weights (:func:`matrix_fits`), by default for the
hinge's smoothing: its curvature
1/delta lies on the few rows near the kink, so the matrix costs a fraction of a pass, while products on it
need hundreds of CG steps where the columns' scales differ (kddcup99, lam 1e-6: certified in 244 rows and
11.6 s, where the products' TRON ends at 10,000 rows with a gap of 0.066). The twice differentiable losses
keep the products (a9a and kddcup99, logistic: the matrix's pass and exact sum at every point cost more at
lam 1e-5 and 1e-6 than the CG steps they save)."""

MATRIX_ENTRIES = 2**24
"""... and where all canonical blocks' triangles of ``d (d + 1) / 2 + 1`` values take at most this many float64
(128 MiB on a rank that holds every block): d = 256 fits 509 blocks, kddcup99's d = 118 fits 2,389."""


def matrix_fits(risk, matrix_dim=MATRIX_DIM):
    """Whether TRON may form the Hessian of `risk` as a matrix: at most `matrix_dim` weights and the blocks'
    triangles within :data:`MATRIX_ENTRIES`."""
    return risk.dim <= matrix_dim and risk.n_parts * (risk.dim * (risk.dim + 1) // 2 + 1) <= MATRIX_ENTRIES


def newton_ready(risk, regularizer):
    """Return None if TRON applies to `risk` and `regularizer`, else why not (a sentence)."""
    loss = getattr(risk, "loss", None)
    if not hasattr(risk, "attach") or loss is None:
        return "TRON needs the distributed risk oracle itself (prbmrm.distributed.oracle.DistributedRisk)"
    smoothed = loss.name in SMOOTHED and not loss.needs_qid  # Newton steps on its smoothing
    twice_differentiable = (getattr(loss, "twice_differentiable", False) and loss.decomposable
                            and not (loss.needs_qid or loss.structured))
    if not (smoothed or twice_differentiable):
        return (f"TRON needs a twice differentiable scalar loss (logistic, squared_hinge, least_squares, huber, "
                f"huber_hinge, ...), not {getattr(loss, 'name', loss)!r}")
    if not getattr(regularizer, "quadratic", False):
        return f"TRON needs a quadratic regularizer (l2, quadratic), not {regularizer.name!r}"
    return None


def _compiled_rows(X):
    """`X` as the compiled Newton passes read it: CSR of float64 values with one index type, or a C-contiguous
    float64 array (a copy only where `X` is not already so)."""
    if sp.issparse(X):
        return same_index_dtype(X if X.format == "csr" and X.dtype == np.float64 else sp.csr_matrix(X, dtype=np.float64))
    return np.ascontiguousarray(X, dtype=np.float64)


@service("tron")
class NewtonRanks:
    """Value, gradient, curvature and Hessian products of R_emp on every rank.

    Built on every rank by ``risk.attach(NewtonRanks)``; rank 0 puts a
    vector in :attr:`buffer` and calls ``risk.request(code)``: every rank
    receives it (one broadcast), computes its blocks' partial sums, and the
    blocks are added exactly in one Allreduce (``comm.exact_sum``).
    ``_POINT`` takes the vector as w and returns the sums ``(R_emp(w), grad
    R_emp(w), R_target(w), sum alpha / m)`` of the loss stepped on (the
    risk's own, or with a `delta` > 0 the smoothed loss of :data:`SMOOTHED`),
    the risk's own loss and its dual variables, keeping each row's curvature
    as the trial point's; ``_SMOOTHING`` sets delta to the buffer's first entry; ``_HESSIAN_NEW`` makes
    the trial point (if any) the current one and ``_HESSIAN_OLD`` drops it (a
    rejected step), then both return ``(1/m) X^T D X v`` at the current point; ``_MATRIX`` makes the trial
    point (if any) the current one and returns the upper triangle of ``(1/m) X^T D X`` there (its bounds
    agreed afresh, so it keeps no state for a checkpoint); ``_RESTORE`` takes a resumed run's state from rank 0
    (:meth:`_Newton.restore`).

    Each pass is one compiled call over all of this rank's rows (:mod:`prbmrm.kernels.scalar`'s Newton
    passes: with 256 canonical blocks a shard, a call per block cost more than the products), which still
    forms each canonical block's partial sums apart, from its own rows in order.
    """

    def __init__(self, risk, delta=0.0):
        self.risk = risk
        self.buffer = np.zeros(risk.dim)
        X, y, bounds = risk.rows
        self._X, self._y = _compiled_rows(X), np.ascontiguousarray(y, dtype=np.float64)
        self._csr = sp.issparse(self._X)
        self._bounds = np.ascontiguousarray(bounds, dtype=np.intp)
        rows = self._X.shape[0]
        self._scores, self._slope = np.empty(rows), np.empty(rows)
        self._columns = np.empty((3, rows))  # per row: risk, target risk, alpha (csr_newton_sums' columns)
        self._curvatures = (np.empty(rows), np.empty(rows))  # the current point's and the trial's, in turn
        # per block: gradient, diagonal of X^T D X, risk, target risk, alphas; for products: X^T D X v, 0
        self._point_partials = np.empty((len(self._bounds) - 1, 2 * risk.dim + 3))
        self._product_partials = np.empty((len(self._bounds) - 1, risk.dim + 1))
        # The blocks' sums are added exactly in fixed point (bitwise the same on any number of ranks).
        self._point_sums = FixedPointSum(2 * risk.dim + 3, risk.n_parts)
        self._product_sums = FixedPointSum(risk.dim + 1, risk.n_parts)
        self._matrix_partials = self._matrix_sums = None  # for _MATRIX, made at the first
        self._smooth(float(delta))
        self._current = self._trial = None  # each row's curvature
        self.last_seconds = {"risk": 0.0, "comm": 0.0}
        self.restoring = None  # rank 0: the message of a _RESTORE request

    def sum_bounds(self):
        """The bounds agreed by the point's and the products' exact sums (the same on every rank; None: no sum
        yet), which decide how the next sums round."""
        return self._point_sums.exponent, self._product_sums.exponent

    def _restore(self):
        """Take rank 0's :attr:`restoring`: the sums' bounds, the smoothing, and as the current curvature that of
        the point in the buffer."""
        dim = self.risk.dim
        message = np.zeros(3 * dim + 7) if self.restoring is None else self.restoring
        self.risk.comm.bcast_array(message)
        delta, *known = message[:3]
        for sums, given, bounds in zip((self._point_sums, self._product_sums), known,
                                       np.split(message[3:], [2 * dim + 3])):
            sums.exponent = bounds.astype(sums.EXPONENT_DTYPE) if given else None
        self._smooth(float(delta))
        self._point(self.buffer)
        self._current, self._trial = self._trial, None

    def _smooth(self, delta):
        target = self.risk.loss
        if delta > 0.0:
            from ..losses import get_loss

            if target.name not in SMOOTHED:
                raise ValueError(f"no smoothing for the loss {target.name!r}")
            self.loss = get_loss(SMOOTHED[target.name], delta=delta)
        else:
            self.loss = target

    def _point(self, w):
        loss, target, X, y, f = self.loss, self.risk.loss, self._X, self._y, self._scores
        if self._csr:
            csr_matvec(X.indptr, X.indices, X.data, w, f)
        else:
            dense_matvec(X, w, f)
        columns, slope = self._columns, self._slope
        self._trial = self._curvatures[self._current is self._curvatures[0]]  # not the current point's
        loss.newton_terms(f, y, columns[0], slope, self._trial)
        if loss is target:
            columns[1] = columns[0]
            columns[2] = 0.0
        else:
            columns[1] = target.value(f, y)
            np.multiply(-y, slope, out=columns[2])
        if self._csr:
            csr_newton_sums(X.indptr, X.indices, X.data, self._bounds, slope, self._trial, columns,
                            self._point_partials)
        else:
            dense_newton_sums(X, self._bounds, slope, self._trial, columns, self._point_partials)

    def _hessian(self, v, accepted):
        if accepted and self._trial is not None:
            self._current = self._trial
        self._trial = None
        X = self._X
        if self._csr:
            csr_hessian_sums(X.indptr, X.indices, X.data, self._bounds, self._current, v, self._product_partials)
        else:
            dense_hessian_sums(X, self._bounds, self._current, v, self._product_partials)

    def _matrix(self):
        """Make the trial point (if any) the current one and fill the blocks' triangles of ``X_b^T D_b X_b``."""
        if self._trial is not None:
            self._current, self._trial = self._trial, None
        X = self._X
        if self._csr:
            csr_gram_sums(X.indptr, X.indices, X.data, self._bounds, self._current, self._matrix_partials)
        else:
            dense_gram_sums(X, self._bounds, self._current, self._matrix_partials)

    def handle(self, code):
        """Answer one request (rank 0's buffer is broadcast first); see the class's description."""
        risk = self.risk
        started = time.perf_counter()
        risk.comm.bcast_array(self.buffer)
        if code == _SMOOTHING:
            self._smooth(float(self.buffer[0]))
            return None
        if code == _RESTORE:
            self._restore()
            return None
        if code == _MATRIX and self._matrix_sums is None:
            width = risk.dim * (risk.dim + 1) // 2 + 1
            # bounds agreed afresh for each sum (no state for a checkpoint): the matrix is formed rarely
            self._matrix_sums = FixedPointSum(width, risk.n_parts, remember=False)
            self._matrix_partials = np.empty((len(self._bounds) - 1, width))
        received = time.perf_counter()
        error = None
        if code == _POINT:
            partials, state = self._point_partials, self._point_sums
        elif code == _MATRIX:
            partials, state = self._matrix_partials, self._matrix_sums
        else:
            partials, state = self._product_partials, self._product_sums
        try:
            if code == _POINT:
                self._point(self.buffer)
            elif code == _MATRIX:
                self._matrix()
            else:
                self._hessian(self.buffer, code == _HESSIAN_NEW)
        except Exception as problem:  # NaN sums tell every rank to check, as the risk's evaluations do
            error = problem
            partials.fill(np.nan)
        computed = time.perf_counter()
        sums = risk.comm.exact_sum(partials, state, failed=error is not None) / risk.n_total
        if not np.isfinite(sums[-1]):
            risk.comm.check(error)
        self.last_seconds = {"risk": computed - received,
                             "comm": received - started + time.perf_counter() - computed}
        if code != _POINT:
            return sums[:-1]
        dim = risk.dim
        return sums[-3], sums[:dim], sums[dim:-3], sums[-2], sums[-1]


class _Diagonal:
    """The trust region's metric ``s^T M s`` of a diagonal M and the preconditioner M^-1 (tron.cpp's)."""

    def __init__(self, M):
        self.M = M

    def apply(self, s):
        return self.M * s

    def solve(self, r):
        return r / self.M


class _Factored:
    """The metric ``s^T H s`` of the Hessian H itself and the preconditioner H^-1 by H's Cholesky factor:
    conjugate gradients then take the Newton step at once, in the metric that the problem's scales do not
    distort (kddcup99's raw counts, Hessian eigenvalues from 1e-6 to 1e12)."""

    def __init__(self, H):
        # Imported here: rank 0 alone factors, and a serving rank spares scipy.linalg's 8 MB and start-up.
        from scipy.linalg import cho_factor, cho_solve

        self.H, self.factor, self._cho_solve = H, cho_factor(H), cho_solve

    def apply(self, s):
        return self.H @ s

    def solve(self, r):
        return self._cho_solve(self.factor, r)


class _Newton:
    """Rank 0's end: J, its gradient and Hessian products through the attached :class:`NewtonRanks`."""

    def __init__(self, risk, lam, regularizer, delta, precondition, matrix=False):
        self.risk, self.lam, self.regularizer = risk, lam, regularizer
        self.precondition = precondition
        self.matrix = matrix  # whether to form the Hessian as a matrix
        # where `matrix`: the _Factored metric at the current point (None: not formed yet; False: not positive
        # definite as rounded, so the diagonal and the products' passes), and lam B as a matrix
        self._factored = None
        self._omega_matrix = (lam * np.column_stack([regularizer.subgradient(e) for e in np.eye(risk.dim)])
                              if matrix else None)
        self._upper = np.triu_indices(risk.dim) if matrix else None  # the order of the ranks' triangles
        omega = regularizer.subgradient(np.ones(risk.dim))  # B's diagonal where B is diagonal
        self._omega_diagonal = lam * (omega if np.all(omega > 0) else np.ones(risk.dim))
        self.delta = delta  # the smoothing of the hinge; 0: the loss itself
        self.ranks = risk.attach(NewtonRanks, delta)
        self.seconds = {"risk": 0.0, "comm": 0.0}
        self.products = 0
        self.accepted = True  # whether the next products are at the last point evaluated
        # (v, H v) of the conjugate gradients at the current point in order, and how many of them the
        # running ones have met: after a rejected step the same g, M and H give the same directions up to
        # the smaller radius (||s||_M grows along them: Steihaug 1983), whose products need no pass again.
        self._path, self._replayed = [], 0

    def _request(self, code, v):
        self.ranks.buffer[:] = v
        answer = self.risk.request(code)
        for key, value in self.ranks.last_seconds.items():
            self.seconds[key] += value
        return answer

    def restart(self):
        """Start conjugate gradients: :meth:`hessian` replays the products of the last ones while its vectors
        are theirs bitwise (a rejected step's re-solve)."""
        self._replayed = 0

    def step(self, accepted):
        """Take the last :meth:`point` as the current one (`accepted`) or go on from the one before."""
        self.accepted = accepted
        if accepted:
            self._path = []
            self._factored = None

    def smooth(self, delta):
        """Step on the hinge smoothed by `delta` from now on (the next :meth:`point` uses it)."""
        self._path, self._factored = [], None
        # The next point is the current one under `delta`: its products take that point's curvature, also
        # after a rejected step (whose products took the point before, under the former smoothing).
        self.accepted = True
        self.delta = delta
        self.ranks.buffer[0] = delta
        self.risk.request(_SMOOTHING)

    def point(self, w):
        """Return ``(J_s(w), grad J_s(w), M, gap_s, J(w), D(w))`` at `w`; later products are at w.

        J_s is the objective stepped on (J itself, or J with the smoothed
        hinge), M the diagonal preconditioner of its Hessian at w
        (``(1 - p) + p diag(H) / lam``, p = :attr:`precondition`: LIBLINEAR's
        for its objective J / lam),
        gap_s its own duality gap at w; J is the problem's objective
        and D the dual value of the problem's dual point of w (a certified
        lower bound of min J).
        """
        r, a, diagonal, r_target, alphas = self._request(_POINT, w)
        # LIBLINEAR mixes diag(H) into I in its own scale, J / lam
        preconditioner = (1.0 - self.precondition) + self.precondition * (self._omega_diagonal + diagonal) / self.lam
        a = a.copy()
        regularization = self.lam * self.regularizer.value(w)
        conjugate = self.lam * self.regularizer.conjugate(-a / self.lam)
        own_dual = r - float(np.dot(a, w)) - conjugate  # Fenchel-Young for the loss stepped on
        objective = regularization + r
        dual = own_dual if self.delta == 0.0 else alphas - conjugate
        return (objective, self.lam * self.regularizer.subgradient(w) + a, preconditioner, objective - own_dual,
                regularization + r_target, dual)

    def metric(self, M):
        """The trust region's metric and the conjugate gradients' preconditioner at the current point: where
        :attr:`matrix`, the Hessian itself (formed in one pass over the rows at each new point; its products
        then need none), else the diagonal `M` of :meth:`point`."""
        if self.matrix and self._factored is None:
            dim = self.risk.dim
            H = np.zeros((dim, dim))
            H[self._upper] = self._request(_MATRIX, 0.0)
            H += np.triu(H, 1).T
            H += self._omega_matrix
            self.accepted = True  # the ranks' current point is the last one now
            try:
                self._factored = _Factored(H)
            except np.linalg.LinAlgError:  # rounding made H indefinite
                self._factored = False
        return self._factored or _Diagonal(M)

    def hessian(self, v):
        """Return ``H v`` at the last :meth:`point` if :attr:`accepted`, else at the one before."""
        if self._factored:
            return self._factored.apply(v)
        k, self._replayed = self._replayed, self._replayed + 1
        if k < len(self._path) and np.array_equal(self._path[k][0], v):
            return self._path[k][1]
        del self._path[k:]
        self.products += 1
        code, self.accepted = (_HESSIAN_NEW if self.accepted else _HESSIAN_OLD), True
        product = self.lam * self.regularizer.subgradient(v) + self._request(code, v)
        self._path.append((v.copy(), product))
        return product

    def state(self):
        """The products' side as the group ``tron`` of a checkpoint (:func:`prbmrm.solvers.base.snapshot`): the
        smoothing (that of every curvature since the last point: :meth:`smooth` evaluates the point anew), the
        ranks' sums' bounds (empty: none yet) and the products kept for a re-solve."""
        bounds = [np.empty(0, dtype=FixedPointSum.EXPONENT_DTYPE) if b is None else b.copy()
                  for b in self.ranks.sum_bounds()]
        vectors = [np.array([pair[i] for pair in self._path]).reshape(-1, self.risk.dim) for i in (0, 1)]
        return {"tron": {"delta": self.delta, "accepted": int(self.accepted), "point_sums": bounds[0], "product_sums": bounds[1],
                         "path_v": vectors[0], "path_hv": vectors[1]}}

    def restore(self, state, w):
        """Continue from :meth:`state` at the current point `w`: every rank takes the sums' bounds, the smoothing
        and the curvature at w (one pass over the rows).

        Raises
        ------
        InputError
            If the state does not fit this problem (its smoothing, bounds or products), before any rank is
            told anything.
        """
        saved, dim = state["tron"], self.risk.dim
        delta = float(saved["delta"])
        bounds = [np.asarray(saved[key]) for key in ("point_sums", "product_sums")]
        path = [np.asarray(saved[key], dtype=np.float64) for key in ("path_v", "path_hv")]
        problem = None
        if not (math.isfinite(delta) and (delta > 0.0 if self.delta > 0.0 else delta == 0.0)):
            problem = f"tron/delta is not a smoothing of the loss {self.risk.loss.name!r}"
        elif not all(b.dtype.kind in "iu" and b.shape in ((0,), (n,))
                     and np.all(np.abs(b) <= FixedPointSum.EXPONENT_LIMIT)
                     for b, n in zip(bounds, (2 * dim + 3, dim + 1))):
            problem = "tron/point_sums or tron/product_sums are not bounds of this problem's sums"
        elif not (path[0].shape == path[1].shape and path[0].ndim == 2 and path[0].shape[1] == dim):
            problem = "tron/path_v and tron/path_hv are not products of this problem"
        if problem is not None:
            raise InputError(f"{getattr(state, 'path', 'the state')}: {problem} (damaged, or written for other "
                             "data or by another solver)")
        message = np.concatenate([[delta, bounds[0].size, bounds[1].size],
                                  bounds[0] if bounds[0].size else np.zeros(2 * dim + 3),
                                  bounds[1] if bounds[1].size else np.zeros(dim + 1)])
        self.ranks.restoring, self.ranks.buffer[:] = message, w
        self.risk.request(_RESTORE)
        self.ranks.restoring = None
        self.delta, self.accepted = delta, bool(saved["accepted"])
        self._factored = None
        self._path = [(v.copy(), product.copy()) for v, product in zip(*path)]


def _conjugate_gradient(newton, g, metric, radius, cg_tol, max_cg, enough=0.0):
    """Approximately minimize ``g^T s + s^T H s / 2`` within ``||s||_M <= radius`` by conjugate gradients
    preconditioned with M (tron.cpp's trpcg; M is the `metric`, :class:`_Diagonal` or :class:`_Factored`),
    stopped when the residual's M^-1-norm is at most `cg_tol` times the first one's or a step of residual plain
    norm at most `enough` is found.

    That step is CG's own or (`enough` > 0) the minimal residual smoothing of its steps (Schoenauer; Zhou and
    Walker, SIAM J. Sci. Comput. 1994): ``t`` moves toward each new CG step as far as minimizes the plain
    norm of its residual ``-g - H t`` (affine in t: no Hessian product), and is taken once that norm is at
    most `enough` inside the region with the model decreasing. CG's residual swings in the plain norm
    (preconditioned CG minimizes another norm) while the smoothed one never grows: a9a, logistic, lam 1e-6
    reaches half the certificate's residual (sqrt(2 lam 1e-4) / 2) at its last step in 23 products instead of 39.

    Returns ``(s, r, on_boundary)`` with the residual ``r = -g - H s``.
    """
    newton.restart()
    s = np.zeros_like(g)
    r = -g
    z = metric.solve(r)
    d = z.copy()
    zr = float(np.dot(z, r))
    tolerance = cg_tol * math.sqrt(zr)
    smoothed, smoothed_r = s.copy(), r.copy()
    for _ in range(max_cg):
        # `enough` bounds the plain norm, the gap's (not the M^-1-norm, which M's scale sets)
        if math.sqrt(zr) <= tolerance or math.sqrt(float(np.dot(r, r))) <= enough:
            break
        if (enough > 0.0 and math.sqrt(float(np.dot(smoothed_r, smoothed_r))) <= enough
                and float(np.dot(smoothed, metric.apply(smoothed))) <= radius * radius
                and float(np.dot(g, smoothed)) < float(np.dot(smoothed, smoothed_r))):  # the model decreases
            return smoothed, smoothed_r, False
        Hd = newton.hessian(d)
        dHd = float(np.dot(d, Hd))
        if not dHd > 0.0:  # numerically flat: the model gives no better direction
            break
        alpha = zr / dHd
        s += alpha * d
        if float(np.dot(s, metric.apply(s))) > radius * radius:
            s -= alpha * d
            Md = metric.apply(d)
            sMd, sMs, dMd = float(np.dot(s, Md)), float(np.dot(s, metric.apply(s))), float(np.dot(d, Md))
            rsq = radius * radius
            rad = math.sqrt(max(sMd * sMd + dMd * (rsq - sMs), 0.0))
            alpha = (rsq - sMs) / (sMd + rad) if sMd >= 0 else (rad - sMd) / dMd
            s += alpha * d
            r -= alpha * Hd
            return s, r, True
        r -= alpha * Hd
        if enough > 0.0:
            change = r - smoothed_r
            squared = float(np.dot(change, change))
            if squared > 0.0:
                eta = -float(np.dot(smoothed_r, change)) / squared
                smoothed += eta * (s - smoothed)
                smoothed_r += eta * change
        z = metric.solve(r)
        zr_new = float(np.dot(z, r))
        d *= zr_new / zr
        d += z
        zr = zr_new
    return s, r, False


def minimize_tron(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000, idle_age=10,
                  callback=None, cg_tol=0.1, max_cg=1000, smoothing=0.1, precondition=math.nan, matrix_dim=-1,
                  state=None, checkpoint=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` by trust-region Newton, certifying the gap.

    One row per evaluated point (accepted or not); each reports J there,
    the best J, the best dual value so far (a certified lower bound, see the
    module's description) and their gap; the run stops when the gap is at
    most `epsilon` or `rel_epsilon` times the best J.

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
        The oracle itself (on rank 0): TRON attaches its service to it.
    w0 : ndarray
    lam : float
    regularizer : object
        Quadratic (``l2``, ``quadratic``).
    epsilon, rel_epsilon : float
        Stop when the gap is at most `epsilon`, or at most `rel_epsilon`
        times the best objective (0 disables either).
    max_iter : int
        Most rows (evaluated points); the first is w0.
    idle_age : int
        Unused (TRON keeps no planes); accepted as every solver does.
    callback : callable, optional
        Called with each :class:`Progress`; raising StopIteration stops.
    cg_tol : float
        Conjugate gradients stop when the residual is at most this times
        the gradient's norm (LIBLINEAR's 0.1).
    max_cg : int
        Most conjugate gradient steps (Hessian products) per iteration.
    smoothing : float
        The hinge loss only: the first smoothing delta (> 0, see
        :data:`SMOOTHED`), then shrunk as the gap requires.
    precondition : float
        The weight p in [0, 1) of the Hessian's diagonal in the conjugate
        gradients' preconditioner ``(1 - p) I + p diag(H) / lam`` (Hsia, Chiang
        and Lin 2018, in LIBLINEAR's scale J / lam); 0: none. NaN (the
        default): :data:`PRECONDITION` for a twice differentiable loss (a9a,
        logistic, lam 1e-6: 55 Hessian products where none takes 141), 0 for
        the hinge's smoothing (whose curvature 1/delta on the rows near the
        kink swings M between steps: a9a, lam 1e-6, 376 rows against 50).
    matrix_dim : int
        On at most this many weights (d; and :func:`matrix_fits`), the Hessian is formed as a matrix
        at each new point (one pass over the rows), its Cholesky factor is
        the preconditioner and its norm the trust region's, so CG takes the
        Newton step at once and every product is a d x d one on rank 0
        (`precondition` is then unused); 0: never; -1 (the default):
        :data:`MATRIX_DIM` for the hinge's smoothing, 0 for the others.
    state, checkpoint
        As for :func:`~prbmrm.solvers.bmrm.minimize_bmrm`; the state holds the
        current point with its objective, gradient, preconditioner and gap
        (as first computed: the sums of a later pass may round otherwise),
        the radius, the best point and bound, the history and, under
        ``tron`` (:meth:`_Newton.state`), the smoothing, the sums' bounds and
        the products kept for a re-solve. A resumed run makes one pass over
        the rows first (each rank's curvature at the current point).

    Returns
    -------
    Result
        Status 4 if the trust region can make no further progress before
        the gap is reached (the predicted reduction is no longer positive).
    """
    problem = newton_ready(risk, regularizer)
    if problem is not None:
        raise UsageError(problem + " (use --solver lbfgs or bmrm)")
    if math.isnan(precondition):
        precondition = 0.0 if risk.loss.name in SMOOTHED else PRECONDITION
    if matrix_dim == -1:
        matrix_dim = MATRIX_DIM if risk.loss.name in SMOOTHED else 0
    if not (cg_tol > 0 and max_cg >= 1 and smoothing > 0 and 0 <= precondition < 1 and 0 <= matrix_dim <= MATRIX_DIM):
        raise UsageError(f"TRON's solver parameters need cg_tol > 0, max_cg >= 1, smoothing > 0, "
                         f"0 <= precondition < 1 and 0 <= matrix_dim <= {MATRIX_DIM}, got {cg_tol}, {max_cg}, "
                         f"{smoothing}, {precondition} and {matrix_dim}")
    recorder = Recorder(epsilon, rel_epsilon, callback)
    newton = _Newton(risk, lam, regularizer, float(smoothing) if risk.loss.name in SMOOTHED else 0.0, precondition,
                     matrix_fits(risk, matrix_dim))
    # `state` is the loop's record from here on; `resumed` the checkpoint's state, if any
    resumed, state = state, {"iteration": 0, "best": math.inf, "best_w": None, "bound": -math.inf}
    seconds = {"cg": 0.0}

    def evaluate(w):
        """One row at `w`; returns ``(stop, J_s, grad J_s, M, gap_s)`` of the objective stepped on."""
        before = dict(newton.seconds)
        f_s, g_s, M, gap_s, objective, dual = newton.point(w)
        check_finite(f_s, g_s, state["iteration"] + 1)
        state["iteration"] += 1
        if objective < state["best"]:
            state["best"], state["best_w"] = objective, w.copy()
        state["bound"] = max(state["bound"], dual)
        row = Progress(state["iteration"], objective, state["best"], state["bound"], state["best"] - state["bound"],
                       1, newton.seconds["risk"] - before["risk"], seconds["cg"],
                       newton.seconds["comm"] - before["comm"],
                       time.perf_counter() - recorder.started)
        seconds["cg"] = 0.0
        return recorder.record(row), f_s, g_s, M, gap_s

    def smoothing_dominates(gap_s):
        """Whether the smoothed problem is solved so much more closely than J that delta must shrink."""
        return newton.delta > 0.0 and gap_s <= SHRINK_AT * (state["best"] - state["bound"])

    if resumed is None:
        w = np.array(w0, dtype=np.float64)
        stop, f, g, M, gap_s = evaluate(w)
        # tron.cpp's first radius ||g||_M (||g|| where M = I); ||g||_M^-1 would be tiny where M is large
        radius = math.sqrt(float(np.dot(g, newton.metric(M).apply(g))))
        first = True
    else:
        recorder.restore(resumed)
        w, f, g, M, gap_s = (resumed[key] for key in ("w", "objective_s", "g", "preconditioner", "gap_s"))
        radius, first, stop = resumed["radius"], bool(resumed["first"]), False
        state.update(iteration=resumed["iteration"], best=resumed["best_objective"], best_w=resumed["best_w"],
                     bound=resumed["lower_bound"])
        newton.restore(resumed, w)
    pending = resumed is None  # whether the last row awaits the checkpoint (a resumed run's had it)
    while not stop:
        if pending and recorder.offer(checkpoint, state["iteration"], lambda: snapshot(
                recorder, newton, w=w, objective_s=f, g=g, preconditioner=M, gap_s=gap_s, radius=radius,
                first=int(first), best_w=state["best_w"], best_objective=state["best"], lower_bound=state["bound"],
                iteration=state["iteration"])) or state["iteration"] >= max_iter:
            break
        pending = True
        if smoothing_dominates(gap_s):
            gap = state["best"] - state["bound"]
            wanted = max(epsilon, rel_epsilon * abs(state["best"]))
            newton.smooth(newton.delta * min(max(0.5 * wanted / gap, 0.01), 0.5))
            stop, f, g, M, gap_s = evaluate(w)
            continue
        started = time.perf_counter()
        # Without smoothing the gap is the Fenchel-Young gap of lam Omega, ||grad J||^2 / (2 lam) for l2:
        # a residual (the model's next gradient) below 3/4 sqrt(2 lam gap) is all the wanted gap needs, a
        # quarter left for the step's nonlinearity (a9a's certifying steps: 0.1-24% of sqrt(2 lam gap)).
        wanted = max(epsilon, rel_epsilon * abs(state["best"]))
        enough = 0.0 if newton.delta > 0.0 else 0.75 * math.sqrt(2.0 * lam * wanted)
        metric = newton.metric(M)
        s, r, on_boundary = _conjugate_gradient(newton, g, metric, radius, cg_tol, max_cg, enough)
        gs = float(np.dot(g, s))
        predicted = -0.5 * (gs - float(np.dot(s, r)))
        seconds["cg"] = time.perf_counter() - started  # the CG's own work, beside its products' passes
        w_new = w + s
        stop, f_new, g_new, M_new, gap_new = evaluate(w_new)
        actual = f - f_new
        snorm = math.sqrt(float(np.dot(s, metric.apply(s))))
        if first:
            radius, first = min(radius, snorm), False
        alpha = _SIGMA3 if f_new - f - gs <= 0 else max(_SIGMA1, -0.5 * (gs / (f_new - f - gs)))
        if actual < _ETA0 * predicted:
            radius = min(alpha * snorm, _SIGMA2 * radius)
        elif actual < _ETA1 * predicted:
            radius = max(_SIGMA1 * radius, min(alpha * snorm, _SIGMA2 * radius))
        elif actual < _ETA2 * predicted:
            radius = max(_SIGMA1 * radius, min(alpha * snorm, _SIGMA3 * radius))
        elif on_boundary:
            radius = _SIGMA3 * radius
        else:
            radius = max(radius, min(alpha * snorm, _SIGMA3 * radius))
        newton.step(actual > _ETA0 * predicted)
        if newton.accepted:
            w, f, g, M, gap_s = w_new, f_new, g_new, M_new, gap_new
        if stop:
            break
        if not predicted > 0 or (abs(actual) <= 1e-12 * abs(f) and abs(predicted) <= 1e-12 * abs(f)):
            if newton.delta > 0.0 and newton.delta > MIN_SMOOTHING:
                gap_s = 0.0  # the smoothed problem is solved: shrink delta
                continue
            recorder.status = 4
            break
    if state["best_w"] is None:
        state["best_w"] = w
    return recorder.result(state["best_w"], state["best"], w)
