"""Test driver: ``python tests/distributed/fault_driver.py KIND RANK CALL [train options]`` runs
``prbmrm.cli.train`` with one fault injected on MPI rank RANK at its CALL-th risk evaluation.

KIND is one of:

- ``memory``: a MemoryError inside the rank's own risk evaluation (its data pass);
- ``solver``: a MemoryError on rank 0 in the solver, right after its CALL-th evaluation returned;
- ``exit``: ``sys.exit(3)`` inside the evaluation; ``hardexit``: ``os._exit(3)`` there;
- ``stuck``: a loop that never ends inside the evaluation (the rank still answers pings).

Only this script patches anything (the oracle's methods, from outside): production code has no hook.
"""

import os
import sys

from prbmrm.distributed import oracle


def inject(kind, rank, call):
    calls = {"n": 0}
    if kind == "solver":
        evaluate = oracle.DistributedRisk.__call__

        def patched_call(self, *args, **kwargs):
            result = evaluate(self, *args, **kwargs)
            calls["n"] += 1
            if calls["n"] == call:
                raise MemoryError("injected in the solver")
            return result

        oracle.DistributedRisk.__call__ = patched_call
        return
    partials = oracle.DistributedRisk._decomposable_partials

    def patched(self, w):
        calls["n"] += 1
        if calls["n"] == call:
            if kind == "memory":
                raise MemoryError("injected")
            if kind == "exit":
                sys.exit(3)
            if kind == "hardexit":
                os._exit(3)
            if kind == "stuck":
                spin = 0
                while True:  # pure Python: the watch thread still gets the GIL and answers pings
                    spin += 1
        return partials(self, w)

    oracle.DistributedRisk._decomposable_partials = patched


if __name__ == "__main__":
    kind, rank, call = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if int(os.environ.get("PMI_RANK", "0")) == rank:
        inject(kind, rank, call)
    from prbmrm.cli.common import run
    from prbmrm.cli.train import main

    sys.exit(run(main, "prbmrm.cli.train", sys.argv[4:]))
