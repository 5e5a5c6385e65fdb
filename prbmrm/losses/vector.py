"""Vector losses of the scores f = W^T x, one per output (paper 000, Table 6 and App. A.4).

The weight vector ``w`` is the flat ``W.ravel()`` of a d x k matrix ``W``;
every loss here shares one skeleton (paper 000, Sec. A.4.1 and Alg. 12)::

    F = X @ W                      (n x k scores of one block)
    risk = sum_i l(F_i, y_i);  G = dl/dF  (n x k coefficients)
    grad = (X.T @ G).ravel()       (one sparse product G^T X per block)

and defines only the per-row loss and its coefficient matrix ``G``, fully
vectorised over the rows. Labels: multiclass losses take the float labels of
single-label data (values in ``classes``), ``multilabel_hinge`` the (n, k)
0/1 indicator, ``multivariate_regression`` an (n, k) array of real targets.

Parameters given as files (``--loss-param cost=FILE`` and so on) are read
when the loss is made, so a bad file fails before any data is loaded; their
shape is checked against the classes in :meth:`prepare`.

Imports: numpy, scipy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.kernels.sparse`,
:mod:`prbmrm.losses.base`, :mod:`prbmrm.losses.line`.
"""

import math

import numpy as np
import scipy.sparse as sp

from ..errors import UsageError
from ..kernels.sparse import compiled_rows, csr_rmatmat
from .base import Loss, _format_labels, near_kink
from .line import EnvelopeLine

# Coefficient matrices with at most two entries per row are multiplied as
# sparse matrices above this many outputs; below it the dense product is faster.
_SPARSE_OUTPUTS = 32


def flat_gradient(X, G):
    """Return ``(X.T @ G).ravel()``: the d x k gradient of one block, flat.

    CSR rows with a dense G take the compiled product, bitwise scipy's (the
    same additions in the same order) without building ``X.T``, which cost
    ten times the product itself on the small blocks of a rank's rows.
    """
    if compiled_rows(X) and not sp.issparse(G):
        grad = np.zeros((X.shape[1], G.shape[1]))
        csr_rmatmat(X.indptr, X.indices, X.data, np.ascontiguousarray(G, dtype=np.float64), grad)
        return grad.ravel()
    grad = X.T @ G
    if sp.issparse(grad):
        grad = grad.toarray()
    return np.ascontiguousarray(grad, dtype=np.float64).ravel()


def _pair_coefficients(n, k, plus, minus, scale):
    """The n x k matrix with ``scale`` at (i, plus_i) and ``-scale`` at (i, minus_i), rows summed.

    Dense for few outputs, CSR for many (the product ``X.T @ G`` then costs
    about two sparse matrix-vector products, paper 000 Sec. A.4.1).
    """
    rows = np.arange(n)
    if k <= _SPARSE_OUTPUTS:
        G = np.zeros((n, k))
        G[rows, plus] += scale
        G[rows, minus] -= scale  # (i, minus_i) are distinct pairs: no lost updates
        return G
    values = np.concatenate([np.broadcast_to(scale, n), -np.broadcast_to(scale, n)]).astype(np.float64)
    return sp.csr_matrix((values, (np.concatenate([rows, rows]), np.concatenate([plus, minus]))),
                         shape=(n, k))


def _read_matrix(loss, param):
    """Read the square text matrix named by the loss's parameter `param`; raise UsageError naming the file."""
    M = loss._read_numbers(param)
    if M.shape[0] != M.shape[1]:
        raise UsageError(f"{loss._where(param)}: expected a square matrix, got {M.shape[0]} x {M.shape[1]}")
    return M


def _check_size(M, k, param, path, loss_name, what):
    if M.shape[0] != k:
        raise UsageError(f"loss {loss_name!r}: --loss-param {param}={path}: expected a {k} x {k} "
                         f"matrix ({what}), got {M.shape[0]} x {M.shape[1]}")


class VectorLoss(Loss):
    """A loss ``l(W^T x, y)`` of the k scores of each example; subclasses define `coefficients`."""

    def coefficients(self, F, y):
        """Return ``(losses, G)``: per-row losses (n,) and ``G = dl/dF`` (n x k, dense or CSR)."""
        raise NotImplementedError

    def scores(self, X, w):
        """Return the n x k scores ``X @ W`` of the rows of `X`, W the d x k matrix of the flat `w`."""
        k = self.n_outputs
        if w.shape[0] != X.shape[1] * k:
            raise ValueError(f"w has {w.shape[0]} entries, expected {X.shape[1]} features x {k} outputs")
        return np.asarray(X @ w.reshape(-1, k))

    def loss_gradient(self, w, X, y, qid=None):
        losses, G = self.coefficients(self.scores(X, w), y)
        return float(np.sum(losses)), flat_gradient(X, G)

    def line_values(self, F0, dF, y, eta):
        losses, G = self.coefficients(F0 + eta * dF, y)
        slope = G.multiply(dF).sum() if sp.issparse(G) else np.sum(G * dF)
        return float(np.sum(losses)), float(slope)


class MulticlassLoss(VectorLoss):
    """Base of the single-label multiclass losses: one output per class.

    Labels are the float class values of the data; the scores' columns follow
    the sorted ``classes``. Predicts ``classes[argmax_j f_j]``.
    """

    task = "classification"

    def __init__(self, **params):
        super().__init__(**params)
        self.classes = None

    def check_labels(self, classes, label_kind):
        if label_kind not in ("binary", "integer") or classes is None:
            shown = {"real": "real-valued labels", "multilabel": "multilabel data"}.get(label_kind, label_kind)
            return (f"loss {self.name!r} needs one class label per example (binary or integer "
                    f"labels), the data has {shown}")
        if len(classes) < 2:
            return f"loss {self.name!r} needs at least 2 classes, the data has {_format_labels(classes)}"
        return None

    def prepare(self, classes, label_kind):
        self.classes = np.asarray(classes, dtype=np.float64)
        self.n_outputs = len(self.classes)

    def class_index(self, y):
        """Column index of each label ``y_i`` in :attr:`classes`."""
        index = np.searchsorted(self.classes, y)
        np.minimum(index, len(self.classes) - 1, out=index)
        if not np.array_equal(self.classes[index], y):
            bad = np.flatnonzero(self.classes[index] != y)[0]
            raise ValueError(f"label {y[bad]:g} of row {bad + 1} is not one of the classes "
                             f"{_format_labels(self.classes)}")
        return index

    def decide(self, F):
        """Column of the predicted class for each row of the scores `F`."""
        return np.argmax(F, axis=1)

    def predict_labels(self, f):
        f = np.asarray(f, dtype=np.float64).reshape(len(f), -1)
        return self.classes[self.decide(f)]

    def metrics(self, f, y, qid=None):
        y = np.asarray(y, dtype=np.float64).ravel()
        accuracy = float(np.mean(self.predict_labels(f) == y)) if len(y) else float("nan")
        return {"accuracy": accuracy, "error_rate": 1.0 - accuracy}


class MaxMarginLoss(MulticlassLoss):
    """A multiclass loss ``l(f, y) = max_{y'} z_{y'}`` of margins z affine in the scores f.

    Subclasses define the linear part of the margins, ``differences(F,
    index)`` (index: the label columns); the margins add ``delta[index]``.
    Along a line of scores each example's loss is then the upper envelope of
    k lines in eta, and the line search is exact (paper 003, Alg. 4-5).
    """

    def differences(self, F, index):
        """Per row and candidate y': the linear part of the margin (e.g. ``f_{y'} - f_y``)."""
        raise NotImplementedError

    def margins(self, F, index):
        """Per row and candidate y': the term maximized by the loss."""
        return self.differences(F, index) + self.delta[index]

    def line(self, F0, dF, y):
        index = self.class_index(y)
        return EnvelopeLine(self.margins(F0, index).T, self.differences(dF, index).T)


class MulticlassHinge(MaxMarginLoss):
    """Soft-margin multiclass loss (Crammer and Singer; paper 000 Table 6, eq. 29 with Gamma = 1).

    ``l(f, y) = max_{y'} (f_{y'} - f_y + Delta(y, y'))``, with Delta the 0/1
    loss or the k x k cost matrix of ``--loss-param cost=FILE`` (row = true
    class, column = predicted class, both in sorted class order; zero diagonal,
    entries >= 0). The ``y' = y`` term makes the loss >= 0. Subgradient with
    respect to f: ``e_{y*} - e_y``, y* the (first) maximizer.
    """

    name = "multiclass_hinge"
    params = {"cost": ""}

    def __init__(self, **params):
        super().__init__(**params)
        self._cost = None
        if self.cost:
            self._cost = _read_matrix(self, "cost")
            _check_cost(self._cost, self.cost, self.name)

    def prepare(self, classes, label_kind):
        super().prepare(classes, label_kind)
        k = self.n_outputs
        if self._cost is None:
            self.delta = 1.0 - np.eye(k)
        else:
            _check_size(self._cost, k, "cost", self.cost, self.name,
                        f"one row and column per class {_format_labels(self.classes)}")
            self.delta = self._cost

    def differences(self, F, index):
        return F - F[np.arange(len(index)), index][:, None]

    def coefficients(self, F, y):
        index = self.class_index(y)
        Z = self.margins(F, index)
        worst = np.argmax(Z, axis=1)
        rows = np.arange(len(index))
        return Z[rows, worst], _pair_coefficients(len(index), self.n_outputs, worst, index, 1.0)

    def steepest_gradient(self, w, p, X, y):
        """Among the classes y' maximizing the margin (within rounding, see near_kink), the one growing fastest along p."""
        if type(self).coefficients is not MulticlassHinge.coefficients:
            return super().steepest_gradient(w, p, X, y)
        index = self.class_index(y)
        Z = self.margins(self.scores(X, w), index)
        slopes = self.differences(self.scores(X, p), index)
        top = Z.max(axis=1, keepdims=True)
        worst = np.argmax(np.where(near_kink(Z, top), slopes, -np.inf), axis=1)
        rows = np.arange(len(index))
        G = _pair_coefficients(len(index), self.n_outputs, worst, index, 1.0)
        return float(np.sum(top)), float(np.sum(Z[rows, worst])), flat_gradient(X, G)


class ScaledMulticlassHinge(MulticlassHinge):
    """Scaled soft-margin multiclass loss, eq. 24 of paper 000 with phi(x, y) = e_y (x) x.

    ``l(f, y) = max_{y'} Gamma(y, y') (f_{y'} - f_y) + Delta(y, y')``. Delta is
    0/1 or ``cost=FILE``; Gamma (``gamma=FILE``, k x k, entries >= 0; its
    diagonal never matters) defaults to Delta, which is the slack rescaling of
    Tsochantaridis et al. (2005): ``max_{y'} Delta(y, y') (1 + f_{y'} - f_y)``
    for 0/1 Delta. (Table 6 of paper 000 writes Gamma around Delta too; the
    two agree for 0/1 Delta, and eq. 24 is the one used here.) Subgradient:
    ``Gamma(y, y*) (e_{y*} - e_y)``.
    """

    name = "scaled_multiclass_hinge"
    params = {"cost": "", "gamma": ""}

    def __init__(self, **params):
        super().__init__(**params)
        self._gamma = None
        if self.gamma:
            self._gamma = _read_matrix(self, "gamma")
            if (self._gamma < 0).any():
                i, j = np.argwhere(self._gamma < 0)[0]
                raise UsageError(f"loss {self.name!r}: --loss-param gamma={self.gamma}: entries must "
                                 f"be >= 0 (row {i + 1}, column {j + 1} is {self._gamma[i, j]:g})")

    def prepare(self, classes, label_kind):
        super().prepare(classes, label_kind)
        if self._gamma is None:
            self.scale = self.delta
        else:
            _check_size(self._gamma, self.n_outputs, "gamma", self.gamma, self.name,
                        f"one row and column per class {_format_labels(self.classes)}")
            self.scale = self._gamma

    def differences(self, F, index):
        return self.scale[index] * (F - F[np.arange(len(index)), index][:, None])

    def coefficients(self, F, y):
        index = self.class_index(y)
        Z = self.margins(F, index)
        worst = np.argmax(Z, axis=1)
        rows = np.arange(len(index))
        scale = self.scale[index, worst]
        return Z[rows, worst], _pair_coefficients(len(index), self.n_outputs, worst, index, scale)


class Softmax(MulticlassLoss):
    """Softmax (multinomial logistic) loss ``log sum_{y'} exp(f_{y'}) - f_y`` (paper 000 Table 6).

    Computed as ``max f + log sum exp(f - max f) - f_y``, so large scores
    neither overflow nor lose digits. Gradient: ``softmax(f) - e_y``.
    """

    name = "softmax"

    def coefficients(self, F, y):
        index = self.class_index(y)
        rows = np.arange(len(index))
        top = np.max(F, axis=1, keepdims=True)
        P = np.exp(F - top)
        total = np.sum(P, axis=1, keepdims=True)
        losses = (top + np.log(total)).ravel() - F[rows, index]
        P /= total
        P[rows, index] -= 1.0
        return losses, P


class Ontology(MaxMarginLoss):
    """Soft-margin loss over a class hierarchy (paper 000 Sec. A.4.2, Alg. 12).

    The DAG comes from ``--loss-param dag=FILE``: one edge ``parent child`` per
    line (``#`` starts a comment). Tokens that are numbers equal to a class
    label are those classes; any other token names an inner node. Every class
    must appear in the file. The outputs are the DAG's nodes: the classes
    first, in sorted class order, then the other nodes in order of first
    appearance, so ``n_outputs`` is the number of nodes.

    Each class y has the feature vector ``phi(y)`` in {0, 1}^nodes, the
    indicator of y and all its ancestors (with several parents every path
    counts fully, instead of the paper's averaging over paths), and the loss is

        ``l(f, y) = max_{y'} <phi(y') - phi(y), f> + Delta(y, y')``

    with f = W^T x the node scores and Delta(y, y') = |anc(y) xor anc(y')|,
    the size of the symmetric difference of the ancestors-and-self sets
    (0 for y' = y, so the loss is >= 0). Subgradient with respect to f:
    ``phi(y*) - phi(y)`` (Alg. 12, line 7). Predicts
    ``argmax_y <phi(y), f>`` over the classes.
    """

    name = "ontology"
    params = {"dag": ""}

    def __init__(self, **params):
        super().__init__(**params)
        self._edges = None
        if self.dag:
            self._edges = _read_dag(self.dag, self.name)

    def check_labels(self, classes, label_kind):
        problem = super().check_labels(classes, label_kind)
        if problem is None and not self.dag:
            problem = f"loss {self.name!r} needs its class hierarchy: --loss-param dag=FILE"
        return problem

    def prepare(self, classes, label_kind):
        if self._edges is None:
            raise UsageError(f"loss {self.name!r} needs its class hierarchy: --loss-param dag=FILE")
        super().prepare(classes, label_kind)
        self.nodes, self.phi = _ancestor_indicators(self._edges, self.classes, self.dag, self.name)
        self.n_outputs = len(self.nodes)
        Phi = self.phi
        self.delta = Phi @ (1.0 - Phi).T + (1.0 - Phi) @ Phi.T  # |A xor B| = |A \ B| + |B \ A|

    def differences(self, F, index):
        S = F @ self.phi.T  # <phi(y'), f> for every class y'
        return S - S[np.arange(len(index)), index][:, None]

    def coefficients(self, F, y):
        index = self.class_index(y)
        rows = np.arange(len(index))
        Z = self.margins(F, index)
        worst = np.argmax(Z, axis=1)
        G = self.phi[worst] - self.phi[index]
        return Z[rows, worst], G

    def decide(self, F):
        return np.argmax(F @ self.phi.T, axis=1)


class MultilabelHinge(VectorLoss):
    """Multilabel hinge loss of paper 003, eq. 54 (uniform margin tau, Sec. 6.4).

    ``l(f, Z) = max(0, tau - min_{r in Z} f_r + max_{s not in Z} f_s)``
    = ``max_{r in Z, s not in Z} max(0, tau - f_r + f_s)``, with Z the
    example's relevant labels and tau = ``--loss-param margin`` (default 1).
    This is eq. 55 with Delta(s, r) = tau for s != r. The loss is 0 when Z is
    empty or holds every label (no pair to order). Subgradient with respect to
    f: ``e_{s*} - e_{r*}`` for the worst pair where the hinge is active.

    Labels are the (n, k) 0/1 indicator of multilabel data. Predictions are
    the indicator ``f > 0``. Beware: the loss only ranks the labels of an
    example and is unchanged by adding one constant to all k scores, so with
    the L2 regularizer the trained scores of every example sum to 0 and the
    threshold 0 is not learned (on scene it marks about half the labels).
    The metrics therefore include the ranking measures this loss optimizes:
    ``ranking_loss`` (the fraction of (relevant, irrelevant) label pairs of an
    example scored in the wrong order, ties counting half, averaged over the
    examples that have both) and ``one_error`` (the fraction of examples whose
    top-scored label is not relevant), next to the Hamming loss and subset
    accuracy of ``f > 0``.
    """

    name = "multilabel_hinge"
    task = "multilabel"
    params = {"margin": 1.0}

    def __init__(self, **params):
        super().__init__(**params)
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise UsageError(f"loss {self.name!r}: margin must be a positive number, got {self.margin:g}")
        self.classes = None

    @property
    def predicts_labels(self):
        return True

    def check_labels(self, classes, label_kind):
        if label_kind != "multilabel":
            return (f"loss {self.name!r} needs multilabel data (label sets, e.g. `prbmrm shard "
                    f"--multilabel`), the data has {label_kind} labels")
        if classes is None or len(classes) < 2:
            return f"loss {self.name!r} needs at least 2 labels, the data has {0 if classes is None else len(classes)}"
        return None

    def prepare(self, classes, label_kind):
        self.classes = np.asarray(classes, dtype=np.float64)
        self.n_outputs = len(self.classes)

    def coefficients(self, F, y):
        relevant = np.asarray(y).astype(bool, copy=False)
        n, k = F.shape
        if relevant.shape != (n, k):
            raise ValueError(f"multilabel indicator has shape {relevant.shape}, expected ({n}, {k})")
        lowest = np.argmin(np.where(relevant, F, np.inf), axis=1)  # worst relevant label r*
        highest = np.argmax(np.where(relevant, -np.inf, F), axis=1)  # worst irrelevant label s*
        rows = np.arange(n)
        both = relevant.any(axis=1) & ~relevant.all(axis=1)
        hinge = self.margin - F[rows, lowest] + F[rows, highest]
        active = both & (hinge > 0)
        losses = np.where(active, hinge, 0.0)
        return losses, _pair_coefficients(n, k, highest, lowest, active.astype(np.float64))

    def steepest_gradient(self, w, p, X, y):
        """The worst labels (ties within rounding, see near_kink) that move worst along p; a hinge near 0 counts if it grows.

        The chosen pair's ``tau - f_r + f_s`` (or 0 where it is not
        active) is one of the pieces the loss maximizes: its sum is the plane value.
        """
        F, dF = self.scores(X, w), self.scores(X, p)
        relevant = np.asarray(y).astype(bool, copy=False)
        n = len(F)
        rows = np.arange(n)
        low = np.where(relevant, F, np.inf)
        high = np.where(relevant, -np.inf, F)
        lowest = np.argmin(np.where(near_kink(low, low.min(axis=1, keepdims=True)), dF, np.inf), axis=1)
        highest = np.argmax(np.where(near_kink(high, high.max(axis=1, keepdims=True)), dF, -np.inf), axis=1)
        both = relevant.any(axis=1) & ~relevant.all(axis=1)
        hinge = self.margin - F[rows, lowest] + F[rows, highest]
        grows = dF[rows, highest] - dF[rows, lowest] > 0
        at_zero = near_kink(hinge, 0.0)
        active = both & (((hinge > 0) & ~at_zero) | (at_zero & grows))
        G = _pair_coefficients(n, self.n_outputs, highest, lowest, active.astype(np.float64))
        risk = float(np.sum(np.where(both, np.maximum(self.margin - low.min(axis=1) + high.max(axis=1), 0.0), 0.0)))
        return risk, float(np.sum(np.where(active, hinge, 0.0))), flat_gradient(X, G)

    def predict_labels(self, f):
        f = np.asarray(f, dtype=np.float64).reshape(len(f), -1)
        return (f > 0).astype(np.int8)

    def metrics(self, f, y, qid=None):
        predicted = self.predict_labels(f)
        y = np.asarray(y).reshape(predicted.shape[0], -1)
        if y.shape != predicted.shape:
            raise UsageError(f"the data has {y.shape[1]} labels, the model {predicted.shape[1]}")
        if not len(y):
            return dict.fromkeys(("hamming_loss", "subset_accuracy", "ranking_loss", "one_error"),
                                 float("nan"))
        relevant = y != 0
        wrong = predicted != relevant
        F = np.asarray(f, dtype=np.float64).reshape(predicted.shape)
        return {"hamming_loss": float(np.mean(wrong)),
                "subset_accuracy": float(np.mean(~wrong.any(axis=1))),
                "ranking_loss": _ranking_loss(F, relevant),
                "one_error": float(np.mean(~relevant[np.arange(len(F)), np.argmax(F, axis=1)]))}


def _ranking_loss(F, relevant, rows_per_chunk=4096):
    """Mean over examples with relevant and irrelevant labels of the fraction of misordered pairs."""
    total, counted = 0.0, 0
    for start in range(0, len(F), rows_per_chunk):
        f, z = F[start:start + rows_per_chunk], relevant[start:start + rows_per_chunk]
        # pairs (r, s): r relevant, s irrelevant; wrong if f_s > f_r, half if equal.
        pair = z[:, :, None] & ~z[:, None, :]
        order = f[:, None, :] - f[:, :, None]
        wrong = np.sum(pair * ((order > 0) + 0.5 * (order == 0)), axis=(1, 2))
        pairs = pair.sum(axis=(1, 2))
        both = pairs > 0
        total += float(np.sum(wrong[both] / pairs[both]))
        counted += int(np.count_nonzero(both))
    return total / counted if counted else float("nan")


class MultivariateRegression(VectorLoss):
    """Multivariate regression ``1/2 (f - y)^T M (f - y)`` (paper 000 Table 6, Sec. A.4.1).

    ``M`` is symmetric positive semidefinite, read from ``--loss-param M=FILE``
    (k x k), or the identity. Gradient with respect to f: ``M (f - y)``.

    Labels are an (n, k) array of real targets: the data's label kind
    ``"multioutput"`` with ``classes`` the k target ids (``prbmrm.cli.shard``
    writes it from a 2-D ``y`` or several CSV label columns). One-dimensional
    real labels give k = 1 (least squares weighted by M).
    """

    name = "multivariate_regression"
    task = "regression"
    multioutput = True
    params = {"M": ""}

    def __init__(self, **params):
        super().__init__(**params)
        self._M = None
        if self.M:
            M = _read_matrix(self, "M")
            where = f"loss {self.name!r}: --loss-param M={self.M}"
            scale = max(1.0, float(np.max(np.abs(M))))
            if np.max(np.abs(M - M.T)) > 1e-10 * scale:
                raise UsageError(f"{where}: the matrix is not symmetric")
            M = 0.5 * (M + M.T)
            smallest = float(np.linalg.eigvalsh(M)[0])
            if smallest < -1e-10 * scale:
                raise UsageError(f"{where}: the matrix is not positive semidefinite "
                                 f"(smallest eigenvalue {smallest:.3g})")
            self._M = M

    def _outputs(self, classes, label_kind):
        return len(classes) if label_kind == "multioutput" and classes is not None else 1

    def check_labels(self, classes, label_kind):
        if label_kind == "multilabel":
            return (f"loss {self.name!r} needs real-valued targets, the data is multilabel "
                    "(shard a 0/1 'y' with `prbmrm shard --multioutput` to fit it as targets)")
        k = self._outputs(classes, label_kind)
        if self._M is not None and self._M.shape[0] != k:
            return (f"loss {self.name!r}: --loss-param M={self.M} is {self._M.shape[0]} x "
                    f"{self._M.shape[0]}, the data has {k} target(s) per example")
        return None

    def prepare(self, classes, label_kind):
        self.n_outputs = self._outputs(classes, label_kind)
        if self._M is not None:
            _check_size(self._M, self.n_outputs, "M", self.M, self.name, "one row and column per target")
        self.metric = self._M

    def coefficients(self, F, y):
        R = F - np.asarray(y, dtype=np.float64).reshape(F.shape)
        G = R if self.metric is None else R @ self.metric
        return 0.5 * np.einsum("ij,ij->i", R, G), G

    def metrics(self, f, y, qid=None):
        f = np.asarray(f, dtype=np.float64)
        residual = f.reshape(len(f), -1) - np.asarray(y, dtype=np.float64).reshape(len(f), -1)
        return {"rmse": float(np.sqrt(np.mean(residual ** 2))),
                "mae": float(np.mean(np.abs(residual)))}


def _check_cost(cost, path, loss_name):
    where = f"loss {loss_name!r}: --loss-param cost={path}"
    if np.any(np.diag(cost) != 0):
        i = int(np.flatnonzero(np.diag(cost) != 0)[0])
        raise UsageError(f"{where}: the diagonal must be 0 (a correct prediction costs nothing), "
                         f"entry {i + 1} is {cost[i, i]:g}")
    if (cost < 0).any():
        i, j = np.argwhere(cost < 0)[0]
        raise UsageError(f"{where}: costs must be >= 0 (row {i + 1}, column {j + 1} is {cost[i, j]:g})")


def _node_key(token):
    """A DAG token as a node key: a float for numbers (so "1" and "1.0" agree), else the text."""
    try:
        value = float(token)
    except ValueError:
        return token
    return value if math.isfinite(value) else token


def _node_text(key):
    return f"{key:g}" if isinstance(key, float) else key


def _read_dag(path, loss_name):
    """Return the edges (parent key, child key) of a DAG file, in file order."""
    where = f"loss {loss_name!r}: --loss-param dag={path}"
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as error:
        raise UsageError(f"{where}: cannot read the file: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not a text file") from None
    edges = []
    for number, line in enumerate(lines, 1):
        tokens = line.split("#", 1)[0].split()
        if not tokens:
            continue
        if len(tokens) != 2:
            raise UsageError(f"{where}: line {number}: expected 'parent child', got {line.strip()!r}")
        parent, child = _node_key(tokens[0]), _node_key(tokens[1])
        if parent == child:
            raise UsageError(f"{where}: line {number}: node {tokens[0]} is its own parent")
        edges.append((parent, child))
    if not edges:
        raise UsageError(f"{where}: the file has no edges")
    return edges


def _ancestor_indicators(edges, classes, path, loss_name):
    """Return (nodes, phi): the node keys and the classes x nodes ancestors-and-self indicator."""
    where = f"loss {loss_name!r}: --loss-param dag={path}"
    nodes = [float(c) for c in classes]
    position = {key: i for i, key in enumerate(nodes)}
    seen = set()
    for edge in edges:
        for key in edge:
            seen.add(key)
            if key not in position:
                position[key] = len(nodes)
                nodes.append(key)
    missing = [c for c in nodes[:len(classes)] if c not in seen]
    if missing:
        raise UsageError(f"{where}: class {missing[0]:g} is not a node of the DAG "
                         f"(every class of the data must appear: {_format_labels(classes)})")
    parents = [[] for _ in nodes]
    children = [[] for _ in nodes]
    for parent, child in set(edges):
        parents[position[child]].append(position[parent])
        children[position[parent]].append(position[child])
    # Kahn's topological order; nodes left over lie on a cycle.
    waiting = [len(p) for p in parents]
    order = [v for v in range(len(nodes)) if waiting[v] == 0]
    for v in order:
        for c in children[v]:
            waiting[c] -= 1
            if waiting[c] == 0:
                order.append(c)
    if len(order) < len(nodes):
        stuck = next(v for v in range(len(nodes)) if waiting[v] > 0)
        raise UsageError(f"{where}: the graph has a cycle (through node {_node_text(nodes[stuck])})")
    ancestors = np.eye(len(nodes), dtype=bool)
    for v in order:
        for p in parents[v]:
            ancestors[v] |= ancestors[p]
    return nodes, ancestors[:len(classes)].astype(np.float64)


VECTOR_LOSSES = (MulticlassHinge, ScaledMulticlassHinge, Softmax, MultivariateRegression,
                 MultilabelHinge, Ontology)
