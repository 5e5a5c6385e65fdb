"""Base classes of the losses and the shared skeleton of scalar losses."""

import numpy as np


class Loss:
    """Base class: a convex loss and its subgradient on a local shard.

    Attributes
    ----------
    name : str
        The registry name (``--loss`` on the command line).
    task : str
        ``"classification"`` or ``"regression"``: which metric `predict` reports.
    """

    name = None
    task = None

    def check_labels(self, classes, label_kind):
        """Return an error text if the data's label set does not suit this loss.

        Parameters
        ----------
        classes : ndarray or None
            Sorted distinct label values over the whole data set (None for
            real-valued labels).
        label_kind : str
            ``"binary"``, ``"integer"``, ``"real"`` or ``"multilabel"``.

        Returns
        -------
        str or None
        """
        return None

    def loss_gradient(self, w, X, y):
        """Return ``(sum of losses, sum of subgradients)`` over the rows of `X`."""
        raise NotImplementedError

    def decision_function(self, w, X):
        """Return the scores ``f = X @ w`` that predictions are made from."""
        return X @ w

    def metrics(self, f, y):
        """Return this loss's natural measures of the scores `f` against `y`.

        Returns
        -------
        dict
            Name to value, e.g. ``{"accuracy": 0.85, "error_rate": 0.15}``.
        """
        if self.task == "classification":
            accuracy = float(np.mean(np.where(f >= 0, 1.0, -1.0) == y)) if len(y) else float("nan")
            return {"accuracy": accuracy, "error_rate": 1.0 - accuracy}
        residual = f - y
        return {"rmse": float(np.sqrt(np.mean(residual ** 2))),
                "mae": float(np.mean(np.abs(residual)))}


class ScalarLoss(Loss):
    """A loss ``l(<w, x>, y)`` of the scalar score; subclasses define `value` and `derivative`."""

    def value(self, f, y):
        """Return the per-example losses ``l(f_i, y_i)``."""
        raise NotImplementedError

    def derivative(self, f, y):
        """Return a per-example subgradient ``l'(f_i, y_i)`` with respect to ``f_i``."""
        raise NotImplementedError

    def loss_gradient(self, w, X, y):
        f = X @ w
        risk = float(np.sum(self.value(f, y)))
        # X.T @ g runs scipy's transposed CSR kernel: no copy of X is made.
        grad = X.T @ self.derivative(f, y)
        return risk, np.asarray(grad, dtype=np.float64)


class BinaryLoss(ScalarLoss):
    """A scalar loss for labels in {-1, +1}."""

    task = "classification"

    def check_labels(self, classes, label_kind):
        if label_kind == "multilabel" or classes is None or not set(classes) <= {-1.0, 1.0}:
            shown = "real values" if classes is None else _format_labels(classes)
            return (f"loss {self.name!r} needs labels in {{-1, +1}}, the data has {shown} "
                    "(use `prbmrm.shard --positive LABEL` for one class against the rest)")
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
