"""A command's process loads four numpy submodules it never uses only when something reads them.

scipy (>= 1.15) copies numpy's namespace into its vendored ``array_api_compat``
with ``from numpy import *`` when ``scipy.sparse`` is imported, and numpy 2
lists its submodules in ``__all__``, so every rank would import numpy.f2py
(and through it charset_normalizer), numpy.testing, numpy.polynomial and
numpy.ctypeslib: about 0.1 CPU s of a rank's start-up here, more than all of
prbmrm's own modules. :class:`DeferredModules` finds those four through the
standard import system with :class:`importlib.util.LazyLoader`: each becomes
a module object whose code runs when one of its attributes is first read, so
code that does use them works as before (``tests/cli/test_cli.py`` checks both).

Only the commands install it (:mod:`prbmrm.cli`'s ``__init__``): a process
that imports prbmrm as a library keeps its imports as they are.

Imports: the standard library.
"""

import importlib.machinery
import importlib.util
import sys


class DeferredModules:
    """A meta path finder that gives :attr:`NAMES` lazy loaders (nothing else)."""

    NAMES = ("numpy.f2py", "numpy.testing", "numpy.polynomial", "numpy.ctypeslib")

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        """The regular spec of `name` with a lazy loader, for :attr:`NAMES`; None for other modules."""
        if name not in cls.NAMES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec

    @classmethod
    def install(cls):
        """Put the finder first on :data:`sys.meta_path` (once); modules imported already stay as they are."""
        if cls not in sys.meta_path:
            sys.meta_path.insert(0, cls)
