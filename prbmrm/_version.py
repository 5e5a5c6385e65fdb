"""The package version, in a module of its own so that any module can import it without importing the package.

Imports: the standard library only.
"""

__version__ = "0.1.0"
