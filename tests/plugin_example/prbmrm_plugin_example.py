"""A third-party package for prbmrm, found through its entry points (``*.dist-info/entry_points.txt``).

It is never installed: the tests put this directory on PYTHONPATH, which is
all ``importlib.metadata`` needs. It adds multiclass classification written
as a structured model (one part per example, the class index as its label),
a scalar loss and a regularizer; its solver entry point names prbmrm's own BMRM.
"""

import numpy as np
from scipy.special import logsumexp, softmax

from prbmrm.losses import BinaryLoss
from prbmrm.regularizers import L2
from prbmrm.structured import StructuredModel

NOT_A_LOSS = 42


class MulticlassModel(StructuredModel):
    """Multiclass as a structured model: phi(x, y) = x (x) e_y, Delta the 0/1 loss.

    An example's x is one part (1 x d), its label the class index in
    0..n_classes-1. The weights are laid out as multiclass_hinge's flat
    d x k matrix, so the margin form equals multiclass_hinge, slack form
    scaled_multiclass_hinge and the logistic form softmax.
    """

    name = "multiclass_structured"
    params = {"n_classes": 2}
    rescalings = ("margin", "slack")

    def check_params(self):
        self._require("n_classes", self.n_classes >= 2, "at least 2")

    def size_joint_feature(self, n_features):
        return n_features * self.n_classes

    def _scores(self, x, w):
        return x[0] @ w.reshape(-1, self.n_classes)

    def joint_feature(self, x, y):
        phi = np.zeros((x.shape[1], self.n_classes))
        phi[:, y[0]] = x[0]
        return phi.ravel()

    def delta(self, y, y_hat):
        return float(y[0] != y_hat[0])

    def loss_augmented_argmax(self, x, y, w, rescaling="margin"):
        f = self._scores(x, w)
        delta = np.ones(self.n_classes)
        delta[y[0]] = 0.0
        margins = f - f[y[0]]
        z = margins + delta if rescaling == "margin" else delta * (margins + 1.0)
        return np.array([np.argmax(z)])

    def expected_joint_feature(self, x, w):
        f = self._scores(x, w)
        return logsumexp(f), np.outer(x[0], softmax(f)).ravel()

    def predict(self, x, w):
        return np.array([np.argmax(self._scores(x, w))])

    def check_label(self, x, y):
        if len(x) != 1 or len(y) != 1:
            return f"needs one part of x and one label, got {len(x)} and {len(y)}"
        if not 0 <= y[0] < self.n_classes:
            return f"label {y[0]} is not a class index in 0..{self.n_classes - 1}"
        return None


class SquaredHinge(BinaryLoss):
    """The squared hinge loss max(0, 1 - y f)^2, a scalar loss from outside prbmrm."""

    name = "squared_hinge_example"

    def value(self, f, y):
        return np.maximum(0.0, 1.0 - y * f) ** 2

    def derivative(self, f, y):
        return -2.0 * y * np.maximum(0.0, 1.0 - y * f)


class L2Example(L2):
    """prbmrm's L2 under a plug-in name."""

    name = "l2_example"
