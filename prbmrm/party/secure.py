"""Secure aggregation on top of a communicator: pairwise additive masks (Bonawitz et al., CCS 2017).

In party mode every rank is a party that must not learn another party's
risk or gradient, and nothing on the wire may carry one. :class:`SecureComm`
wraps a communicator so that every sum of floats or integers (the risk and
gradient buffer of :class:`prbmrm.distributed.oracle.DistributedRisk`, the count of
examples) is computed as follows:

1. At start-up each party sends a fresh 32-byte nonce to all; the run
   identifier is the hash of every party's nonce (:func:`run_identifier`).
   Then each party makes an ephemeral X25519 key pair and sends its
   public key to all, signed with its long-term Ed25519 signing key over
   the run identifier, its rank and the party count (a fixed 128-byte
   message: signing key, X25519 key, signature), so a message recorded in
   another run never verifies. Every party
   checks each signature and, given a roster (the expected signing keys, see
   ``python -m prbmrm.party.session keygen``), that each party's signing key is the
   roster's: a substituted key stops the run naming the party, and so do
   two parties with one signing key. Each pair of
   parties (p, q) derives the same 256-bit key ``k_pq`` by X25519 and
   HKDF-SHA256, salted with the hash of the run identifier and every
   message of the exchange.
2. Each sum is one message in ``Z_2^64``: a party's values, rounded to fixed
   point on a scale common to all parties, as int64 read modulo 2^64, plus
   ``sum_{q > p} m_pq - sum_{q < p} m_qp`` where ``m_pq`` is the ChaCha20
   keystream of ``k_pq`` with the message counter as nonce: a fresh mask per
   message, known to exactly the two parties of the pair.
3. The masked vectors are added with a plain Allreduce of uint64 (C's
   unsigned arithmetic wraps modulo 2^64); every mask enters once with + and
   once with -, so the total is exactly the sum of the fixed-point values.

A single masked vector is uniform on ``Z_2^64`` whatever the party's values
(its masks with any one other party already are), and so is any partial sum
over a proper subset of the parties that a reduction tree forms: only the
sum over all parties is revealed, to every party. With 2 parties the sum
minus one's own share is the other's share, so fewer than 3 are refused.

Status flags. Three counters ride masked after the values: parties whose
values did not fit the fixed-point range, that were not finite, and that
report a deviation of the coordinator. The first only rescales (anonymously).
When either of the others is not zero, every party also declares its own
flags in the clear (one Allgather): the parties that stop the run are named
to all, and counters that do not match the declarations (a party tampered
with them) stop the run blaming nobody, the coordinator included.

Only sums travel: the communicator refuses a maximum or minimum
(:meth:`SecureComm.allreduce_max`), which would carry one party's value in
the clear, and gathers per-example values only when score sharing is allowed.

Fixed point. A value x travels as two elements of ``Z_2^64``, the limbs of
``x 2^(2 bits - E) = high 2^bits + low`` (``|high| <= 2^bits``, ``0 <= low <
2^bits``), with ``bits = 62 - ceil(log2(n_parts + 1))`` for ``n_parts``
partial sums in all: the limb sums of all parties fit in int64, so the sum
never wraps. ``E`` is public, starts at 0 and only grows: a party whose
values are not all below ``2^E`` says so in a masked counter that rides with
the values (overflow detected); if any did, every party raises ``E`` by 8
and sends again with fresh masks, and :attr:`SecureComm.rescales` counts it.
The grid ``2^(E - 2 bits)`` is about ``2^-110`` of the largest partial sum
seen so far, so the decoded sum is the exact sum rounded to float64 (within
about one unit in the last place): more accurate than the per-component
fixed point of the plain :meth:`prbmrm.distributed.comm.SerialComm.reproducible_sum`,
from which it differs only by that method's own rounding.

Imports: cryptography, numpy; of prbmrm: :mod:`prbmrm.errors`.
"""

import hashlib
import math
import os

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import InputError, JointError, UsageError

MIN_PARTIES = 3
"""Fewest parties secure aggregation runs with."""

RESCALE_BITS = 8
"""How much the fixed-point range grows, in bits, after an overflow."""

MAX_EXPONENT = 1100
"""Largest fixed-point exponent: every finite float64 is below 2^1024."""

# The counters that ride after the values in every masked message.
_OVERFLOW, _NONFINITE, _DEVIATION = range(3)
_STATUS = 3
_KEY_MESSAGE = 128  # Ed25519 public key, X25519 public key, Ed25519 signature
_SIGNED = b"prbmrm key agreement v2"
_NONCE = 32  # bytes of each party's fresh contribution to the run identifier


def keystream(key, counter, n):
    """Return ``n`` uint64 words of the ChaCha20 keystream of `key` with nonce `counter`.

    Parameters
    ----------
    key : bytes
        32 bytes.
    counter : int
        The message number, below 2^96: each (key, counter) is used once.
    n : int

    Returns
    -------
    ndarray of uint64, shape (n,)
    """
    # OpenSSL's 16-byte ChaCha20 IV: a 4-byte block counter (from 0), then the 12-byte nonce.
    nonce = bytes(4) + counter.to_bytes(12, "little")
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * n)), dtype=np.uint64)


def gaussian_noise(key, counter, n):
    """Return ``n`` standard normal values drawn from the ChaCha20 keystream (Box-Muller).

    Parameters are those of :func:`keystream`; the key must be secret and
    the counter fresh.
    """
    words = keystream(key, counter, 2 * n)
    # 53-bit uniforms in (0, 1] and [0, 1).
    u1 = ((words[:n] >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53
    u2 = (words[n:] >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _raw(public_key):
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public):
    """The fingerprint of a public key's 32 raw bytes: SHA-256, first 16 hex digits."""
    return hashlib.sha256(public).hexdigest()[:16]


def run_identifier(nonces):
    """The run identifier: SHA-256 of every party's fresh nonce, in rank order.

    Every party contributes a nonce it has just drawn, so no party (and no
    recording of an earlier run) can make a run's identifier repeat; each
    key agreement message is signed over it, so none verifies in another run.
    """
    return hashlib.sha256(b"prbmrm run " + b"".join(nonces)).digest()


def _signed_text(run_id, party, size, exchange_key):
    return _SIGNED + run_id + party.to_bytes(4, "little") + size.to_bytes(4, "little") + exchange_key


def _key_problem(run_id, party, size, message, roster):
    """What is wrong with party `party`'s key agreement message, or None."""
    signing, exchange, signature = message[:32], message[32:64], message[64:]
    if roster is not None and signing != roster[party]:
        return (f"party {party}'s signing key (fingerprint {fingerprint(signing)}) is not the one of the "
                f"roster ({fingerprint(roster[party])}): a substituted key")
    try:
        Ed25519PublicKey.from_public_bytes(signing).verify(signature, _signed_text(run_id, party, size, exchange))
    except (InvalidSignature, ValueError):
        return (f"party {party}'s key agreement message is not signed by its signing key for this run "
                f"(run {run_id.hex()[:16]}): forged, or replayed from another run")
    return None


def _shared_key_problem(messages):
    """Name two parties that sent the same signing key (one holder playing two parties), or None."""
    first = {}
    for party, message in enumerate(messages):
        q = first.setdefault(message[:32], party)
        if q != party:
            return (f"party {party} and party {q} sent the same signing key (fingerprint "
                    f"{fingerprint(message[:32])}): one key holder would play two parties and learn a third "
                    "party's sums")
    return None


class SecureComm:
    """A communicator whose sums are secure aggregations over the parties (one per rank).

    Only the calls of party mode pass through to the wrapped communicator:
    the broadcasts of ``w`` and of control messages (public), error checks
    and, with `allow_scores` (a non-decomposable loss), the gathered
    per-example scores (see :mod:`prbmrm.party.session`); a maximum or minimum is
    refused.

    Parameters
    ----------
    comm : prbmrm.distributed.comm.MPIComm
        The communicator of the parties, at least :data:`MIN_PARTIES` ranks.
        Every rank must construct its SecureComm together.
    noise_std : float
        Standard deviation of the Gaussian noise this party adds to each
        component of each float sum before masking (differential privacy;
        0: none).
    signing_key : Ed25519PrivateKey, optional
        This party's long-term signing key; a fresh one (authenticating
        nothing) if not given.
    roster : list of bytes, optional
        Every party's expected Ed25519 public key (32 raw bytes), in rank order.
    allow_scores : bool
        Pass per-example gathers and scatters through (unmasked).

    Attributes
    ----------
    run_id : bytes
        The run identifier (:func:`run_identifier`): every party's key
        message is signed over it, and the pairwise keys derive from it.
    fingerprints : list of str
        Fingerprint of every party's signing key, in rank order: what the
        parties compare out of band when they have no roster.
    authenticated : bool
        Whether every key was checked against a roster.
    exponent : int
        ``E``: float sums are in fixed point with every partial below ``2^E``.
    rescales : int
        Float sums repeated after a fixed-point overflow.
    messages : int
        Masked messages sent so far (also the ChaCha20 nonce).
    nonfinite : list of int
        The parties that declared non-finite values in the last sum.

    Raises
    ------
    UsageError
        On every rank, with fewer than 3 ranks or a roster of another size or
        that lists a key twice.
    CollectiveError
        On every rank, naming the party whose key message does not verify
        (forged, or replayed from another run), or two parties with one key.
    """

    def __init__(self, comm, noise_std=0.0, signing_key=None, roster=None, allow_scores=False):
        if comm.size < MIN_PARTIES:
            raise UsageError(f"secure aggregation needs at least {MIN_PARTIES} parties, got {comm.size}: "
                             "with 2, each party learns the other's risk and gradient by subtracting "
                             "its own from the sum (start one rank per party, at least 3)")
        if roster is not None and len(roster) != comm.size:
            raise UsageError(f"the roster lists {len(roster)} parties, the run has {comm.size}")
        if roster is not None and len(set(roster)) != len(roster):
            raise UsageError("the roster lists a key twice: its holder would play two parties "
                             "(prbmrm party roster refuses such a roster)")
        self.comm = comm
        self.noise_std = float(noise_std)
        self.allow_scores = allow_scores
        signing_key = Ed25519PrivateKey.generate() if signing_key is None else signing_key
        # First every party's fresh nonce: the run identifier every signature below binds.
        self.run_id = run_identifier(self._exchange(comm, os.urandom(_NONCE)))
        private = X25519PrivateKey.generate()
        exchange = _raw(private.public_key())
        mine = (_raw(signing_key.public_key()) + exchange
                + signing_key.sign(_signed_text(self.run_id, comm.rank, comm.size, exchange)))
        messages = self._exchange(comm, mine)
        problems = [_key_problem(self.run_id, r, comm.size, m, roster)
                    for r, m in enumerate(messages) if r != comm.rank]
        problem = next((p for p in problems if p is not None), None) or _shared_key_problem(messages)
        comm.check(None if problem is None else InputError(f"party {comm.rank} found that {problem}"))
        self.fingerprints = [fingerprint(m[:32]) for m in messages]
        self.authenticated = roster is not None
        session = hashlib.sha256(self.run_id + b"".join(messages)).digest()
        self._keys = {}
        for peer, message in enumerate(messages):
            if peer == comm.rank:
                continue
            shared = private.exchange(X25519PublicKey.from_public_bytes(message[32:64]))
            pair = b"%d,%d" % tuple(sorted((comm.rank, peer)))
            self._keys[peer] = HKDF(algorithm=hashes.SHA256(), length=32, salt=session,
                                    info=b"prbmrm pairwise mask " + pair).derive(shared)
        self._noise_key = os.urandom(32)  # known to this party alone
        self._noise_draws = 0
        self._deviation = None
        self.exponent = 0
        self.rescales = 0
        self.messages = 0
        self.nonfinite = []

    @staticmethod
    def _exchange(comm, mine):
        """Every party's fixed-size byte string `mine`, in rank order (one broadcast from each)."""
        messages = []
        for r in range(comm.size):
            # A fixed-size buffer: the bytes travel as float64, bit for bit, never parsed.
            buf = np.frombuffer(mine, dtype=np.float64).copy() if r == comm.rank else np.empty(len(mine) // 8)
            messages.append(comm.bcast_array(buf, root=r).tobytes())
        return messages

    # The public calls of the wrapped communicator, and nothing else.
    rank = property(lambda self: self.comm.rank)
    size = property(lambda self: self.comm.size)
    is_root = property(lambda self: self.comm.is_root)
    signalled = property(lambda self: self.comm.signalled)

    def bcast_array(self, buf, root=0):
        """Broadcast a float64 buffer (``w``, public): the wrapped communicator's."""
        return self.comm.bcast_array(buf, root)

    def bcast_object(self, obj, root=0, **limit):
        """Broadcast a control message (public): the wrapped communicator's."""
        return self.comm.bcast_object(obj, root, **limit)

    def check(self, error=None):
        """The collective error check of the wrapped communicator."""
        return self.comm.check(error)

    def barrier(self):
        """Wait for every party."""
        self.comm.barrier()

    def abort(self, status=1):
        """End the whole job (the wrapped communicator's)."""
        self.comm.abort(status)

    def allreduce_max(self, values):
        """Refused: a maximum carries one party's value in the clear.

        Raises
        ------
        UsageError
            On every rank together (every rank makes the same call).
        """
        raise UsageError("party mode has no secure maximum or minimum (it would carry one party's "
                         "value in the clear): this solver cannot run in party mode")

    allreduce_min = allreduce_max

    def _scores(self, name):
        if not self.allow_scores:
            raise UsageError(f"party mode refuses to {name} per-example values unmasked "
                             "(--allow-score-sharing allows it for non-decomposable losses)")
        return getattr(self.comm, name)

    def gather_counts(self, n_local):
        """Every party's count, in the clear: only with score sharing allowed."""
        return self._scores("gather_counts")(n_local)

    def gather_scalars(self, local, root=0):
        """Per-example values to `root`, in the clear: only with score sharing allowed."""
        return self._scores("gather_scalars")(local, root)

    def scatter_scalars(self, full, counts, root=0):
        """Per-example values from `root`, in the clear: only with score sharing allowed."""
        return self._scores("scatter_scalars")(full, counts, root)

    def mask(self, peer, counter, n):
        """Return the mask ``m_pq`` this party shares with `peer` for message `counter` (n words)."""
        return keystream(self._keys[peer], counter, n)

    def _masked_sum(self, values, overflow=False, nonfinite=False):
        """Sum int64 `values` and the status counters over the parties; return both sums.

        The counters are how many parties had values that did not fit, that
        were not finite, and that reported a deviation. A party in any of
        these cases sends uniformly random values instead of its own, so the
        total of such a round, which every party discards, reveals nothing:
        not even the sum over the other parties.
        """
        status = [overflow, nonfinite, self._deviation is not None]
        if any(status):
            values = keystream(os.urandom(32), 0, len(values)).view(np.int64)
        message = np.concatenate([values, np.asarray(status, dtype=np.int64)]).view(np.uint64)
        for peer in self._keys:
            if peer > self.rank:
                message += self.mask(peer, self.messages, len(message))
            else:
                message -= self.mask(peer, self.messages, len(message))
        self.messages += 1
        total = self.comm.allreduce_sum(message).view(np.int64)
        counts = total[len(values):]
        self.nonfinite = []
        if counts[_NONFINITE] or counts[_DEVIATION]:
            self._declare(status, counts)
        return total[:len(values)], counts

    def _declare(self, status, counts):
        """Every party declares its flags in the clear; name who raised them (collective)."""
        own = int(status[_NONFINITE]) * 2 + int(status[_DEVIATION]) * 4
        declared = self.comm.gather_counts(own)
        named = {flag: [p for p, bits in enumerate(declared) if bits & (1 << flag)]
                 for flag in (_NONFINITE, _DEVIATION)}
        if any(len(named[flag]) != counts[flag] for flag in named):
            raise JointError(f"the masked status counters of a secure sum ({counts[_NONFINITE]} "
                             f"non-finite, {counts[_DEVIATION]} deviation reports) do not match what the "
                             f"parties declare ({named[_NONFINITE]}, {named[_DEVIATION]}): a party "
                             "tampered with them, and secure aggregation hides which (no party, the "
                             "coordinator included, is blamed)")
        self.nonfinite = named[_NONFINITE]
        if named[_DEVIATION]:
            if self._deviation is not None:
                error, self._deviation = self._deviation, None
                raise error
            parties = ", ".join(map(str, named[_DEVIATION]))
            raise JointError(f"party {parties} stopped the run: {'it says' if len(named[_DEVIATION]) == 1 else 'they say'} "
                             "that the coordinator deviated from the protocol (each says how)")

    def allreduce_sum(self, buf):
        """Sum `buf` over the parties in place: int64 exactly, float64 in fixed point.

        Raises
        ------
        JointError
            On every rank, if an integer is too large for the sum to be exact.
        """
        if buf.dtype != np.int64:
            buf[:] = self.reproducible_sum(buf.reshape(1, -1), 1)
            return buf
        limit = 2**62 // self.size
        overflow = bool(np.any(np.abs(buf) >= limit))
        total, status = self._masked_sum(buf, overflow)
        if status[_OVERFLOW]:
            raise JointError(f"secure sum of integers: {status[_OVERFLOW]} of the {self.size} "
                                  f"parties hold a value beyond +-{limit}, the sum could wrap")
        buf[:] = total
        return buf

    def reproducible_sum(self, partials, n_parts):
        """Sum the rows of `partials` over the parties (see the module docstring).

        Parameters
        ----------
        partials : ndarray of shape (k, n)
            This party's partial sums.
        n_parts : int
            Number of rows over all parties.

        Returns
        -------
        ndarray of shape (n,)
            The sum, plus every party's noise share if `noise_std` > 0; all
            NaN if any party's partial is not finite.
        """
        partials = np.asarray(partials, dtype=np.float64)
        if self.noise_std > 0:
            noise = self.noise_std * gaussian_noise(self._noise_key, self._noise_draws, partials.shape[1])
            self._noise_draws += 1
            partials = np.vstack([partials, noise])
            n_parts += self.size
        bits = 62 - math.ceil(math.log2(n_parts + 1))
        finite = bool(np.isfinite(partials).all())
        n = partials.shape[1]
        while True:
            shift = 2 * bits - self.exponent
            with np.errstate(over="ignore"):  # too large for the range: flagged below, rescaled
                scaled = np.ldexp(partials, shift)
            fits = finite and np.max(np.abs(scaled), initial=0.0) < 2.0 ** (2 * bits)
            limbs = np.zeros(2 * n, dtype=np.int64)  # sent as random values unless they fit
            if fits:
                # scaled = high 2^bits + low, |high| <= 2^bits, 0 <= low < 2^bits: both steps exact.
                high = np.floor(np.ldexp(scaled, -bits))
                low = np.rint(scaled - np.ldexp(high, bits))
                limbs[:n] = high.astype(np.int64).sum(axis=0)
                limbs[n:] = low.astype(np.int64).sum(axis=0)
            total, status = self._masked_sum(limbs, finite and not fits, not finite)
            if status[_NONFINITE]:
                return np.full(n, np.nan)
            if not status[_OVERFLOW]:
                high, low = total[:n], total[n:]
                high = high + (low >> bits)  # carry: the low sums are >= 0
                low = low & ((1 << bits) - 1)
                return (np.ldexp(high.astype(np.float64), bits - shift)
                        + np.ldexp(low.astype(np.float64), -shift))
            self.exponent += RESCALE_BITS
            self.rescales += 1
            if self.exponent > MAX_EXPONENT:
                raise JointError(f"a secure sum declared a fixed-point overflow at 2^{self.exponent}, "
                                 "beyond every finite float64: a party tampered with the overflow counter")

    def exact_sum(self, partials, state, failed=False, signal=None, out=None):
        """The risk oracle's sum: a secure sum too (:meth:`reproducible_sum`), never the plain one; a
        failed party sends NaN, which makes the sum NaN on every party. Written into `out` if given."""
        partials = np.full((1, state.n), np.nan) if failed else np.asarray(partials)
        total = self.reproducible_sum(partials, state.n_parts)
        if out is None:
            return total
        out[:] = total
        return out

    def report_deviation(self, error):
        """Stop the run at the next sum: this party found that the coordinator deviated.

        The flag rides, masked, with the next sum (or :meth:`settle`), in
        which this party sends uniformly random values instead of its own:
        the answer to a deviating query is never revealed. Then every party
        declares its flags and every rank raises together: this party
        `error`, a :class:`CoordinatorError`; the others a
        :class:`~prbmrm.errors.JointError` that names the parties that
        stopped the run.
        """
        self._deviation = error

    def settle(self):
        """Raise on every rank if any party reported a deviation since the last sum (collective)."""
        self._masked_sum(np.zeros(0, dtype=np.int64))


__all__ = ["MAX_EXPONENT", "MIN_PARTIES", "RESCALE_BITS", "SecureComm", "fingerprint", "gaussian_noise",
           "keystream", "run_identifier"]
