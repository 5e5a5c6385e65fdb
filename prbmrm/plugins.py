"""Third-party losses, regularizers and solvers: Python entry points, loaded when first named.

A package adds its own by declaring entry points, e.g. in its pyproject.toml::

    [project.entry-points."prbmrm.losses"]
    my_chain = "my_package.models:MyChainModel"

Groups: ``prbmrm.losses`` (a :class:`prbmrm.losses.Loss` subclass, or a
:class:`prbmrm.structured.StructuredModel` subclass, which becomes a
:class:`prbmrm.structured.StructuredLoss` with ``--loss-param
form=margin|slack|logistic``), ``prbmrm.regularizers`` (a
:class:`prbmrm.regularizers.Regularizer` subclass) and ``prbmrm.solvers``
(a function with the signature of :func:`prbmrm.solvers.bmrm.minimize_bmrm`).
A name is looked up in the built-in registry first; only a name that is not
there loads the entry point of that name (importing its module), so a
broken plug-in affects only runs that ask for it.

Imports: of prbmrm: :mod:`prbmrm.errors`.
"""

import difflib
from importlib import import_module

from .errors import UsageError

GROUPS = {"loss": "prbmrm.losses", "regularizer": "prbmrm.regularizers", "solver": "prbmrm.solvers"}
"""Entry point group of each kind of plug-in."""


BUILTIN_PLUGINS = ("prbmrm.structured",)
"""Packages of prbmrm that extend the registries the way third-party plug-ins do: by registering
(:func:`prbmrm.losses.register_loss`, :func:`prbmrm.io.register_layout`) when imported. The
registries import them by name, after they are complete, the first time a name is not found: no
module of the core imports them, so the import graph keeps its one direction."""


def load_builtin_plugins():
    """Import the packages of :data:`BUILTIN_PLUGINS` (once; they register their losses and layouts)."""
    for name in BUILTIN_PLUGINS:
        import_module(name)


def _entry_points(kind):
    from importlib import metadata  # with email and zipfile, ~5 ms that a run naming no plug-in never needs

    return {point.name: point for point in metadata.entry_points(group=GROUPS[kind])}


def plugin_names(kind):
    """Return the sorted names of the installed plug-ins of `kind` ("loss", "regularizer" or "solver")."""
    return sorted(_entry_points(kind))


class PluginHelp(str):
    """The help text of an option that names a plug-in: lists the built-in and installed ones when shown.

    Finding the installed plug-ins reads the entry points of every installed
    distribution (~4 ms per kind), which parsing a command line never needs:
    argparse expands a help text with ``%`` only to show it (``--help``), and
    that is when ``{names}`` in `template` becomes the list.

    Parameters
    ----------
    template : str
        The text, with ``{names}`` where the names go.
    kind : {"loss", "regularizer", "solver"}
    builtin : iterable of str
        The built-in names, listed first.
    """

    def __new__(cls, template, kind, builtin):
        text = super().__new__(cls, template)
        text.kind, text.builtin = kind, tuple(builtin)
        return text

    def __mod__(self, params):
        return str.__mod__(self, params).replace("{names}", ", ".join([*self.builtin, *plugin_names(self.kind)]))


def lookup(registry, kind, name):
    """Return ``registry[name]``, or the object of the entry point `name` of the group of `kind`.

    Parameters
    ----------
    registry : dict
        The built-in objects by name (:data:`prbmrm.losses.LOSSES`, ...).
    kind : {"loss", "regularizer", "solver"}
    name : str

    Raises
    ------
    UsageError
        If neither has `name` (the message lists the built-in and plug-in
        names), or the entry point cannot be loaded (the message names the
        entry point, its group and the error).
    """
    if name not in registry:
        load_builtin_plugins()
    if name in registry:
        return registry[name]
    points = _entry_points(kind)
    if name not in points:
        known = ", ".join(sorted(set(registry) | set(points)))
        plural = {"loss": "losses", "regularizer": "regularizers", "solver": "solvers"}[kind]
        close = difflib.get_close_matches(str(name), sorted(set(registry) | set(points)), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"unknown {kind} {name!r}; {hint}known {plural}: {known}")
    point = points[name]
    try:
        return point.load()
    except Exception as error:
        raise UsageError(f"{kind} plug-in {name!r} (entry point {point.value!r} of group {point.group!r}) "
                         f"cannot be loaded: {type(error).__name__}: {error}") from error


def check_plugin(kind, name, obj, ok, what):
    """Raise UsageError naming the plug-in unless `ok`: it is not `what` (e.g. "a Loss subclass")."""
    if not ok:
        raise UsageError(f"{kind} plug-in {name!r} of group {GROUPS[kind]!r} is {obj!r}, not {what}")
