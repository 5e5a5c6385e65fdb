"""scikit-learn estimators trained with BMRM: classifier, regressor, ranker, multilabel classifier.

Each minimizes ``J(w) = lam * Omega(w) + (1/m) sum_i l(x_i, y_i, w)`` with
:func:`prbmrm.training.fit` on in-memory arrays. Run plainly they train on one
process; started under ``mpiexec``, every rank calls ``fit`` with the same
arrays, keeps its block of rows, and all ranks end with the same ``coef_``
(rank 0 solves and broadcasts it), so ``predict`` works on every rank.

The parameters mirror ``python -m prbmrm.train``, with one difference of
default: ``bias=True``, scikit-learn's ``fit_intercept``. BMRM's bias is a
constant feature appended to X whose weight is the intercept; unlike
scikit-learn's intercepts it is regularized like every other weight (it
is part of ``w`` in ``lam * Omega(w)``), which shrinks it towards 0 for
large `lam`. Centre the targets or standardize X (e.g. in a Pipeline with
StandardScaler) when that matters.

Checks of :func:`sklearn.utils.estimator_checks.check_estimator` that do not
apply are listed per class in :data:`EXPECTED_FAILED_CHECKS`, with reasons.

Imports: numpy, scipy, sklearn, threadpoolctl; of prbmrm: :mod:`prbmrm.distributed.comm`,
:mod:`prbmrm.errors`, :mod:`prbmrm.losses`, :mod:`prbmrm.losses.multivariate`,
:mod:`prbmrm.losses.vector`, :mod:`prbmrm.options`, :mod:`prbmrm.solvers`, :mod:`prbmrm.training`.
"""

import hashlib
import os
import tempfile
import warnings
from collections import OrderedDict

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_array
from sklearn.utils.metaestimators import available_if
from sklearn.utils.extmath import safe_sparse_dot
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import (check_consistent_length, check_is_fitted, column_or_1d,
                                      validate_data)

from .errors import ConvergenceWarning as StoppedEarly
from .errors import PrbmrmError
from .losses import LOSSES
from .losses.multivariate import query_rows
from .losses.vector import MulticlassLoss
from .options import BundleOptions, Stopping

__all__ = ["EXPECTED_FAILED_CHECKS", "BMRMClassifier", "BMRMMultilabelClassifier", "BMRMRanker",
           "BMRMRegressor", "expected_failed_checks", "query_pairs"]


def _losses_of_task(task):
    """The names of the losses whose :attr:`prbmrm.losses.Loss.task` is `task`."""
    return tuple(name for name, cls in LOSSES.items() if cls.task == task)


class _BMRMEstimator(BaseEstimator):
    """What the estimators share: the parameters, one call of :func:`prbmrm.training.fit`, the scores.

    Parameters
    ----------
    lam : float, default 1e-4
        Regularization constant, > 0 (``--lam``).
    loss : str or None, default None
        A key of :data:`prbmrm.losses.LOSSES` suited to the estimator; None
        picks the estimator's default (see the class).
    loss_params : dict or None, default None
        The loss's parameters (``--loss-param NAME=VALUE``), e.g.
        ``{"tau": 0.9}`` for ``quantile``.
    solver : str or None, default None
        A key of :data:`prbmrm.solvers.SOLVERS`; None: that of
        :func:`prbmrm.solvers.default_solver` (``auto`` for a quadratic
        `reg`: the solver :func:`prbmrm.solvers.auto.pick_solver` picks
        from the measured data, on the columns some example has); with
        `warm_start`, ``auto`` for the hinge loss with ``l2`` (its pick on
        modest data, dual coordinate descent, carries its dual point over),
        else ``bmrm``, whose planes carry over.
    reg : str, default "l2"
        A key of :data:`prbmrm.regularizers.REGULARIZERS`.
    epsilon, rel_epsilon : float or None, default None
        Stop when the gap (best objective - certified lower bound) is at most
        `epsilon`, or at most `rel_epsilon` times the best objective:
        `epsilon` alone stops on the absolute gap only, `rel_epsilon` alone or
        neither on the relative one (default 1e-3), both on whichever is met
        first (as ``--epsilon`` / ``--rel-epsilon``).
    max_iter : int, default 10000
        A ConvergenceWarning is issued if the gap test is not met by then.
    bias : bool, default True
        Fit an intercept: a constant-1 feature appended to X whose weight is
        regularized (``--bias``; see the module docstring).
    idle_age : int, default 10
        Drop cutting planes idle this many iterations (0: never).
    warm_start : bool, default False
        Start from the last fit in this process on the same training data
        with the same loss, solver, regularizer and bias, whatever its `lam`
        and whichever estimator object made it (so the clones GridSearchCV
        fits share it): from its w and, for BMRM, its cutting planes, which
        bound the empirical risk for every lam (as on a lambda path), or, for
        dual coordinate descent, its dual point (clipped to the new lam's
        box, feasible there). The
        optimum is certified as always, but the w returned within the gap
        then depends on the fits made before. The data are found by a cheap
        key (shapes, nonzeros and a sample of their values) and the earlier
        fit is used only if its data, kept as a copy, equal these exactly:
        planes of other data do not bound this data's risk. Data of more
        than 256 MiB are not kept (their fits start cold).
    verbose : bool, default False
        Print the line that names the solver and the progress table (rank 0).

    Attributes
    ----------
    coef_ : ndarray
        Weights (shape per class).
    intercept_ : float or ndarray
        The learned bias (0 with ``bias=False``).
    loss_ : str
        The loss trained.
    n_iter_ : int
        Solver iterations (risk evaluations).
    objective_ : float
        J at the returned weights.
    gap_ : float
        Its certified gap to min J.
    history_ : dict of str to ndarray
        The progress table, one array per column of
        :data:`prbmrm.solvers.HISTORY_COLUMNS`.
    message_ : str
        The solver's last word: why it stopped and, for ``auto``, which
        solver ran and why.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X has string column names.
    """

    _default_losses = ()  # (the default loss, the one for more classes or 2-D targets)
    _losses = ()  # the names of the losses this estimator trains

    def __init__(self, *, lam=1e-4, loss=None, loss_params=None, solver=None, reg="l2", epsilon=Stopping.epsilon,
                 rel_epsilon=Stopping.rel_epsilon, max_iter=Stopping.max_iter, bias=True,
                 idle_age=BundleOptions.idle_age, warm_start=False, verbose=False):
        self.lam = lam
        self.loss = loss
        self.loss_params = loss_params
        self.solver = solver
        self.reg = reg
        self.epsilon = epsilon
        self.rel_epsilon = rel_epsilon
        self.max_iter = max_iter
        self.bias = bias
        self.idle_age = idle_age
        self.warm_start = warm_start
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.required = True
        return tags

    def _loss_class(self):
        """The class of the chosen loss, or None for the default or an unknown name."""
        return LOSSES.get(self.loss) if self.loss is not None else None

    def _loss_name(self, wide=False):
        """The loss to train: `loss`, or the default (`wide`: for more classes, 2-D targets).

        Raises ValueError if the loss does not suit the estimator.
        """
        name = self._default_losses[wide] if self.loss is None else self.loss
        if name not in self._losses:
            raise ValueError(f"{type(self).__name__}: unknown or unsuitable loss {name!r}; "
                             f"use one of {', '.join(sorted(self._losses))}")
        return name

    def _fit_linear(self, X, y, loss, loss_params=None, **options):
        """Train on (X, y) over the ranks with :func:`prbmrm.training.fit`; set coef_, intercept_ and
        the run's summary.

        `loss_params` replaces the parameter of that name when given;
        `options` go to :func:`prbmrm.io.split_local` (qid, label_kind).
        """
        from .distributed.comm import get_comm
        from .solvers import default_solver
        from .training import fit

        comm = get_comm()
        if loss_params is None:
            loss_params = self.loss_params
        # None: fit picks by the data. A warm start wants what carries over: for the hinge loss with l2, auto
        # (whose pick there, dual coordinate descent, starts from the dual point); else BMRM's planes.
        carried = "auto" if loss == "hinge" and self.reg == "l2" else default_solver(self.lam, self.reg, True)
        solver = self.solver or (carried if self.warm_start else None)
        key = _fit_key(X, y, options, (loss, loss_params, self.bias, solver, self.reg)) if self.warm_start else None
        n_features = X.shape[1]
        # With solver None, fit's default (auto) measures the columns trained on, as any data.
        X, used = _used_columns(X, self.reg)
        warm = _warm_start(key, X, y, options) if self.warm_start and comm.is_root else None
        try:
            # One BLAS thread, as the command line runs: threads gain nothing on these small
            # products and lose many-fold on a busy machine.
            # scikit-learn's ConvergenceWarning, with the solver's message, replaces fit's own below.
            with _one_thread(), warnings.catch_warnings():
                warnings.simplefilter("ignore", StoppedEarly)
                model = fit((X, y, options), loss=loss, loss_params=loss_params, lam=self.lam,
                            bias=self.bias, solver=solver, reg=self.reg, epsilon=self.epsilon,
                            rel_epsilon=self.rel_epsilon, max_iter=self.max_iter, idle_age=self.idle_age,
                            comm=comm, warm=warm, verbose=self.verbose)
        except PrbmrmError as error:  # raised on every rank alike, naming the keywords
            raise ValueError(str(error)) from error
        if self.warm_start and comm.is_root:
            _keep_warm_start(key, X, y, options, model.result)
        a = model.attrs
        self.n_iter_, self.objective_, self.gap_, self.history_ = a["iterations"], a["objective"], a["gap"], model.history
        self.message_ = a["message"]
        if not a["converged"]:
            warnings.warn(f"{a['solver']} stopped before its gap test: {a['message']}", ConvergenceWarning)
        k = model.w.shape[1] if model.w.ndim == 2 else 1
        self.coef_ = np.zeros((k, n_features))
        self.coef_[:, slice(None) if used is None else used] = model.w.reshape(-1, k).T
        self.intercept_ = np.reshape(model.bias, k).astype(np.float64) if self.bias else np.zeros(k)
        self.loss_ = loss

    def _single_output(self):
        """Give coef_ and intercept_ the shapes of one output: (n_features,) and a float."""
        self.coef_, self.intercept_ = self.coef_.ravel(), float(self.intercept_[0])

    def _scores(self, X):
        """``X @ coef_.T + intercept_``: (n_samples,) for one output, else (n_samples, n_outputs)."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", reset=False)
        scores = safe_sparse_dot(X, self.coef_.T, dense_output=True) + self.intercept_
        return scores.ravel() if self.coef_.ndim == 1 or self.coef_.shape[0] == 1 else scores


class BMRMClassifier(ClassifierMixin, _BMRMEstimator):
    """Linear classifier trained with BMRM, binary or multiclass.

    Labels may be any values scikit-learn accepts (strings too): binary
    losses see ``classes_[0]`` as -1 and ``classes_[1]`` as +1; multiclass
    losses see integer class values as they are (so cost matrices and class
    hierarchies refer to them; ``classes_`` is sorted) and other labels as
    their index in ``classes_``.

    Parameters
    ----------
    loss : str or None, default None
        A classification loss: binary ``hinge``, ``squared_hinge``,
        ``logistic``, ``huber_hinge``, ``exponential``, ``fbeta``, ... or
        multiclass ``multiclass_hinge``, ``softmax``,
        ``scaled_multiclass_hinge``, ``ontology``. None: ``hinge`` for two
        classes, ``multiclass_hinge`` for more. A binary loss on more than
        two classes is an error.
    **params
        lam, loss_params, solver, reg, epsilon, rel_epsilon, max_iter, bias,
        idle_age: see :class:`_BMRMEstimator`.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) for two classes, else (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)

    Notes
    -----
    With two classes a multiclass loss trains one weight vector per class;
    only their difference (class 1 minus class 0) decides, and it is what
    ``coef_`` and ``intercept_`` hold, as in scikit-learn's binary convention.

    ``predict_proba`` exists for ``loss="logistic"`` (sigmoid of the score)
    and ``loss="softmax"`` (softmax of the scores), the losses that are
    negative log-likelihoods.
    """

    _default_losses = ("hinge", "multiclass_hinge")
    _losses = _losses_of_task("classification")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        loss = self._loss_class()
        tags.classifier_tags.multi_class = self.loss is None or (
            loss is not None and issubclass(loss, MulticlassLoss))
        return tags

    def fit(self, X, y):
        """Fit the model to X and the labels y.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)

        Returns
        -------
        self
        """
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"{type(self).__name__} needs samples of at least 2 classes; "
                             f"the data has 1 class: {self.classes_[0]!r}")
        multiclass = len(self.classes_) > 2
        loss = self._loss_name(multiclass)
        if issubclass(LOSSES[loss], MulticlassLoss):
            integral = (np.issubdtype(self.classes_.dtype, np.number)
                        and np.all(self.classes_ == np.round(self.classes_)))
            target = self.classes_.astype(np.float64)[codes] if integral else codes.astype(np.float64)
        elif multiclass:
            raise ValueError(f"Only binary classification is supported by loss {loss!r}; the type "
                             f"of the target is {type_of_target(y)} ({len(self.classes_)} classes): "
                             "use a multiclass loss (multiclass_hinge, softmax, ...)")
        else:
            target = np.where(codes == 1, 1.0, -1.0)
        self._fit_linear(X, target, loss)
        if not multiclass and self.coef_.shape[0] == 2:
            self.coef_ = self.coef_[1:] - self.coef_[:1]
            self.intercept_ = self.intercept_[1:] - self.intercept_[:1]
        return self

    def decision_function(self, X):
        """Return the scores of the rows of X.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) for two classes (> 0 means ``classes_[1]``), else (n_samples, n_classes)
        """
        return self._scores(X)

    def predict(self, X):
        """Return the predicted class labels of the rows of X."""
        scores = self.decision_function(X)
        index = np.argmax(scores, axis=1) if scores.ndim == 2 else (scores > 0).astype(np.intp)
        return self.classes_[index]

    @available_if(lambda self: self.loss in ("logistic", "softmax"))
    def predict_proba(self, X):
        """Return class probabilities, shape (n_samples, n_classes) (``logistic`` and ``softmax`` only)."""
        return np.exp(self.predict_log_proba(X))

    @available_if(lambda self: self.loss in ("logistic", "softmax"))
    def predict_log_proba(self, X):
        """Return the logarithm of :meth:`predict_proba`."""
        from scipy.special import log_softmax

        scores = self.decision_function(X)
        if scores.ndim == 1:  # P(classes_[1]) = sigmoid(f) = softmax([0, f])[1]
            scores = np.column_stack([np.zeros_like(scores), scores])
        return log_softmax(scores, axis=1)


class BMRMRegressor(RegressorMixin, _BMRMEstimator):
    """Linear regression trained with BMRM, one or several targets.

    Parameters
    ----------
    loss : str or None, default None
        A regression loss: ``least_squares``, ``least_absolute_deviation``,
        ``huber``, ``quantile``, ``epsilon_insensitive``, ``poisson`` for one
        target; ``multivariate_regression`` for one or several. None:
        ``least_squares`` for 1-D y, ``multivariate_regression`` for 2-D y.
    **params
        lam, loss_params, solver, reg, epsilon, rel_epsilon, max_iter, bias,
        idle_age: see :class:`_BMRMEstimator`.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : float or ndarray of shape (n_targets,)

    Notes
    -----
    ``predict`` returns ``X @ coef_.T + intercept_``, except for ``poisson``,
    whose linear score is the log of the mean: it returns ``exp`` of it.
    """

    _default_losses = ("least_squares", "multivariate_regression")
    _losses = _losses_of_task("regression")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        loss = self._loss_class()
        tags.target_tags.multi_output = self.loss is None or (loss is not None and loss.multioutput)
        return tags

    def fit(self, X, y):
        """Fit the model to X and the targets y.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            2-D y only for ``multivariate_regression`` (or the default loss).

        Returns
        -------
        self
        """
        multi_output = self.__sklearn_tags__().target_tags.multi_output
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, y_numeric=True,
                             multi_output=multi_output)
        y = np.asarray(y, dtype=np.float64)
        if y.ndim == 2 and y.shape[1] == 1 and self.loss is None:
            # One target as a column: the same objective as 1-D y, trained the same way (the default solver
            # may differ between the two losses); predictions keep the column.
            self._fit_linear(X, y.ravel(), self._loss_name(False))
            self._single_output()
            self._column = True
            return self
        self._column = False
        two_d = y.ndim == 2
        self._fit_linear(X, y, self._loss_name(two_d), **({"label_kind": "multioutput"} if two_d else {}))
        if not two_d:
            self._single_output()
        return self

    def predict(self, X):
        """Return the predicted targets, (n_samples,) or (n_samples, n_targets)."""
        scores = self._scores(X)
        scores = np.exp(scores) if self.loss_ == "poisson" else scores
        return scores[:, None] if getattr(self, "_column", False) else scores


class BMRMRanker(_BMRMEstimator):
    """Linear ranking function trained with BMRM: documents grouped by query, scored by ``predict``.

    Parameters
    ----------
    loss : str or None, default None
        A ranking loss: ``ndcg`` (NDCG@k per query, ``loss_params={"k": 10}``;
        the default), ``preference`` (the pairs of documents of a query with
        different relevance, each ordered by relevance, cost 1; or
        ``loss_params={"pairs": FILE}`` with 0-based row numbers of X),
        ``ordinal`` (every pair of examples with different labels, across
        the whole data set, no queries).
    **params
        lam, loss_params, solver, reg, epsilon, rel_epsilon, max_iter, bias,
        idle_age: see :class:`_BMRMEstimator`.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
        Does not change any ranking; kept for uniformity.

    Notes
    -----
    Labels are integer relevance grades >= 0. Query groups go to ``fit``
    and ``score`` as ``qid`` (one id per row; the rows of a query must be
    contiguous); without ``qid`` all rows form one query. ``score`` is the
    mean NDCG@k over the queries with a relevant document (k of the ``ndcg``
    loss, else 10), as in ``prbmrm predict``.
    """

    _default_losses = ("ndcg", "ndcg")
    _losses = ("ndcg", "preference", "ordinal")

    def fit(self, X, y, qid=None):
        """Fit the ranking function to X, the relevance grades y and the query ids qid.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Relevance grades, integers >= 0.
        qid : array-like of shape (n_samples,), optional
            Query id of each row; the rows of a query are contiguous.

        Returns
        -------
        self
        """
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, y_numeric=True)
        if qid is not None:
            qid = column_or_1d(qid)
            check_consistent_length(y, qid)
        loss = self._loss_name()
        if loss == "ordinal" and qid is not None:
            raise ValueError(f"loss {loss!r} ranks all examples together and takes no qid")
        if loss != "ndcg" and np.unique(y).size < 2:
            raise ValueError(f"loss {loss!r} needs examples of at least 2 relevance grades; got "
                             f"{len(y)} sample(s) of one class")
        if loss == "ndcg":
            # Queries stay whole on one rank: without qid, one query on one rank.
            self._fit_linear(X, y, loss, qid=np.zeros(len(y), dtype=np.int64) if qid is None else qid)
        elif loss != "preference" or (self.loss_params or {}).get("pairs"):
            self._fit_linear(X, y, loss)
        else:
            # The loss reads its pairs (global row numbers) from a file: write this rank's copy.
            lower, upper = query_pairs(y, qid)
            if not len(lower):
                raise ValueError("loss 'preference': no query has documents of different relevance")
            with tempfile.TemporaryDirectory() as directory:
                path = os.path.join(directory, "pairs.txt")
                np.savetxt(path, np.column_stack([lower, upper]), fmt="%d")
                self._fit_linear(X, y, loss, {**(self.loss_params or {}), "pairs": path})
        self._single_output()
        return self

    def predict(self, X):
        """Return the ranking scores of the rows of X (higher ranks first), shape (n_samples,)."""
        return self._scores(X)

    def score(self, X, y, qid=None):
        """Return the mean NDCG@k of the scores of X over the queries with a relevant document.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Relevance grades >= 0.
        qid : array-like of shape (n_samples,), optional
            Query ids; None: one query.

        Returns
        -------
        float
            NaN if no query has a relevant document.
        """
        from .losses import get_loss

        k = int((self.loss_params or {}).get("k", 10)) if self.loss_ == "ndcg" else 10
        y = np.asarray(y, dtype=np.float64)
        qid = np.zeros(len(y), dtype=np.int64) if qid is None else np.asarray(qid)
        return get_loss("ndcg", k=k).metrics(self.predict(X), y, qid)[f"ndcg@{k}"]


class BMRMMultilabelClassifier(ClassifierMixin, _BMRMEstimator):
    """Linear multilabel classifier trained with BMRM (``multilabel_hinge``).

    Parameters
    ----------
    loss : str or None, default None
        ``multilabel_hinge`` (the default and only multilabel loss;
        ``loss_params={"margin": 1.0}``).
    **params
        lam, loss_params, solver, reg, epsilon, rel_epsilon, max_iter, bias,
        idle_age: see :class:`_BMRMEstimator`.

    Attributes
    ----------
    classes_ : ndarray of shape (n_labels,)
        ``0 .. n_labels - 1``, the columns of y.
    coef_ : ndarray of shape (n_labels, n_features)
    intercept_ : ndarray of shape (n_labels,)

    Notes
    -----
    y is an (n_samples, n_labels) 0/1 indicator with at least 2 columns
    (``sklearn.preprocessing.MultiLabelBinarizer`` makes one from label
    sets). ``predict`` returns the indicator of ``decision_function > 0``.
    The loss only orders the labels of each example (relevant above
    irrelevant, by a margin): adding a constant to all of an example's scores
    changes nothing, so the threshold 0 is not learned and ``predict`` is
    poorly calibrated. ``score`` therefore returns the measure the loss
    optimizes, ``1 - ranking_loss``: the fraction of (relevant, irrelevant)
    label pairs of an example scored in the right order (ties count 1/2),
    averaged over the examples that have both kinds of labels, as reported by
    ``prbmrm predict``. ``sklearn.metrics.hamming_loss(y,
    predict(X))`` gives the Hamming loss of the thresholded scores.
    """

    _default_losses = ("multilabel_hinge", "multilabel_hinge")
    _losses = _losses_of_task("multilabel")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        return tags

    def fit(self, X, y):
        """Fit the model to X and the label indicator y.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples, n_labels)
            0/1 indicator of each example's labels.

        Returns
        -------
        self
        """
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64, multi_output=True)
        y = check_array(y, ensure_2d=False, dtype=None)
        if y.ndim != 2 or y.shape[1] < 2 or type_of_target(y) != "multilabel-indicator":
            raise ValueError(f"{type(self).__name__} needs y as a 0/1 label indicator with at least "
                             f"2 columns, got {type_of_target(y)} y of shape {y.shape}")
        loss = self._loss_name()
        self.classes_ = np.arange(y.shape[1])
        self._fit_linear(X, y.astype(np.int8), loss, label_kind="multilabel")
        return self

    def decision_function(self, X):
        """Return the label scores of the rows of X, shape (n_samples, n_labels)."""
        return self._scores(X)

    def predict(self, X):
        """Return the label indicator ``decision_function(X) > 0``, shape (n_samples, n_labels)."""
        return (self.decision_function(X) > 0).astype(np.int64)

    def score(self, X, y):
        """Return ``1 - ranking_loss`` of the scores of X against the indicator y (see Notes).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : array-like of shape (n_samples, n_labels)

        Returns
        -------
        float
            NaN if no example has both relevant and irrelevant labels.
        """
        from .losses import get_loss

        scores = self.decision_function(X)
        return 1.0 - get_loss(self.loss_).metrics(scores, np.asarray(y))["ranking_loss"]


_THREADPOOLS = []  # the ThreadpoolController, made on first use: it scans the loaded libraries (8 ms a fit)


def _one_thread():
    """A context in which the BLAS and OpenMP pools run one thread."""
    if not _THREADPOOLS:
        from threadpoolctl import ThreadpoolController

        _THREADPOOLS.append(ThreadpoolController())
    return _THREADPOOLS[0].limit(limits=1)


# The regularizers that sum a term per weight, each smallest at 0: a feature no example has gets weight 0.
_SEPARABLE = ("l2", "l1", "elastic_net", "lp")


def _used_columns(X, reg):
    """Return ``(X without its all-zero columns, the indices of the others)`` for sparse `X` and a
    regularizer of :data:`_SEPARABLE`, else ``(X, None)``.

    Exact: J(w) = lam * sum_j omega(w_j) + R_emp(Xw), and R_emp does not see
    the weight of a feature no example has, so its optimal weight is 0 (the
    minimizer of omega) and the others solve the same problem on the
    remaining columns, with the same objective and certified gap (not
    the same bits: the sums run over other blocks). Done when at most half
    the columns are used: hashed text (2^20 columns, a few percent used)
    trains several times faster.
    """
    if not (sp.issparse(X) and reg in _SEPARABLE):
        return X, None
    # Marks and a position per column of the indices' type: no count or cumulative sum of int64 over
    # all 2^20 columns of hashed text (a third of the time).
    present = np.zeros(X.shape[1], dtype=bool)
    present[X.indices] = True
    used = np.flatnonzero(present)
    if 2 * used.size > X.shape[1]:
        return X, None
    position = np.empty(X.shape[1], dtype=X.indices.dtype)  # read only at the used columns
    position[used] = np.arange(used.size, dtype=X.indices.dtype)
    compact = sp.csr_matrix((X.data, position[X.indices], X.indptr), shape=(X.shape[0], used.size))
    return compact, used


# warm_start: per key of a training set and settings, the last result (rank 0) and a copy of that data,
# most recent last; at most _WARM_LIMIT entries holding at most _WARM_BYTES of copies.
_WARM_STARTS = OrderedDict()
_WARM_LIMIT = 8
_WARM_BYTES = 2**28
_SAMPLES = 64  # values sampled from each array of the training data for its key


def _fit_key(X, y, options, settings):
    """A key of the training data, its options and the fit's settings, cheap at any size.

    The data's shapes, nonzeros and dtypes, `_SAMPLES` entries of each array
    at fixed spread positions and a position-weighted sum of each (one
    vectorised pass, no hash of the data): the folds GridSearchCV cuts
    differ in these, while the same fold cloned for another lam gives the
    same key. Data that agree in all of them find the same entry, which
    :func:`_warm_start` uses only for data equal to its copy.
    """
    digest = hashlib.blake2b(repr(settings).encode(), digest_size=16)
    for a in _training_arrays(X, y, options):
        flat = a.reshape(-1)
        picked = flat[np.linspace(0, flat.size - 1, min(_SAMPLES, flat.size)).astype(np.intp)]
        weighted = float(np.dot(np.arange(1.0, flat.size + 1.0) % 1021.0, flat)) if flat.dtype.kind in "biuf" else 0.0
        digest.update(f"{a.dtype.str}{a.shape}{weighted!r}".encode())
        digest.update(np.ascontiguousarray(picked).view(np.uint8))
    digest.update(repr(sorted((k, v) for k, v in options.items()
                              if not isinstance(v, np.ndarray))).encode())
    return digest.hexdigest()


def _training_arrays(X, y, options):
    """The arrays that make up the training data: X's (CSR: data, indices, indptr), y, the array options."""
    arrays = [X.data, X.indices, X.indptr] if sp.issparse(X) else [np.asarray(X)]
    return arrays + [np.asarray(y)] + [options[k] for k in sorted(options) if isinstance(options[k], np.ndarray)]


def _warm_start(key, X, y, options):
    """The result kept under `key` if the data it was trained on equal (X, y, options) exactly, else None.

    A key is cheap and may collide (:func:`_fit_key`); the planes of other
    data are no lower bounds of this data's risk, so the kept copy decides.
    """
    entry = _WARM_STARTS.get(key)
    if entry is None:
        return None
    result, kept = entry
    arrays = _training_arrays(X, y, options)
    same = len(kept) == len(arrays) and all(
        a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) for a, b in zip(kept, arrays))
    return result if same else None


def _keep_warm_start(key, X, y, options, result):
    """Keep `result` under `key` with a copy of its data (not the caller's arrays, which may change);
    the oldest entries go beyond :data:`_WARM_LIMIT` entries or :data:`_WARM_BYTES` of copies."""
    _WARM_STARTS.pop(key, None)
    arrays = _training_arrays(X, y, options)
    if sum(a.nbytes for a in arrays) > _WARM_BYTES:
        return
    _WARM_STARTS[key] = (result, [np.array(a, copy=True) for a in arrays])
    while len(_WARM_STARTS) > _WARM_LIMIT or sum(
            a.nbytes for _, kept in _WARM_STARTS.values() for a in kept) > _WARM_BYTES:
        _WARM_STARTS.popitem(last=False)


def query_pairs(y, qid=None):
    """Return the preference pairs ``(i, j)`` of each query: ``y_i < y_j`` (j should rank above i).

    Parameters
    ----------
    y : ndarray of shape (n,)
        Relevance grades.
    qid : array-like of shape (n,), optional
        Query ids; None: one query.

    Returns
    -------
    lower, upper : ndarray of int64
        Row numbers i and j of every pair, query by query.
    """
    qid = np.zeros(len(y), dtype=np.int64) if qid is None else np.asarray(qid)
    lower, upper = [], []
    for rows in query_rows(qid):
        i, j = np.nonzero(y[rows][:, None] < y[rows][None, :])
        lower.append(rows[i])
        upper.append(rows[j])
    return np.concatenate(lower).astype(np.int64), np.concatenate(upper).astype(np.int64)


_ONE_COLUMN = ("the check trains on one column of class labels; multilabel_hinge needs a 0/1 "
               "indicator of at least 2 labels (the multilabel checks of check_estimator pass)")

EXPECTED_FAILED_CHECKS = {
    "BMRMMultilabelClassifier": dict.fromkeys((
        "check_classifier_data_not_an_array", "check_classifiers_classes",
        "check_classifiers_one_label", "check_classifiers_train", "check_dict_unchanged",
        "check_dont_overwrite_parameters", "check_dtype_object", "check_estimator_sparse_array",
        "check_estimator_sparse_matrix", "check_estimator_sparse_tag", "check_estimators_dtypes",
        "check_estimators_fit_returns_self", "check_estimators_nan_inf",
        "check_estimators_overwrite_params", "check_estimators_pickle", "check_f_contiguous_array_estimator",
        "check_fit2d_1feature", "check_fit2d_1sample", "check_fit2d_predict1d", "check_fit_check_is_fitted",
        "check_fit_idempotent", "check_fit_score_takes_y", "check_methods_sample_order_invariance",
        "check_methods_subset_invariance", "check_n_features_in", "check_n_features_in_after_fitting",
        "check_non_transformer_estimators_n_iter", "check_pipeline_consistency",
        "check_positive_only_tag_during_fit", "check_readonly_memmap_input"), _ONE_COLUMN),
}
"""Checks of ``check_estimator`` each estimator fails by design, by class name, with the reason.

Only :class:`BMRMMultilabelClassifier` has any: scikit-learn's generic checks
train every classifier on one column of class labels, which is not
multilabel data. The same behaviours are tested on multilabel data in
``tests/test_estimators.py``.
"""


def expected_failed_checks(estimator):
    """Return the checks `estimator` fails by design, with reasons (for ``parametrize_with_checks``)."""
    return EXPECTED_FAILED_CHECKS.get(type(estimator).__name__, {})
