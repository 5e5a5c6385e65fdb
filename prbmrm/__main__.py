"""The ``prbmrm`` command: ``prbmrm SUBCOMMAND [options]`` runs ``python -m prbmrm.<module>``.

``prbmrm`` (or ``python -m prbmrm``) alone, or with ``-h``, lists the
subcommands; ``prbmrm train ...`` is exactly ``python -m prbmrm.cli.train ...``
(also under ``mpiexec -n P``), and so on for each entry of :data:`COMMANDS`.

Imports: of prbmrm: :mod:`prbmrm.cli.common` (once a subcommand is named, to tell it the name the user
typed); the subcommand's module is run by name.
"""

import runpy
import sys

from .version import __version__

COMMANDS = {
    "shard": ("prbmrm.cli.shard", "convert SVMlight/LIBSVM, .npz or .csv input into HDF5 shard files"),
    "train": ("prbmrm.cli.train", "train a model on shards or a text file (under mpiexec: on several ranks)"),
    "predict": ("prbmrm.cli.predict", "score a model on shards or a text file"),
    "plot": ("prbmrm.cli.plot", "plot a model's training history (needs matplotlib)"),
    "party": ("prbmrm.cli.party", "party mode's keys: 'prbmrm party keygen' and 'prbmrm party roster'"),
}
"""Subcommand: (the module it runs, one line of help)."""


def usage():
    """The text ``prbmrm`` prints without a subcommand."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: prbmrm SUBCOMMAND [options]   (prbmrm {__version__}; 'prbmrm SUBCOMMAND -h' for its options)",
             "", "subcommands:"]
    lines += [f"  {name:<{width}}  {text}  (python -m {module})" for name, (module, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    """Run the subcommand named by ``argv[0]`` with the rest of `argv`; return an exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        print(f"prbmrm {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"prbmrm: error: unknown subcommand {argv[0]!r}; one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = COMMANDS[argv[0]][0]
    from .cli import common

    common.INVOKED_AS[module] = f"prbmrm {argv[0]}"
    sys.argv = [module, *argv[1:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return done.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
