"""Every rank's copy of BMRM's planes: rank 0 sends the multipliers of the next iterate, not the iterate.

BMRM's iterate is the primal map of the subproblem's multipliers, ``w = -A^T alpha / lam`` (a quadratic
regularizer), and every plane's subgradient ``a_t`` is a sum that every rank receives anyway from the
evaluation's Allreduce. So each serving rank keeps the same planes as rank 0 (a
:class:`~prbmrm.solvers.base.CuttingPlaneModel` fed the same evaluations: aggregation and pruning included,
the same code on the same numbers), and an iteration's message is alpha (t words, t the planes) and a
checksum of w instead of w (d words): every rank computes ``w`` with the same code
(:meth:`~prbmrm.solvers.bundle.Bundle.combine` of a sparse bundle, a compiled loop in a fixed order, and the
regularizer's ``primal``), so it has rank 0's bits, which the checksum (CRC-32 of w's bytes) confirms: a
rank whose w differs fails the evaluation, and every rank raises its message (never a silent divergence).

Used where every step is deterministic across machines: a sparse bundle (a dense bundle's ``A^T alpha`` is a
BLAS product, whose sums may depend on the CPU), a quadratic regularizer with ``B = c I`` whose parameters
travel as JSON numbers, a decomposable loss, a fresh bundle (not a warm start or a resumed run, whose planes
only rank 0 holds) and :attr:`~prbmrm.distributed.oracle.DistributedRisk.service_points` (party mode turns
it off: its parties check the coordinator's w).

Imports: numpy, zlib; of prbmrm: :mod:`prbmrm.distributed.oracle`, :mod:`prbmrm.regularizers`,
:mod:`prbmrm.solvers.base`.
"""

import numbers
import zlib

import numpy as np

from ..distributed.oracle import service
from ..regularizers import get_regularizer
from .base import CuttingPlaneModel


def checksum(w):
    """CRC-32 of the bytes of the float64 array `w` (an integer below 2^32: exact as a float64)."""
    return zlib.crc32(np.ascontiguousarray(w, dtype=np.float64))


@service("planes")
class PlaneMirror:
    """The planes of BMRM on a serving rank, and rank 0's end of the multipliers it sends.

    Built on every rank by :meth:`start` (``risk.attach``); on rank 0,
    :meth:`evaluate` sends the multipliers of w and evaluates there. On the
    other ranks, the oracle calls :meth:`point` with each short message and
    :meth:`evaluated` after each evaluation (the first one at w0, which
    travels whole, included).

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
    lam : float
    regularizer : str
        Its name (:data:`prbmrm.regularizers.REGULARIZERS`).
    params : dict
        Its parameters, numbers or None.
    idle_age, bundle_size, bundle_memory : int
        BMRM's (:func:`prbmrm.solvers.bmrm.minimize_bmrm`).
    """

    points = True
    """Its points travel as short messages (:meth:`prbmrm.distributed.oracle.DistributedRisk.evaluate_point`)."""

    def __init__(self, risk, lam, regularizer, params, idle_age, bundle_size, bundle_memory):
        self.risk = risk
        self.lam = float(lam)
        self.regularizer = get_regularizer(regularizer, **params)
        self.model = CuttingPlaneModel(risk.dim, self.lam, self.regularizer, int(idle_age), int(bundle_size),
                                       int(bundle_memory))
        self._gradient = np.empty(risk.dim)
        self._w = np.empty(risk.dim)

    @classmethod
    def start(cls, risk, model, regularizer):
        """Attach a copy of `model`'s planes to every rank of `risk`; return rank 0's end, or None where the
        conditions of the module's docstring do not hold (the iterates then travel whole)."""
        params = {name: getattr(regularizer, name) for name in getattr(regularizer, "params", {})}
        if not (getattr(risk, "service_points", False) and risk.comm.size > 1 and risk.loss.decomposable
                and model.bundle.size == 0 and model.bundle.sparse and hasattr(regularizer, "primal")
                and getattr(regularizer, "metric", True) is None
                and all(value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool))
                        for value in params.values())):
            return None
        bundle = model.bundle
        return risk.attach(cls, model.lam, regularizer.name, {k: v if v is None else float(v) for k, v in params.items()},
                           model.idle_age, bundle.max_size or 0, bundle.max_bytes or 0)

    def evaluate(self, w, alpha, out=None):
        """Return ``(R_emp(w), a)`` (rank 0): w is ``regularizer.primal(bundle.combine(alpha), lam)`` of the
        planes as they were when alpha was found (before pruning); alpha and w's checksum travel."""
        return self.risk.evaluate_point(np.append(alpha, checksum(w)), w, out)

    def point(self, payload):
        """The w of rank 0's message ``[alpha, checksum]`` (a serving rank); then prune as rank 0 did.

        Raises
        ------
        RuntimeError
            If this rank's w is not rank 0's (its checksum differs).
        """
        alpha = np.array(payload[:-1])
        if len(alpha) != self.model.bundle.size:
            raise RuntimeError(f"rank {self.risk.comm.rank}: rank 0 sent {len(alpha)} multipliers for its copy "
                               f"of {self.model.bundle.size} planes")
        w = self.regularizer.primal(self.model.bundle.combine(alpha, self._w), self.lam)
        if checksum(w) != payload[-1]:
            raise RuntimeError(f"rank {self.risk.comm.rank}: its copy of the planes gives another w than "
                               f"rank 0's (CRC-32 {checksum(w)}, rank 0's {int(payload[-1])})")
        self.model.alpha = alpha
        self.model.prune()
        return w

    def evaluated(self, w):
        """Add the plane of the evaluation at `w` just summed, as rank 0's BMRM does (a serving rank)."""
        r, a = self.risk.result(out=self._gradient)
        self.model.add_plane(w, r, a)

    def close(self):
        """End the copies (rank 0): the next messages carry w again."""
        self.risk.detach()
