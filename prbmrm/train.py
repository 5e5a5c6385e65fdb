"""``python -m prbmrm.train``: the training command, as ``mpiexec -n P python -m prbmrm.train ...`` runs it.

The same as ``prbmrm train``; the command itself is :mod:`prbmrm.cli.train`.
"""

if __name__ == "__main__":
    from .cli.train import command

    command("prbmrm.train")
