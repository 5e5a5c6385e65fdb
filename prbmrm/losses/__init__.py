"""Losses: given w and a local shard, the sum of losses and the sum of subgradients.

A loss object has one vectorised call, :meth:`Loss.loss_gradient`, returning
``(risk_sum, grad_sum)`` over the examples of one block of this rank's shard,
the way scikit-learn's ``LinearModelLoss.loss_gradient`` does. The risk oracle
adds the blocks of all ranks and divides by the global number of examples.

Scalar losses (paper 000, Table 5) share the skeleton of Algorithm 6::

    f = X @ w;   risk = sum_i l(f_i, y_i);   grad = X.T @ l'(f, y)

and define only ``l`` and ``l'``. Losses are found by name in :data:`LOSSES`,
which :func:`register_loss` fills: the built-in ones here, the structured
models from :mod:`prbmrm.structured` (like a plug-in: this package never
imports it), a user's own with one call.

Imports: numpy, scipy, :mod:`prbmrm.errors`, :mod:`prbmrm.plugins` and its own modules.
"""

from ..plugins import check_plugin, lookup
from .base import BinaryLoss, Loss, MultivariateLoss, RegressionLoss, ScalarLoss
from .multivariate import MULTIVARIATE_LOSSES
from .scalar import SCALAR_LOSSES
from .vector import VECTOR_LOSSES

LOSSES = {}
"""Registry of losses by name: the values of ``--loss``, filled by :func:`register_loss`."""


def register_loss(cls, name=None):
    """Add a loss to :data:`LOSSES` under `name` (default: its ``name`` attribute); return it.

    `cls` is a :class:`Loss` subclass (for a scalar loss: a :class:`ScalarLoss`
    subclass defining ``value`` and ``derivative`` as numpy expressions), or a
    model class with a ``make_loss(name, **params)`` class method
    (:class:`prbmrm.structured.StructuredModel`). Usable as a class decorator.

    A scalar loss registered here takes the numpy path: its risk pass calls
    its ``value`` and ``derivative`` on each group of rows, between scipy's
    products ``X @ w`` and ``X.T @ l'``; only the built-in scalar losses have
    compiled formulas (:attr:`ScalarLoss.compiled`) and compiled passes.
    """
    LOSSES[cls.name if name is None else name] = cls
    return cls


for _loss in SCALAR_LOSSES + VECTOR_LOSSES + MULTIVARIATE_LOSSES:
    register_loss(_loss)


def get_loss(name, **params):
    """Return a new instance of the loss registered as `name`, with its parameters.

    `name` is a key of :data:`LOSSES` (the structured models register there
    when :mod:`prbmrm.structured` is imported, which a first unknown name
    does: :data:`prbmrm.plugins.BUILTIN_PLUGINS`) or of an entry point of
    the group ``prbmrm.losses`` (:mod:`prbmrm.plugins`). A name for a
    :class:`prbmrm.structured.StructuredModel` subclass gives its
    :class:`prbmrm.structured.StructuredLoss` (its ``make_loss``): the
    parameter ``form`` (``margin``, ``slack`` or ``logistic``; default
    ``margin``) chooses the loss, the others go to the model.

    Raises
    ------
    UsageError
        If no loss has that name (the message lists the known names, plug-ins
        included), its plug-in is broken, or a parameter is unknown or of the
        wrong type.
    """
    cls = lookup(LOSSES, "loss", name)
    is_class = isinstance(cls, type)
    if is_class and not issubclass(cls, Loss) and callable(getattr(cls, "make_loss", None)):
        return cls.make_loss(name, **params)  # a model whose loss is built on it (structured)
    check_plugin("loss", name, cls, is_class and issubclass(cls, Loss),
                 "a subclass of prbmrm.losses.Loss or prbmrm.structured.StructuredModel")
    return cls(**params)


__all__ = ["LOSSES", "BinaryLoss", "Loss", "MultivariateLoss", "RegressionLoss", "ScalarLoss",
           "get_loss", "register_loss"]
