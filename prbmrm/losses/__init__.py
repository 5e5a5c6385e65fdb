"""Losses: given w and a local shard, the sum of losses and the sum of subgradients.

A loss object has one vectorised call, :meth:`Loss.loss_gradient`, returning
``(risk_sum, grad_sum)`` over the examples of one block of this rank's shard,
the way scikit-learn's ``LinearModelLoss.loss_gradient`` does. The risk oracle
adds the blocks of all ranks and divides by the global number of examples.

Scalar losses (paper 000, Table 5) share the skeleton of Algorithm 6::

    f = X @ w;   risk = sum_i l(f_i, y_i);   grad = X.T @ l'(f, y)

and define only ``l`` and ``l'``. Losses are found by name in :data:`LOSSES`.
"""

from ..errors import UsageError
from ._base import BinaryLoss, Loss, MultivariateLoss, RegressionLoss, ScalarLoss
from .multivariate import MULTIVARIATE_LOSSES
from .scalar import SCALAR_LOSSES
from .vector import VECTOR_LOSSES

LOSSES = {cls.name: cls for cls in SCALAR_LOSSES + VECTOR_LOSSES + MULTIVARIATE_LOSSES}
"""Registry of losses by name: the values of ``--loss``."""


def get_loss(name, **params):
    """Return a new instance of the loss registered as `name`, with its parameters.

    `name` is a key of :data:`LOSSES` or of an entry point of the group
    ``prbmrm.losses`` (:mod:`prbmrm.plugins`). A name for a
    :class:`prbmrm.structured.StructuredModel` subclass gives its
    :class:`prbmrm.structured.StructuredLoss`: the parameter ``form``
    (``margin``, ``slack`` or ``logistic``; default ``margin``) chooses the
    loss, the others go to the model.

    Raises
    ------
    UsageError
        If no loss has that name (the message lists the known names, plug-ins
        included), its plug-in is broken, or a parameter is unknown or of the
        wrong type.
    """
    from ..plugins import check_plugin, lookup
    from ..structured import StructuredLoss, StructuredModel

    cls = lookup(LOSSES, "loss", name)
    is_class = isinstance(cls, type)
    if is_class and issubclass(cls, StructuredModel):
        params = dict(params)
        form = params.pop("form", "margin")
        try:
            return StructuredLoss(cls(**params), form, name=name)
        except ValueError as error:  # a model's own check of its parameters, or an unsupported form
            raise UsageError(f"loss {name!r}: {error}") from None
    check_plugin("loss", name, cls, is_class and issubclass(cls, Loss),
                 "a subclass of prbmrm.losses.Loss or prbmrm.structured.StructuredModel")
    return cls(**params)


__all__ = ["LOSSES", "BinaryLoss", "Loss", "MultivariateLoss", "RegressionLoss", "ScalarLoss",
           "get_loss"]

# Last: the structured package builds on ._base and adds its built-in models to LOSSES.
from .. import structured  # noqa: E402,F401
