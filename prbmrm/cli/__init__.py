"""The commands: ``prbmrm shard|train|predict|plot|party``, each a thin layer over the library.

One module per command (:mod:`~prbmrm.cli.shard`, :mod:`~prbmrm.cli.train`,
:mod:`~prbmrm.cli.predict`, :mod:`~prbmrm.cli.plot`), what they share (:mod:`~prbmrm.cli.common`:
argument errors and exit handling) and configuration files (:mod:`~prbmrm.cli.config`).

Importing this package first defers numpy submodules that scipy would load and no command uses
(:mod:`~prbmrm.cli.deferred`), before any command imports scipy.
"""

from .deferred import DeferredModules

DeferredModules.install()
