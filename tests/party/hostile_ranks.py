"""Run under mpiexec by tests/party/test_hostile.py: a party-mode run in which one rank is hostile.

    python tests/party/hostile_ranks.py SCENARIO RANK MARKER ARGS...
        Rank RANK patches itself as SCENARIO says, then every rank runs
        ``prbmrm.cli.train ARGS``. MARKER is the file a crafted pickle would write
        if any rank ever unpickled it.
"""

import os
import pickle
import sys

import numpy as np


class Payload:
    """Unpickled, it writes its marker file: the proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def crafted(marker):
    """The bytes of a crafted pickle that runs a command when loaded."""
    return pickle.dumps(Payload(marker))


def swap_encoding(when, payload):
    """Rank's control messages for which ``when(obj)`` holds travel as `payload` bytes instead."""
    import prbmrm.distributed.comm

    honest = prbmrm.distributed.comm.encode

    def encode(obj):
        return payload if when(obj) else honest(obj)

    prbmrm.distributed.comm.encode = encode


def is_result(obj):
    return isinstance(obj, dict) and "history" in obj


def is_format(obj):
    return isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], dict) and "kind" in obj[0]


def poison(transform, start=3):
    """From its evaluation `start` on, this party sends ``transform(partials)`` instead of its sums."""
    from prbmrm.party.secure import SecureComm

    honest = SecureComm.reproducible_sum
    calls = [0]

    def poisoned(self, partials, n_parts):
        calls[0] += 1
        if calls[0] >= start:
            partials = transform(np.asarray(partials, dtype=np.float64))
        return honest(self, partials, n_parts)

    SecureComm.reproducible_sum = poisoned


def patch(scenario, marker):
    from prbmrm.errors import CoordinatorError
    from prbmrm.distributed.oracle import _EVALUATE, DistributedRisk
    from prbmrm.party.secure import SecureComm

    if scenario == "pickle-result":  # coordinator -> parties
        swap_encoding(is_result, crafted(marker))
    elif scenario == "pickle-format":  # party -> coordinator and the other parties
        swap_encoding(is_format, crafted(marker))
    elif scenario == "oversized-format":
        swap_encoding(is_format, b'"' + b"a" * (1 << 17) + b'"')
    elif scenario == "oversized-result":
        swap_encoding(is_result, b'"' + b"a" * (1 << 26) + b'"')
    elif scenario == "pickle-key":  # party -> parties: a pickle in place of its key message
        honest = SecureComm.__init__

        def init(self, comm, *args, **kwargs):
            original = comm.bcast_array

            def bcast_array(buf, root=0):
                if root == comm.rank and buf.size == 16:
                    buf[:] = np.frombuffer(crafted(marker).ljust(128, b"\0")[:128], dtype=np.float64)
                return original(buf, root)

            comm.bcast_array = bcast_array
            honest(self, comm, *args, **kwargs)
            comm.bcast_array = original

        SecureComm.__init__ = init
    elif scenario in ("record-key", "replay-key"):  # a key message recorded in one run, replayed in the next
        honest = SecureComm.__init__
        recording = f"{marker}.key-message"

        def init(self, comm, *args, **kwargs):
            original = comm.bcast_array

            def bcast_array(buf, root=0):
                if root == comm.rank and buf.size == 16:
                    if scenario == "record-key":
                        with open(recording, "wb") as f:
                            f.write(buf.tobytes())
                    else:
                        with open(recording, "rb") as f:
                            buf[:] = np.frombuffer(f.read(), dtype=np.float64)
                return original(buf, root)

            comm.bcast_array = bcast_array
            honest(self, comm, *args, **kwargs)
            comm.bcast_array = original

        SecureComm.__init__ = init
    elif scenario in ("wrong-shape", "wrong-dtype"):
        import prbmrm.party.session

        honest_message = prbmrm.party.session._result_message

        def message(result):
            sent = honest_message(result)
            sent["w"] = (np.append(sent["w"], 1.0) if scenario == "wrong-shape"
                         else sent["w"].astype(np.int64))
            return sent

        prbmrm.party.session._result_message = message
    elif scenario in ("unknown-kind", "unknown-service"):
        honest = DistributedRisk.__call__

        def call(self, w):
            if self.evaluations == 2:
                if scenario == "unknown-kind":
                    self._message[-1] = 9.0
                    self.comm.bcast_array(self._message)
                else:
                    self._message[-1] = 5.0  # attach, naming a service that is not in the table
                    self.comm.bcast_array(self._message)
                    self.comm.bcast_object(["os.system", [f"touch {marker}"]])
            return honest(self, w)

        DistributedRisk.__call__ = call
        assert _EVALUATE == 0.0
    elif scenario == "false-blame":  # a party reports a deviation the coordinator did not make
        honest = SecureComm._masked_sum

        def masked_sum(self, values, *args):
            if self.messages == 6:
                self.report_deviation(CoordinatorError("the coordinator deviated (a false claim)"))
            return honest(self, values, *args)

        SecureComm._masked_sum = masked_sum
    elif scenario == "tampered-status":  # a party adds to the masked deviation counter, declares nothing
        honest_mask = SecureComm.mask

        def mask(self, peer, counter, n):
            words = honest_mask(self, peer, counter, n)
            if counter == 6 and peer == max(self._keys):
                words = words.copy()
                words[-1:] += np.uint64(1) if peer > self.rank else np.uint64(2**64 - 1)
            return words

        SecureComm.mask = mask
    elif scenario == "times-50":
        poison(lambda p: -50.0 * p)
    elif scenario == "times-1e300":
        poison(lambda p: 1e300 * p)
    elif scenario.startswith("scale:"):  # scale:FACTOR:START, bounded lies measured in docs/party.md
        factor, start = scenario.split(":")[1:]
        poison(lambda p: float(factor) * p, start=int(start))
    elif scenario == "offset":
        poison(lambda p: p + 100.0)
    elif scenario == "nan":
        poison(lambda p: p * np.nan)
    elif scenario == "killed":  # this party dies at its fifth evaluation
        honest = SecureComm.reproducible_sum

        def killed(self, partials, n_parts):
            if self.messages >= 8:
                os.kill(os.getpid(), 9)
            return honest(self, partials, n_parts)

        SecureComm.reproducible_sum = killed
    elif scenario != "honest":
        raise SystemExit(f"unknown scenario {scenario}")


def main():
    from mpi4py import MPI

    from prbmrm.cli.common import run
    from prbmrm.cli.train import main as train

    scenario, rank, marker, *argv = sys.argv[1:]
    if MPI.COMM_WORLD.Get_rank() == int(rank):
        patch(scenario, marker)
    sys.exit(run(train, "prbmrm.cli.train", argv))


if __name__ == "__main__":
    main()
