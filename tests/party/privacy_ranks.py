"""Run under mpiexec by tests/party/test_privacy.py: party-mode runs whose results the test then checks.

    python tests/party/privacy_ranks.py compare DIR OUT.npz
        For each case of CASES, train plainly on DIR/NAME-all and in party mode
        on DIR/NAME-site-{rank} (verifying the coordinator); rank 0 saves
        both results.
    python tests/party/privacy_ranks.py transcript DIR OUT_PREFIX [SOLVER]
        Train in party mode over a communicator that records every message
        this rank sends and receives; each rank pickles its transcript, its
        true local sums per evaluation and per secure float sum, and its
        pairwise keys.
    python tests/party/privacy_ranks.py perturb EVALUATION ARGS...
        Run ``prbmrm.cli.train ARGS`` with rank 0 perturbing the w of the given
        evaluation (the test hook of a deviating coordinator).
"""

import copy
import pickle
import sys

import numpy as np

# BMRM on the logistic loss amplifies round-off about tenfold every 6 iterations: plain mode's own
# fixed-point rounding (secure sums are exact to about 1 ulp) grows to 1e-9 after ~40 iterations
# at lam 3e-3, so the logistic case runs at lam 1e-2 (24 iterations).
CASES = {"hinge": ("a9a", dict(loss="hinge", lam=3e-3)),
         "logistic": ("a9a", dict(loss="logistic", lam=1e-2)),
         "multiclass_hinge": ("dna", dict(loss="multiclass_hinge", lam=3e-2))}


class RecordingComm:
    """Wraps a communicator and records, per call, what this rank sent (the arguments) and received."""

    def __init__(self, comm):
        self.comm = comm
        self.records = []

    def __getattr__(self, name):
        attribute = getattr(self.comm, name)
        if not callable(attribute):
            return attribute

        def recorded(*args, **kwargs):
            sent = copy.deepcopy(args)  # copies before in-place collectives overwrite them
            received = attribute(*args, **kwargs)
            self.records.append((name, sent, copy.deepcopy(received)))
            return received

        return recorded


def compare(directory, out):
    from prbmrm.distributed.comm import get_comm
    from prbmrm.party.session import Party
    from prbmrm.training import run

    comm = get_comm()
    saved = {}
    for case, (name, options) in CASES.items():
        # Exact subproblems: w_t is then a continuous function of the planes, so the ~1 ulp by
        # which secure sums differ from plain ones stays ~1 ulp along the run. BMRM's default
        # loose subproblems stop where a discrete test (a step shorter than the tolerance) says,
        # which such an ulp can move by one step: another path, certified to the same gap
        # (checked below with "loose"), as is the default solver's run ("default").
        exact = dict(options, solver="bmrm", solver_params={"inexact": 0})
        plain, _, _ = run(f"{directory}/{name}-all", bias=True, comm=comm, **exact)
        party, _, _ = run(f"{directory}/{name}-site-{{rank}}", bias=True, comm=comm,
                          party=Party(verify_coordinator=True, audit_log=None), **exact)
        runs = {}
        for kind, own in (("loose", dict(options, solver="bmrm")), ("default", options)):
            runs[kind], _, _ = run(f"{directory}/{name}-site-{{rank}}", bias=True, comm=comm,
                                   party=Party(verify_coordinator=True, audit_log=None), **own)
        # Every party received the model, and verified every step of the run that made it.
        received = comm.gather_scalars(np.array([party is not None], dtype=np.float64))
        if comm.is_root:
            saved[f"{case}/received"] = received
            for kind, result in (("plain", plain), ("party", party), *runs.items()):
                saved[f"{case}/{kind}/w"] = result.w
                for column in ("objective", "lower_bound", "gap"):
                    saved[f"{case}/{kind}/{column}"] = result.history[column]
    if comm.is_root:
        np.savez(out, **saved)


def transcript(directory, prefix, solver="bmrm"):
    """Hinge on a9a in party mode, 60 iterations of `solver`, every message recorded."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.party.session import Party
    from prbmrm.party.secure import SecureComm
    from prbmrm.training import run

    comm = RecordingComm(get_comm())
    truths, sums = [], []
    honest = SecureComm.reproducible_sum

    def recorded(self, partials, n_parts):
        sums.append(np.asarray(partials, dtype=np.float64).sum(axis=0))  # this party's part of the sum
        return honest(self, partials, n_parts)

    SecureComm.reproducible_sum = recorded

    class Recorded(Party):
        def attach(self, oracle, *args):
            super().attach(oracle, *args)
            audit = oracle.observer

            def observe(w, partials):
                truths.append(partials.sum(axis=0))  # this party's (gradient, risk) sums
                audit(w, partials)

            oracle.observer = observe

    party = Recorded(audit_log=f"{prefix}-audit-{{rank}}.jsonl")
    run(f"{directory}/a9a-site-{{rank}}", bias=True, lam=1e-3, epsilon=0, rel_epsilon=0, max_iter=60,
        comm=comm, party=party, solver=solver)
    with open(f"{prefix}-{comm.rank}.pickle", "wb") as f:
        pickle.dump({"records": comm.records, "truths": np.array(truths), "keys": party.comm._keys,
                     "messages": party.comm.messages, "sums": sums}, f)


def perturb(evaluation, argv):
    """Rank 0 sends a w off by 1e-6 relative at `evaluation`; the run is ``prbmrm.cli.train argv``."""
    from prbmrm.cli.common import run
    from prbmrm.distributed.comm import get_comm
    from prbmrm.distributed.oracle import DistributedRisk
    from prbmrm.cli.train import main as train

    if get_comm().is_root:
        honest = DistributedRisk.__call__

        def deviating(self, w):
            if self.evaluations + 1 == evaluation:
                w = w + 1e-6 * (1.0 + np.abs(w))
            return honest(self, w)

        DistributedRisk.__call__ = deviating
    sys.exit(run(train, "prbmrm.cli.train", argv))


def main():
    scenario, *args = sys.argv[1:]
    if scenario == "compare":
        compare(*args)
    elif scenario == "transcript":
        transcript(*args)
    elif scenario == "perturb":
        perturb(int(args[0]), args[1:])


if __name__ == "__main__":
    main()
