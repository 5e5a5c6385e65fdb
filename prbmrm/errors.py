"""Exceptions with messages meant for the user, not for a traceback.

Every message names the thing that is wrong (a file, an option, a label set)
and the problem, in one line.

Imports: the standard library only.
"""


class PrbmrmError(Exception):
    """Base class of every error prbmrm reports to its user."""


class InputError(PrbmrmError):
    """Bad input: a malformed or inconsistent data file, a bad option value.

    Raised on the rank that found the problem; the entry points turn it into
    a collective error (see :meth:`prbmrm.distributed.comm.SerialComm.check`) so that every
    rank stops with the same message.
    """


class CollectiveError(PrbmrmError):
    """An error that every rank raises together, with the same message.

    Raised by :meth:`prbmrm.distributed.comm.SerialComm.check` after one Allreduce of an
    error flag, so no rank is left blocked in a collective call.
    """


class JointError(CollectiveError):
    """A CollectiveError that every rank raised inside one collective call.

    The serving ranks leave their serve loop with it too (a secure sum that
    overflowed or that carried a party's report), so rank 0 must not stop
    them: :func:`prbmrm.distributed.oracle.run_distributed` lets it pass.
    """


class UsageError(PrbmrmError):
    """A bad option or option value, found identically on every rank.

    Every rank parses the same command line, so every rank raises it
    together without any communication.
    """


class CoordinatorError(JointError):
    """A party found that the coordinator (rank 0) deviated from the protocol.

    Raised together with a :class:`CollectiveError` on the other ranks (see
    :meth:`prbmrm.party.secure.SecureComm.report_deviation`), so no rank waits; the
    message is this party's own, and each party that found it prints it.
    """


class ConvergenceWarning(UserWarning):
    """A run stopped at its iteration limit before its gap test held: the model is the best iterate, its
    gap the certified distance to the optimum (the estimators raise scikit-learn's warning of this name)."""
