"""The compiled passes of the risk oracle and the subproblem, and the row blocks they run over.

The kernels are Cython extension modules (``*.pyx``) that the build backend
compiles at install; a checkout run in place needs them built first.
"""

try:
    from . import scalar  # noqa: F401  (the first of the extension modules)
except ImportError as error:  # a source tree whose extension modules were never built
    raise ImportError("prbmrm's compiled kernels are not built: install the package (`pip install .`, or "
                      "`pip install -e .` for a checkout), or build them in place with "
                      "`python setup.py build_ext --inplace`") from error
