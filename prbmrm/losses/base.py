"""Base classes of the losses and the shared skeleton of scalar losses.

Imports: numpy; of prbmrm: :mod:`prbmrm.params`, :mod:`prbmrm.losses.line`.
"""

import numpy as np

from ..params import Parametrized
from .line import BlockLines, GenericLine, PiecewiseLinearLine, block_sums


KINK_TOLERANCE = 1e-10
"""Relative distance to a kink within which the argsup oracle counts an example as on it."""


def near_kink(values, kink):
    """Where `values` lie within :data:`KINK_TOLERANCE` of `kink` (relative for ``|kink| > 1``): on it up to rounding."""
    with np.errstate(invalid="ignore"):
        return np.abs(values - kink) <= KINK_TOLERANCE * np.maximum(1.0, np.abs(kink))


class Loss(Parametrized):
    """Base class: a convex loss and its subgradient on a local shard.

    Parameters
    ----------
    **params
        Values for the names in :attr:`params` (``--loss-param NAME=VALUE``);
        each is converted to the type of its default.

    Attributes
    ----------
    name : str
        The registry name (``--loss`` on the command line).
    task : str
        Which measures `predict` reports, e.g. ``"classification"`` or ``"regression"``.
    params : dict
        Parameter names and their defaults; the instance has one attribute each.
    decomposable : bool
        True if the risk is a sum over examples (:meth:`loss_gradient` per
        block); False for the multivariate scores (:class:`MultivariateLoss`).
    n_outputs : int
        Columns of the weight matrix W (d x k); 1 for scalar losses. ``w`` is
        always handed over flat, ``W.ravel()``.
    needs_qid : bool
        True if the loss needs query ids (ranking per query).
    structured : bool
        True for a :class:`prbmrm.structured.StructuredLoss`: its examples
        are ragged and it has no scores ``X w``, so line searches go
        through ``risk(w)`` and there is no argsup oracle.
    risk_floor : float
        A lower bound of the risk ``R_emp`` (the mean loss), known after
        :meth:`prepare`: 0 for every loss here but ``poisson``. The ``l1``
        regularizer's LP needs one (see :class:`prbmrm.regularizers.L1`).
    """

    kind = "loss"
    option = "--loss-param"
    task = None
    decomposable = True
    multioutput = False  # accepts several real targets per example (label kind "multioutput")
    n_outputs = 1
    needs_qid = False
    structured = False
    risk_floor = 0.0

    def prepare(self, classes, label_kind):
        """Set up what depends on the whole data set's labels (e.g. :attr:`n_outputs`).

        Called once on every rank, after :meth:`check_labels` accepted them.
        """

    def check_labels(self, classes, label_kind):
        """Return an error text if the data's label set does not suit this loss.

        Parameters
        ----------
        classes : ndarray or None
            Sorted distinct label values over the whole data set (None for
            real-valued labels).
        label_kind : str
            One of :data:`prbmrm.io.LABEL_KINDS`; ``"multioutput"`` reaches
            only losses whose :attr:`multioutput` is True.

        Returns
        -------
        str or None
        """
        return None

    def weight_dim(self, n_features):
        """Return the length of the flat weight vector for `n_features` features (with the bias)."""
        return n_features * self.n_outputs

    def loss_gradient(self, w, X, y, qid=None):
        """Return ``(sum of losses, sum of subgradients)`` over the rows of `X`.

        `qid` holds the rows' query ids when the data has them (queries are
        never split across blocks).
        """
        raise NotImplementedError

    def steepest_gradient(self, w, p, X, y):
        """Return ``(sum of losses, plane value, g)`` with g a subgradient maximizing ``<g, p>``.

        The argsup oracle of subLBFGS (paper 003, Sec. 3.2): ``<g, p>`` is
        the directional derivative along `p`. Piecewise-linear losses count
        an example within :data:`KINK_TOLERANCE` of a kink as on it (after
        an exact line search the examples it stopped at are there only up to
        rounding) and take the piece ahead along p; g is then the slope of
        pieces that lie below the loss, and the plane value, the sum of
        those pieces at w (at most the sum of losses), keeps
        ``plane value + <g, v - w>`` below the risk for every v. This
        default returns :meth:`loss_gradient`'s subgradient, exact where the
        loss is differentiable.
        """
        risk, gradient = self.loss_gradient(w, X, y)
        return risk, risk, gradient

    def scores(self, X, w):
        """Return the scores of the rows of `X` under the flat weights `w`: ``X @ w``."""
        return X @ w

    def line(self, F0, dF, y):
        """Return this loss along the scores ``F0 + eta dF`` of a block, for the line search.

        Parameters
        ----------
        F0, dF : ndarray
            :meth:`scores` of the block at the line's start ``w_b`` and along
            its direction ``d``.
        y : ndarray
            The block's labels.

        Returns
        -------
        line object
            With ``exact`` and ``evaluate(etas, lo, hi)`` (5 x K: at each
            trial step the sum of losses, of their left and right slopes in
            eta, and the nearest breakpoints); see :mod:`prbmrm.losses.line`.
            By default a :class:`~prbmrm.losses.line.GenericLine` over
            :meth:`line_values`; piecewise-linear losses return a
            :class:`~prbmrm.losses.line.PiecewiseLinearLine`.
        """
        return GenericLine(lambda eta: np.array([self.line_values(F0, dF, y, eta)]))

    def lines(self, F0, dF, y, starts):
        """Return this loss along the scores ``F0 + eta dF`` of consecutive blocks, one sum per block.

        The risk oracle's line search holds one such object per group of
        blocks and adds the blocks' sums in a reproducible sum: a block's
        sums must not depend on the other blocks held with it.

        Parameters
        ----------
        F0, dF : ndarray
            :meth:`scores` of the rows at the line's start and along its direction.
        y : ndarray
            The rows' labels.
        starts : sequence of int
            Row boundaries ``[0, n_1, ..., n]`` of the blocks.

        Returns
        -------
        line object
            With ``exact`` and ``evaluate_parts(etas, lo, hi)``, one part per
            block (see :mod:`prbmrm.losses.line`). By default a
            :class:`~prbmrm.losses.line.BlockLines` of :meth:`line` per
            block; scalar losses return one object for all the blocks.
        """
        return BlockLines([self.line(F0[a:b], dF[a:b], y[a:b]) for a, b in zip(starts[:-1], starts[1:])])

    def line_values(self, F0, dF, y, eta):
        """Return ``(sum of losses, sum of slopes)`` at the scores ``F0 + eta dF``.

        The slope of example i is ``<g_i, dF_i>`` for the (sub)gradient g_i of
        its loss with respect to its scores: the derivative in eta where the
        loss is differentiable.
        """
        raise NotImplementedError

    @property
    def predicts_labels(self):
        """bool: whether :meth:`predict_labels` gives labels (classification losses)."""
        return self.task == "classification"

    def predict_labels(self, f):
        """Return the labels predicted from the scores `f`, or None if the loss predicts none.

        Binary classification losses predict ``sign(f)`` (+1 at 0).
        """
        if self.task == "classification":
            return np.where(f >= 0, 1.0, -1.0)
        return None

    def metrics(self, f, y, qid=None):
        """Return this loss's natural measures of the scores `f` against `y`.

        Parameters
        ----------
        f : ndarray
            Scores of all examples, shape (n,) or (n, k).
        y : ndarray
            Their labels.
        qid : ndarray, optional
            Their query ids, for ranking measures.

        Returns
        -------
        dict
            Name to value, e.g. ``{"accuracy": 0.85, "error_rate": 0.15}``.
        """
        return self._measures(self._metric_sums(f, y))

    def shared_metrics(self, f, y, qid, comm):
        """Return :meth:`metrics` of the examples of all ranks, each rank passing its own (collective).

        Sums travel (a reproducible sum: the same bits on any number of
        ranks), never scores. Returns None on every rank if the measures need
        every score on one rank (a loss that redefines :meth:`metrics` and not this).
        """
        if type(self).metrics is not Loss.metrics:
            return None
        return self._measures(comm.reproducible_sum(self._metric_sums(f, y)[None, :], max(comm.size, 2)))

    def _metric_sums(self, f, y):
        """The sums the default measures come from: (correct predictions or squared and absolute
        residuals, number of examples)."""
        if self.task == "classification":
            return np.array([np.count_nonzero(self.predict_labels(f) == y), len(y)], dtype=np.float64)
        residual = f - y
        return np.array([np.sum(residual ** 2), np.sum(np.abs(residual)), len(y)], dtype=np.float64)

    def _measures(self, sums):
        n = sums[-1]
        if self.task == "classification":
            accuracy = float(sums[0] / n) if n else float("nan")
            return {"accuracy": accuracy, "error_rate": 1.0 - accuracy}
        return {"rmse": float(np.sqrt(sums[0] / n)) if n else float("nan"),
                "mae": float(sums[1] / n) if n else float("nan")}


class MultivariateLoss(Loss):
    """A risk that does not decompose over examples (ROC area, F-beta, ordinal regression, ...).

    Where :attr:`spread` is True, every rank calls :meth:`local_coefficients`
    with the scores ``f = X @ w`` of its own examples, the loss orders or
    counts them across ranks (scalars, never features) and returns the
    coefficients of the rank's examples: no rank handles all m scores. Else
    the risk oracle gathers the scores of all ranks to rank 0, calls
    :meth:`coefficients` there and scatters the coefficients back. Either
    way each rank forms its part ``X.T @ c``.

    Attributes
    ----------
    spread : bool
        Whether the loss computes its coefficients on every rank (:meth:`local_coefficients`).
    """

    decomposable = False
    spread = False

    def coefficients(self, f, y, qid=None):
        """Return ``(risk_sum, c)`` over all examples, in global order, on rank 0.

        The empirical risk is ``risk_sum / m`` and its subgradient
        ``X.T @ c / m``, with m the number of examples. By default
        :meth:`local_coefficients` with every example on one process, in one block.
        """
        f = np.asarray(f, dtype=np.float64).ravel()
        risks, c = self.local_coefficients(f, y, None, [0, f.size], qid)
        return float(risks[0]), c

    def local_coefficients(self, f, y, comm, bounds, qid=None, work=None):
        """Return ``(risk_sum per block, c)`` of this rank's examples (collective, :attr:`spread` losses).

        Parameters
        ----------
        f, y : ndarray of shape (n_local,)
            The scores and labels of this rank's examples, in global order.
        comm : prbmrm.distributed.comm.SerialComm or MPIComm, or None
            The communicator (None: every example is here).
        bounds : sequence of int
            Local row boundaries of the canonical blocks.
        qid : ndarray, optional
        work : prbmrm.kernels.order.Workspace, optional
            Arrays kept from one call to the next (the caller's: one per loop of evaluations). The
            returned `c` may be one of them, valid until the next call with the same `work`.

        Returns
        -------
        risks : ndarray of shape (len(bounds) - 1,)
            Each block's share of ``risk_sum``, the same bits on any number of ranks.
        c : ndarray of shape (n_local,)
            The coefficients of this rank's examples.
        """
        raise NotImplementedError


class ScalarLoss(Loss):
    """A loss ``l(<w, x>, y)`` of the scalar score, defined by `value` and `derivative`.

    A built-in loss names its compiled counterpart in :attr:`compiled`, where
    its formulas are written once, and inherits `value` and `derivative`,
    which call it. A loss registered from outside
    (:func:`prbmrm.plugins.register_loss`) defines `value` and `derivative`
    as numpy expressions and takes the numpy path: the risk pass then runs
    ``f = X @ w``, its `value` and `derivative`, and ``X.T @ l'`` in numpy
    and scipy, at the speed of those calls (the compiled passes run only the
    built-in formulas, :meth:`compiled_pass`).

    Attributes
    ----------
    piecewise_linear : bool
        True if l is linear between its :meth:`kinks`: the line search is
        then exact (:meth:`line`).
    compiled : type or None
        The loss's class in :mod:`prbmrm.kernels.scalar` (it takes the loss's
        :attr:`params` by name), or None (a loss defined in Python).
    """

    piecewise_linear = False
    compiled = None

    def kernel(self):
        """Return the compiled loss of :attr:`compiled` with this loss's parameters (None if there is none)."""
        if self.compiled is None:
            return None
        return self.compiled(**{name: getattr(self, name) for name in self.params})

    def compiled_pass(self):
        """Return :meth:`kernel` if the compiled risk passes compute exactly this loss, else None.

        They do unless a subclass redefines `value` or `derivative` (it then takes the numpy path).
        """
        if type(self).value is not ScalarLoss.value or type(self).derivative is not ScalarLoss.derivative:
            return None
        return self.kernel()

    def value(self, f, y):
        """Return the per-example losses ``l(f_i, y_i)`` (a built-in loss: by :attr:`compiled`)."""
        return self._formulas().value(f, y)

    def derivative(self, f, y):
        """Return a per-example subgradient ``l'(f_i, y_i)`` with respect to ``f_i`` (by :attr:`compiled`)."""
        return self._formulas().derivative(f, y)

    def curvature(self, f, y):
        """Return the per-example second derivatives ``l''(f_i, y_i)`` in f, for Newton's method
        (:mod:`prbmrm.solvers.tron`); where l' has a kink, one side's (a generalized second derivative).

        A built-in loss that is :attr:`twice_differentiable` computes it by
        :attr:`compiled`; a loss registered from outside may define it.
        """
        return self._formulas().curvature(f, y)

    def newton_terms(self, f, y, value, slope, curvature):
        """Write :meth:`value`, :meth:`derivative` and :meth:`curvature` at (`f`, `y`) into the float64 arrays
        `value`, `slope` and `curvature` (f's length): a built-in loss in one compiled pass, the same bits."""
        kernel = self.compiled_pass()
        if kernel is not None and type(self).curvature is ScalarLoss.curvature:
            kernel.newton_terms(f, y, value, slope, curvature)
        else:
            value[:], slope[:], curvature[:] = self.value(f, y), self.derivative(f, y), self.curvature(f, y)

    @property
    def twice_differentiable(self):
        """bool: whether :meth:`curvature` is defined (by a subclass, or by the compiled loss)."""
        return (type(self).curvature is not ScalarLoss.curvature
                or bool(getattr(self.compiled, "twice_differentiable", False)))

    def _formulas(self):
        kernel = self.kernel()
        if kernel is None:
            raise NotImplementedError(f"loss {self.name!r} defines neither value and derivative nor `compiled`")
        return kernel

    def kinks(self, y):
        """Return the scores at which ``l(., y_i)`` is not differentiable, shape (n, k).

        Row i lists the k breakpoints of example i (k = 0, the default, for a
        loss differentiable everywhere). Tests use them to keep finite
        differences away from the points where only a subgradient exists;
        the line search of a :attr:`piecewise_linear` loss takes its pieces
        from them.
        """
        return np.empty((len(y), 0))

    def line(self, f0, df, y):
        """The loss along ``f0 + eta df`` (see :meth:`Loss.line`); exact for piecewise-linear losses."""
        return self._line_parts(f0, df, y, [0, len(f0)])

    def lines(self, f0, df, y, starts):
        """One object for all the blocks (see :meth:`Loss.lines`), unless a subclass redefines :meth:`line`."""
        if type(self).line is not ScalarLoss.line:
            return super().lines(f0, df, y, starts)
        return self._line_parts(f0, df, y, starts)

    def _line_parts(self, f0, df, y, starts):
        """The loss along ``f0 + eta df`` with one part per block of rows between `starts`.

        A piecewise-linear l has the slope ``c_q = l'`` at any point inside
        its piece q (between two kinks, or 1 beyond the outer ones). Along
        the line, example i meets kink k ahead of f0 at ``eta = (k - f0_i) /
        df_i``, where its slope in eta grows by ``(c_{q+1} - c_q) |df_i|``.
        """
        starts = np.asarray(starts, dtype=np.intp)
        if not self.piecewise_linear:
            return GenericLine(lambda eta: self._line_sums(f0 + eta * df, df, y, starts))
        kinks = self.kinks(y)
        kinks = (np.sort(kinks, axis=1) if kinks.shape[1] > 1 else kinks).T  # (p, n)
        inside = np.vstack([kinks[:1] - 1.0, 0.5 * (kinks[1:] + kinks[:-1]), kinks[-1:] + 1.0])
        slopes = np.array([self.derivative(f, y) for f in inside])  # (p + 1, n)
        # The piece just right of eta = 0: past the kinks below f0, and those at f0 if df > 0.
        piece = np.count_nonzero((kinks < f0) | ((kinks == f0) & (df > 0)), axis=0)
        # The slope of each row's piece, by a flat take (take_along_axis costs 10x on large blocks).
        slope0 = block_sums(slopes.ravel()[piece * len(f0) + np.arange(len(f0))] * df, starts)
        with np.errstate(divide="ignore", invalid="ignore"):
            breaks = (kinks - f0) / df
        ahead = np.flatnonzero((breaks > 0) & (df != 0))
        jumps = (slopes[1:] - slopes[:-1]) * np.abs(df)
        owners = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        return PiecewiseLinearLine(block_sums(self.value(f0, y), starts), slope0, breaks.ravel()[ahead],
                                   jumps.ravel()[ahead], np.tile(owners, len(kinks))[ahead])

    def _line_sums(self, f, df, y, starts):
        """Per block of rows between `starts`, the sums of l and of its slopes ``l' df`` at the scores f."""
        with np.errstate(invalid="ignore", over="ignore"):
            return np.stack([block_sums(self.value(f, y), starts),
                             block_sums(self.derivative(f, y) * df, starts)], axis=1)

    def steepest_gradient(self, w, p, X, y):
        """Piecewise-linear l: an example at (or within KINK_TOLERANCE of) a kink takes the piece ahead along p."""
        if not self.piecewise_linear:
            return super().steepest_gradient(w, p, X, y)
        values, planes, coefficients = self.steepest_rows(self.scores(X, w), self.scores(X, p), y)
        return (float(np.sum(values)), float(np.sum(planes)),
                np.asarray(X.T @ coefficients, dtype=np.float64))

    def steepest_rows(self, f0, df, y):
        """Per row of a piecewise-linear loss at the scores `f0`: its loss, and the piece ahead along `df`.

        Returns
        -------
        values, planes, coefficients : ndarray
            ``l(f0_i, y_i)``, the value at f0 of the linear piece taken (at
            most the loss) and its slope: :meth:`steepest_gradient`'s sums
            are those of values and planes and ``X^T coefficients``.
        """
        kinks = np.sort(self.kinks(y), axis=1).T
        inside = np.vstack([kinks[:1] - 1.0, 0.5 * (kinks[1:] + kinks[:-1]), kinks[-1:] + 1.0])
        piece = np.count_nonzero(np.where(near_kink(f0, kinks), df > 0, kinks < f0), axis=0)
        slopes = np.array([self.derivative(f, y) for f in inside])
        taken = piece * len(f0) + np.arange(len(f0))  # flat take: take_along_axis costs 10x
        coefficients, anchors = slopes.ravel()[taken], inside.ravel()[taken]
        # The chosen piece is the line through (anchor, l(anchor)) with that slope: below l.
        planes = self.value(anchors, y) + coefficients * (f0 - anchors)
        return self.value(f0, y), planes, coefficients

    def loss_gradient(self, w, X, y, qid=None):
        f = self.scores(X, w)
        risk = float(np.sum(self.value(f, y)))
        # X.T @ g runs scipy's transposed CSR kernel: no copy of X is made. An overflowed
        # loss (inf in g) is reported by the solver's finiteness check, without a warning here.
        with np.errstate(invalid="ignore", over="ignore"):
            grad = X.T @ self.derivative(f, y)
        return risk, np.asarray(grad, dtype=np.float64)


class BinaryLoss(ScalarLoss):
    """A scalar loss for labels in {-1, +1}."""

    task = "classification"

    def check_labels(self, classes, label_kind):
        if label_kind == "multilabel" or classes is None or not set(classes) <= {-1.0, 1.0}:
            shown = "real values" if classes is None else _format_labels(classes)
            return (f"loss {self.name!r} needs labels in {{-1, +1}}, the data has {shown} "
                    "(give --positive LABEL for one class against the rest)")
        return None


class RegressionLoss(ScalarLoss):
    """A scalar loss for real-valued targets."""

    task = "regression"

    def check_labels(self, classes, label_kind):
        if label_kind == "multilabel":
            return f"loss {self.name!r} needs one real target per example, the data is multilabel"
        return None


def _format_labels(classes, limit=8):
    shown = ", ".join(f"{c:g}" for c in classes[:limit])
    more = f", ... ({len(classes)} values)" if len(classes) > limit else ""
    return "{" + shown + more + "}"
