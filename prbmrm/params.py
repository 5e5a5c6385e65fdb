"""Named parameters of losses and regularizers (``--loss-param`` / ``--reg-param NAME=VALUE``).

Both kinds of objects declare their parameters with defaults in a ``params``
dict and validate them the same way, so their messages read alike.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`.
"""

import numpy as np

from .errors import UsageError


def parse_params(pairs, option):
    """Turn ``["tau=0.3", "cost=linear"]`` into ``{"tau": "0.3", "cost": "linear"}``.

    Parameters
    ----------
    pairs : list of str or None
        The values given to `option`, in order (a later NAME wins).
    option : str
        The option's name for the error message, e.g. ``"--loss-param"``.
    """
    params = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"{option} expects NAME=VALUE, got {pair!r}")
        params[name.strip()] = value.strip()
    return params


class Parametrized:
    """Base of objects with named parameters: checked and converted on construction.

    Parameters
    ----------
    **params
        Values for the names in :attr:`params`; each is converted to the type
        of its default (a default of None keeps the value as given).

    Attributes
    ----------
    kind : str
        ``"loss"`` or ``"regularizer"``: how messages name the object.
    option : str
        The command-line option that sets the parameters.
    name : str
        The registry name.
    params : dict
        Parameter names and their defaults; the instance has one attribute each.
    """

    kind = None
    option = None
    name = None
    params = {}

    def __init__(self, **params):
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            known = ", ".join(self.params) or "none"
            raise UsageError(f"{self.kind} {self.name!r} has no parameter {unknown[0]!r} "
                             f"(its parameters: {known})")
        for key, default in self.params.items():
            value = params.get(key, default)
            try:
                setattr(self, key, type(default)(value) if default is not None else value)
            except ValueError:
                kind = {"int": "an integer", "float": "a number"}.get(type(default).__name__,
                                                                   type(default).__name__)
                raise UsageError(f"{self.kind} parameter {key}={value!r}: expected {kind}") from None
        self.check_params()

    def check_params(self):
        """Raise :class:`UsageError` if a parameter value is out of range (none are, by default).

        Called at the end of ``__init__``, on every rank alike; the message
        names the parameter (see :meth:`_require`).
        """

    def _require(self, name, ok, what):
        """Raise UsageError ``KIND 'NAME': parameter PARAM must be WHAT, got VALUE`` unless `ok`."""
        if not ok:
            value = getattr(self, name)
            shown = f"{value:g}" if isinstance(value, float) else repr(value)
            raise UsageError(f"{self.kind} {self.name!r}: parameter {name} must be {what}, got {shown}")

    def _where(self, param):
        """``KIND 'NAME': OPTION PARAM=VALUE``, the start of a message about a file parameter."""
        value = getattr(self, param)
        shown = value if np.ndim(value) == 0 else f"<array of shape {np.shape(value)}>"
        return f"{self.kind} {self.name!r}: {self.option} {param}={shown}"

    def _read_numbers(self, param):
        """Read the whitespace-separated text file named by parameter `param` as a 2-D array.

        Raises UsageError naming the file if it cannot be read, holds
        something other than numbers, nothing, or a non-finite value.
        """
        where = self._where(param)
        try:
            M = np.loadtxt(getattr(self, param), dtype=np.float64, ndmin=2, comments="#")
        except OSError as error:
            raise UsageError(f"{where}: cannot read the file: {error.strerror or error}") from None
        except ValueError as error:
            raise UsageError(f"{where}: not a matrix of numbers ({error})") from None
        if M.size == 0:
            raise UsageError(f"{where}: the file holds no numbers")
        if not np.isfinite(M).all():
            raise UsageError(f"{where}: the file has a non-finite entry")
        return M
