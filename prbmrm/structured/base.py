"""The structured-loss interface: a joint feature map and a loss-augmented argmax (paper 000 Sec. A.2).

A user (or a built-in model) writes a :class:`StructuredModel`; prbmrm turns
it into a loss, :class:`StructuredLoss`, whose ``loss_gradient`` sums over
the local examples, so the risk oracle, every solver that needs only
subgradients, the regularizers and the distribution come for free. The two
forms of the loss are

    (24)  l(x, y, w) = max_{y'} Gamma(y, y') <w, phi(x, y') - phi(x, y)> + Delta(y, y')
          d_w l       = Gamma(y, ybar) [phi(x, ybar) - phi(x, y)],   ybar the argmax;

    (23)  l(x, y, w) = log sum_{y'} exp <w, phi(x, y')> - <w, phi(x, y)>
          d_w l       = E_{y' ~ p(y'|x, w)} [phi(x, y')] - phi(x, y).

Examples are variable-size (sequences, point sets): a block of them is a
:class:`RaggedExamples`, the x and y of all its examples stacked along the
first axis with offsets, which slices by example like the rows of a matrix.

Imports: numpy; of prbmrm: :mod:`prbmrm.params`, :mod:`prbmrm.errors`, :mod:`prbmrm.io.arrays`,
:mod:`prbmrm.losses.base`.
"""

import numpy as np

from ..params import Parametrized
from ..errors import UsageError
from ..io.arrays import STRUCTURED
from ..losses.base import Loss


class RaggedExamples:
    """Variable-size examples stacked along the first axis (x and y each with offsets).

    Example i is ``x_values[x_offsets[i]:x_offsets[i+1]]`` with label
    ``y_values[y_offsets[i]:y_offsets[i+1]]``. Slicing by example
    (``block[a:b]``) returns views, like the rows of a matrix, so the risk
    oracle splits blocks into chunks without copying.

    Parameters
    ----------
    x_values : ndarray of shape (total_parts, n_features)
        float64: the parts of all examples (sequence positions, points).
    x_offsets : ndarray of shape (n + 1,)
        int64, from 0, non-decreasing.
    y_values : ndarray of shape (total_labels,) or (total_labels, ...)
        The labels' parts (int64 for sequences and permutations).
    y_offsets : ndarray of shape (n + 1,)
        int64, from 0, non-decreasing.

    Attributes
    ----------
    shape : tuple
        ``(n, n_features)``: examples and the width of one part of x.
    """

    def __init__(self, x_values, x_offsets, y_values, y_offsets):
        self.x_values = np.asarray(x_values, dtype=np.float64)
        self.x_offsets = np.asarray(x_offsets, dtype=np.int64)
        self.y_values = np.asarray(y_values)
        self.y_offsets = np.asarray(y_offsets, dtype=np.int64)
        if self.x_values.ndim != 2 or len(self.x_offsets) != len(self.y_offsets):
            raise ValueError("x_values must be 2-D and both offset arrays must have n + 1 entries")
        self.shape = (len(self.x_offsets) - 1, self.x_values.shape[1])

    @classmethod
    def from_lists(cls, xs, ys, n_features=None):
        """Stack lists of per-example arrays ``xs[i]`` (parts x features) and ``ys[i]``."""
        if n_features is None:
            n_features = np.shape(xs[0])[1] if len(xs) else 0
        x_values = (np.concatenate([np.asarray(x, dtype=np.float64).reshape(-1, n_features) for x in xs])
                    if len(xs) else np.zeros((0, n_features)))
        y_values = np.concatenate([np.asarray(y) for y in ys]) if len(ys) else np.zeros(0, dtype=np.int64)
        return cls(x_values, np.cumsum([0] + [len(x) for x in xs]), y_values,
                   np.cumsum([0] + [len(y) for y in ys]))

    @classmethod
    def concatenate(cls, blocks):
        """Stack RaggedExamples with parts of the same width into one, in order."""
        def offsets(name):
            ends = [getattr(block, f"{name}_offsets") for block in blocks]
            starts = np.cumsum([0] + [end[-1] for end in ends[:-1]])
            return np.concatenate([[0]] + [end[1:] + start for end, start in zip(ends, starts)])
        return cls(np.concatenate([block.x_values for block in blocks]), offsets("x"),
                   np.concatenate([block.y_values for block in blocks]), offsets("y"))

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, index):
        """Example `index` as ``(x, y)``, or a slice of examples as a RaggedExamples of views."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("RaggedExamples slices by contiguous examples only")
            stop = max(start, stop)
            xo, yo = self.x_offsets[start:stop + 1], self.y_offsets[start:stop + 1]
            return RaggedExamples(self.x_values[xo[0]:xo[-1]], xo - xo[0],
                                  self.y_values[yo[0]:yo[-1]], yo - yo[0])
        xo, yo = self.x_offsets, self.y_offsets
        return (self.x_values[xo[index]:xo[index + 1]], self.y_values[yo[index]:yo[index + 1]])

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class StructuredModel(Parametrized):
    """What a user writes for structured estimation: phi, Delta and the inference routines.

    Subclasses set :attr:`name` (the ``--loss`` name of the loss built on it)
    and define :meth:`size_joint_feature`, :meth:`joint_feature`,
    :meth:`delta`, :meth:`loss_augmented_argmax` and :meth:`predict`; the
    logistic form (23) also needs :meth:`expected_joint_feature`. Every
    method takes one example; ``w`` is the flat weight vector of length
    :meth:`size_joint_feature`.

    Parameters
    ----------
    **params
        Values for the names in :attr:`params` (``--loss-param NAME=VALUE``
        on the command line), each converted to the type of its default, as
        for losses.

    Attributes
    ----------
    name : str
        Registry name of the loss built on this model.
    params : dict
        The model's parameter names and their defaults (none by default),
        e.g. ``{"n_states": 2}``.
    rescalings : tuple of str
        The forms of (24) that :meth:`loss_augmented_argmax` supports:
        ``"margin"`` (Gamma = 1, Taskar et al.) and/or ``"slack"``
        (Gamma = Delta, Tsochantaridis et al.).
    """

    kind = "structured model"
    option = "--loss-param"
    task = STRUCTURED  # as for losses: a model in a loss registry is the structured task's
    decomposable = True  # and its loss is a sum over examples
    name = None
    rescalings = ("margin",)

    @classmethod
    def make_loss(cls, name, **params):
        """Return the :class:`StructuredLoss` named `name` on a model of this class (what
        :func:`prbmrm.losses.get_loss` calls for a model class in the registry).

        The parameter ``form`` (``margin``, ``slack`` or ``logistic``; default
        ``margin``) chooses the loss, the others go to the model.
        """
        params = dict(params)
        form = params.pop("form", "margin")
        try:
            return StructuredLoss(cls(**params), form, name=name)
        except ValueError as error:  # a model's own check of its parameters, or an unsupported form
            raise UsageError(f"loss {name!r}: {error}") from None

    def size_joint_feature(self, n_features):
        """Return the length of phi(x, y) for parts of x with `n_features` features."""
        raise NotImplementedError

    def joint_feature(self, x, y):
        """Return phi(x, y), a float64 vector of length :meth:`size_joint_feature`."""
        raise NotImplementedError

    def delta(self, y, y_hat):
        """Return Delta(y, y_hat) >= 0, zero at ``y_hat == y``."""
        raise NotImplementedError

    def gamma(self, y, y_hat, rescaling):
        """Return Gamma(y, y_hat) of `rescaling`: 1 (margin) or Delta(y, y_hat) (slack)."""
        return 1.0 if rescaling == "margin" else self.delta(y, y_hat)

    def loss_augmented_argmax(self, x, y, w, rescaling="margin"):
        """Return ybar = argmax_{y'} Gamma(y, y') <w, phi(x, y') - phi(x, y)> + Delta(y, y')."""
        raise NotImplementedError

    def expected_joint_feature(self, x, w):
        """Return ``(log Z, E[phi(x, y')])`` under p(y'|x, w) ∝ exp <w, phi(x, y')> (form (23))."""
        raise NotImplementedError(f"structured model {self.name!r} has no logistic form")

    def predict(self, x, w):
        """Return argmax_{y'} <w, phi(x, y')>."""
        raise NotImplementedError

    def check_label(self, x, y):
        """Return an error text if `y` is not a label of example `x`, else None."""
        return None


class StructuredLoss(Loss):
    """The loss (24) or (23) of a :class:`StructuredModel`, summed over a block of examples.

    Parameters
    ----------
    model : StructuredModel
    form : {"margin", "slack", "logistic"}
        ``margin`` and ``slack``: the max-margin loss (24) with that
        rescaling; ``logistic``: the log-loss (23).
    name : str, optional
        Registry name of the loss (``--loss``); the model's :attr:`~StructuredModel.name` by default.
    """

    kind = "loss"
    task = STRUCTURED
    structured = True
    params = {"form": "margin"}

    def __init__(self, model, form="margin", name=None):
        self.model, self.name = model, model.name if name is None else name
        super().__init__(form=form)

    def check_params(self):
        has_logistic = type(self.model).expected_joint_feature is not StructuredModel.expected_joint_feature
        forms = self.model.rescalings + (("logistic",) if has_logistic else ())
        if self.form not in forms:
            raise ValueError(f"structured model {self.model.name!r} supports the forms "
                             f"{', '.join(forms)}, not {self.form!r}")

    def check_labels(self, classes, label_kind):
        if label_kind != STRUCTURED:
            return (f"loss {self.name!r} is a structured loss: it needs structured examples (shards "
                    f"written by write_structured_shards), the data has {label_kind} labels")
        return None

    def check_examples(self, X, start=0):
        """Return an error text naming the first example of `X` whose label the model rejects, else None.

        `start` is the global index of X's first example (it numbers the examples in the message).
        """
        for i, (x, y) in enumerate(X, start=start + 1):
            problem = self.model.check_label(x, y)
            if problem is not None:
                return f"example {i}: {problem}"
        return None

    def weight_dim(self, n_features):
        """Return the length of w: the length of phi."""
        return self.model.size_joint_feature(n_features)

    def example_loss_gradient(self, x, y, w):
        """Return ``(l(x, y, w), a subgradient in w)`` of one example."""
        truth = self.model.joint_feature(x, y)
        if self.form == "logistic":
            log_partition, expected = self.model.expected_joint_feature(x, w)
            return log_partition - truth @ w, expected - truth
        y_bar = self.model.loss_augmented_argmax(x, y, w, self.form)
        difference = self.model.joint_feature(x, y_bar) - truth
        gamma = self.model.gamma(y, y_bar, self.form)
        # Ties make the argmax any maximizer; the y' = y term keeps l >= 0 for the caller's check.
        return gamma * (difference @ w) + self.model.delta(y, y_bar), gamma * difference

    def loss_gradient(self, w, X, y=None, qid=None):
        """Return ``(sum of losses, sum of subgradients)`` over the examples of `X` (RaggedExamples)."""
        risk, gradient = 0.0, np.zeros(len(w))
        for x, label in X:
            loss, g = self.example_loss_gradient(x, label, w)
            risk += loss
            gradient += g
        return risk, gradient

    def predict_examples(self, X, w):
        """Return the predicted label of every example of `X`, as a list of arrays."""
        return [self.model.predict(x, w) for x, _ in X]

    def metrics_examples(self, X, w):
        """Return ``{"mean_delta": mean Delta(y, predict(x))}`` over the examples of `X`."""
        deltas = [self.model.delta(label, self.model.predict(x, w)) for x, label in X]
        return {"mean_delta": float(np.mean(deltas)) if deltas else float("nan")}

    def steepest_gradient(self, w, p, X, y):
        """Not available: no argsup over the subdifferential of a structured loss (subLBFGS refuses it)."""
        raise NotImplementedError(f"structured loss {self.name!r} has no argsup oracle")
