"""Long-term party keys and the roster every party holds (made by ``prbmrm party keygen|roster``).

Each party makes its own Ed25519 signing key once and keeps it secret; the
public halves, collected into a roster file that every party holds, are
what :class:`prbmrm.party.secure.SecureComm` checks each party's signed key
agreement against, so a substituted key stops the run naming the party::

    prbmrm party keygen site-0          # party 0: site-0.key (secret) and site-0.pub
    prbmrm party roster site-0.pub site-1.pub site-2.pub --out roster.json

A key file holds the 32-byte private key in hex and must be private to its
owner (mode 0600, as ssh requires: anything else is refused); a ``.pub``
file and the roster hold public keys in hex, the roster as ``{"parties":
[{"party": r, "public_key": hex, "fingerprint": hex}, ...]}`` in rank
order, each key once (a key listed twice is refused when the roster is
written and when it is read: its holder would play two parties).

Imports: cryptography; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.io.files`,
:mod:`prbmrm.party.secure`.
"""

import json
import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import InputError
from ..io.files import private_problem
from .secure import fingerprint

MAX_ROSTER_BYTES = 1 << 20


def _public_hex(key):
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def keygen(prefix):
    """Write a fresh signing key to ``prefix.key`` (mode 0600) and its public key to ``prefix.pub``.

    Returns
    -------
    str
        The public key's fingerprint.
    """
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    descriptor = os.open(f"{prefix}.key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(raw.hex() + "\n")
    with open(f"{prefix}.pub", "w") as f:
        f.write(_public_hex(key) + "\n")
    return fingerprint(bytes.fromhex(_public_hex(key)))


def _hex_key(path, text, what):
    try:
        raw = bytes.fromhex(text.strip())
    except (ValueError, AttributeError):  # not hex, or not a string at all
        raw = b""
    if len(raw) != 32:
        raise InputError(f"{path}: not {what} (64 hex digits)")
    return raw


def load_signing_key(path):
    """Return the Ed25519 private key of the key file `path`.

    Refused, as ssh refuses such a key, if the file is not private to its
    owner (readable or writable by its group or by others, or owned by
    another user): whoever can read it can sign as this party.

    Raises
    ------
    InputError
        If the file cannot be read, is not private to its owner or holds no key.
    """
    try:
        with open(path, "rb") as f:
            problem = private_problem(os.fstat(f.fileno()))
            text = "" if problem else f.read(200).decode("ascii", "replace")
    except OSError as error:
        raise InputError(f"{path}: cannot read the party's signing key ({error.strerror})") from None
    if problem:
        raise InputError(f"{path}: the party's signing key {problem}: it must be private to its owner "
                         f"(chmod 600 {path})")
    return Ed25519PrivateKey.from_private_bytes(_hex_key(path, text, "a signing key"))


def _distinct(keys, files):
    """Refuse a key listed twice (party r's from ``files[r]``): its holder would play two parties."""
    seen = {}
    for r, (key, path) in enumerate(zip(keys, files)):
        if key in seen:
            q = seen[key]
            where = "" if files[q] == path else f" ({files[q]})"
            raise InputError(f"{path}: party {r} has the same public key (fingerprint {fingerprint(key)}) as "
                             f"party {q}{where}: a key listed twice lets its holder play two parties and, "
                             "subtracting its own shares, learn another party's sums")
        seen[key] = r


def write_roster(public_paths, out):
    """Write the roster of the ``.pub`` files `public_paths` (party r is the r-th) to `out`.

    Raises
    ------
    InputError
        If a file holds no public key, or two hold the same one.
    """
    parties, keys = [], []
    for r, path in enumerate(public_paths):
        try:
            with open(path, "rb") as f:
                keys.append(_hex_key(path, f.read(200).decode("ascii", "replace"), "a public key"))
        except OSError as error:
            raise InputError(f"{path}: cannot read the public key ({error.strerror})") from None
        parties.append({"party": r, "public_key": keys[-1].hex(), "fingerprint": fingerprint(keys[-1])})
    _distinct(keys, public_paths)
    with open(out, "w") as f:
        json.dump({"parties": parties}, f, indent=1)


def load_roster(path):
    """Return the public keys (32 raw bytes each, in rank order) of the roster file `path`.

    Raises
    ------
    InputError
        If the file is not a roster, or lists a key twice.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ROSTER_BYTES + 1)
    except OSError as error:
        raise InputError(f"{path}: cannot read the roster ({error.strerror})") from None
    try:
        entries = json.loads(data.decode("utf-8"))["parties"]
        keys = [_hex_key(path, entry["public_key"], "a public key") for entry in entries]
        ordered = [entry["party"] for entry in entries] == list(range(len(entries)))
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{path}: not a roster (python -m prbmrm.party.keys roster makes one)") from None
    if len(data) > MAX_ROSTER_BYTES or not ordered:
        raise InputError(f"{path}: not a roster of parties 0, 1, ... in order")
    for key in keys:
        Ed25519PublicKey.from_public_bytes(key)
    _distinct(keys, [path] * len(keys))
    return keys
