"""Typed control messages between ranks: UTF-8 JSON with a size limit, never pickle.

Control messages (an error text, a configuration, the data's format, a
result) travel as length-prefixed UTF-8 JSON (:meth:`prbmrm.distributed.comm.MPIComm.bcast_object`).
A receiver reads the length first and refuses one beyond its limit before
it allocates anything; it then parses the bytes as strict JSON, whose
values are data only: None, bool, int, float (NaN and infinities kept),
str, list and dict with str keys, and two tagged types: bytes
(``{"__bytes__": base64}``) and a NumPy array of a closed set of dtypes
(``{"__array__": [dtype, shape, base64 bytes]}``) whose byte count must
match its shape. Nothing in a message names code to
run: a crafted pickle is just bytes that do not parse.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`.
"""

import base64
import json
import math

import numpy as np

from ..errors import JointError

MAX_OBJECT_BYTES = 1 << 26
"""Largest control message a rank accepts (64 MiB: a long run's history fits many times over)."""

_ARRAY = "__array__"
_BYTES = "__bytes__"
_DTYPES = ("float64", "int64", "uint8", "bool")


class ProtocolError(JointError):
    """A message that does not fit the protocol: every rank that received it raises this.

    Parameters
    ----------
    message : str
    sender : int
        The rank that sent it: the lowest other rank prints the error (a
        hostile sender cannot be relied on to).
    agreed : bool
        Every rank, the sender included, raises it together; if not, the
        sender may be waiting in a collective and the job must be ended.
    """

    def __init__(self, message, sender=0, agreed=True):
        super().__init__(message)
        self.sender = sender
        self.agreed = agreed


def _default(value):
    if isinstance(value, np.ndarray):
        if value.dtype.name not in _DTYPES:
            value = value.astype(np.float64)
        data = np.ascontiguousarray(value).tobytes()
        return {_ARRAY: [value.dtype.name, list(value.shape), base64.b64encode(data).decode("ascii")]}
    if isinstance(value, bytes):
        return {_BYTES: base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"a control message cannot carry a {type(value).__name__}")


def encode(obj):
    """Return the UTF-8 JSON bytes of `obj` (tuples travel as lists, arrays tagged).

    Raises
    ------
    TypeError
        If `obj` holds anything but the types of the module docstring.
    """
    return json.dumps(obj, default=_default, separators=(",", ":")).encode("utf-8")


def _array(tag):
    if not (isinstance(tag, list) and len(tag) == 3 and tag[0] in _DTYPES and isinstance(tag[1], list)
            and len(tag[1]) <= 32 and all(type(n) is int and 0 <= n < 2**63 for n in tag[1])
            and isinstance(tag[2], str)):
        raise ValueError("a malformed array tag")
    dtype = np.dtype(tag[0])
    data = base64.b64decode(tag[2].encode("ascii"), validate=True)
    if len(data) != dtype.itemsize * math.prod(tag[1]):  # Python integers: no wrap-around
        raise ValueError(f"an array of shape {tuple(tag[1])} and dtype {dtype} with {len(data)} bytes")
    return np.frombuffer(data, dtype=dtype).reshape(tag[1]).copy()


def _hook(pairs):
    if pairs and pairs[0][0] in (_ARRAY, _BYTES):
        if len(pairs) != 1 or not isinstance(pairs[0][1], list if pairs[0][0] == _ARRAY else str):
            raise ValueError("a malformed tag")
        if pairs[0][0] == _ARRAY:
            return _array(pairs[0][1])
        return base64.b64decode(pairs[0][1].encode("ascii"), validate=True)
    return dict(pairs)


def decode(data, limit=MAX_OBJECT_BYTES):
    """Return the object of the message `data`.

    Raises
    ------
    ValueError
        Beyond `limit` bytes, not UTF-8, not JSON, or an array tag that does
        not match its bytes: a message to refuse, with what is wrong.
    """
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes, beyond the limit of {limit}")
    try:
        return json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_hook)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not a UTF-8 JSON message ({error})") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (ValueError, TypeError) as error:
        raise ValueError(str(error)) from None


def expect_array(value, dtype, shape, what):
    """Return `value` if it is an ndarray of `dtype` and `shape` (None: any length), else raise ValueError."""
    if not (isinstance(value, np.ndarray) and value.dtype == np.dtype(dtype) and value.ndim == len(shape)
            and all(n is None or n == m for n, m in zip(shape, value.shape))):
        got = (f"{value.dtype} of shape {value.shape}" if isinstance(value, np.ndarray)
               else type(value).__name__)
        raise ValueError(f"{what}: expected {np.dtype(dtype)} of shape {tuple(shape)}, got {got}")
    return value


__all__ = ["MAX_OBJECT_BYTES", "ProtocolError", "decode", "encode", "expect_array"]
