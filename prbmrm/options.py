"""The options of a training run, each group one small frozen dataclass validated when built.

:class:`Stopping` (the stopping rule), :class:`BundleOptions` (bundle
management), :class:`Checkpointing` and :class:`PartySettings` (party mode)
are the one definition of their options: each field carries its command-line
flag and help (:func:`option`), so :func:`add_arguments` builds the
``prbmrm.cli.train`` options from them, the TOML configuration files follow the
parser (:mod:`prbmrm.cli.config`), :func:`from_namespace` reads them back, and
:func:`prbmrm.training.fit` and the estimators take the same objects (or
their fields as keywords). A new option is one field here.

Imports: the standard library, :mod:`prbmrm.errors` only.
"""

import argparse
import dataclasses
import math
import re

from .errors import UsageError

DEFAULT_REL_EPSILON = 1e-3

STOPPING_RULE = ("Stopping: --epsilon alone stops on the absolute gap; --rel-epsilon alone (or neither: "
                 f"{DEFAULT_REL_EPSILON:g}) on the gap relative to the best objective; both given: whichever "
                 "is met first.")


def option(default, flag=None, help=None, **argparse_keywords):
    """A dataclass field with its command-line option: `flag` (None: no option), `help`, and the
    keywords of ``add_argument`` (``type``, ``metavar``, ``action``, ``dest``)."""
    return dataclasses.field(default=default, metadata=dict(flag=flag, help=help, **argparse_keywords))


def add_arguments(parser, cls):
    """Add an option to `parser` (or an argument group) for each field of the dataclass `cls` that has a flag."""
    for field in dataclasses.fields(cls):
        keywords = dict(field.metadata)
        flag = keywords.pop("flag")
        if flag is None:
            continue
        if keywords.get("action") != "store_true":
            keywords["default"] = field.default
        keywords.setdefault("dest", field.name)
        parser.add_argument(flag, **{key: value for key, value in keywords.items() if value is not None})


def from_namespace(cls, args, **overrides):
    """Build `cls` from the parsed options `args` (its fields with a flag), with `overrides`."""
    values = {field.name: getattr(args, field.metadata.get("dest") or field.name)
              for field in dataclasses.fields(cls) if field.metadata.get("flag")}
    return cls(**dict(values, **overrides))


def flags(cls):
    """``{field name: flag}`` of the fields of `cls` that are command-line options."""
    return {field.name: field.metadata["flag"] for field in dataclasses.fields(cls) if field.metadata.get("flag")}


def stopping_tolerances(epsilon=None, rel_epsilon=None):
    """Return ``(epsilon, rel_epsilon)`` as the solvers take them (0 disables a test).

    `epsilon` alone stops on the absolute gap only; `rel_epsilon` alone, or
    neither, on the relative gap (default :data:`DEFAULT_REL_EPSILON`); both
    given: on whichever is met first. None means "not given".
    """
    if rel_epsilon is None:
        rel_epsilon = 0.0 if epsilon is not None else DEFAULT_REL_EPSILON
    return (0.0 if epsilon is None else epsilon), rel_epsilon


@dataclasses.dataclass(frozen=True)
class Stopping:
    """When a run stops: the gap tests and the iteration budget (see :data:`STOPPING_RULE`).

    Raises
    ------
    UsageError
        For a negative or non-finite tolerance, or ``max_iter < 1``.
    """

    epsilon: object = option(None, "--epsilon", type=float,
                             help="stop when the gap (best objective - lower bound) <= this; given alone, "
                             "the only gap test (the default --rel-epsilon no longer applies)")
    rel_epsilon: object = option(None, "--rel-epsilon", type=float,
                                 help="stop when the gap <= this times the best objective (default "
                                 f"{DEFAULT_REL_EPSILON:g} unless --epsilon alone is given). {STOPPING_RULE}")
    max_iter: int = option(10000, "--max-iter", type=int, help="maximum iterations (default 10000)")

    def __post_init__(self):
        for name, value in (("--epsilon", self.epsilon), ("--rel-epsilon", self.rel_epsilon)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} must be >= 0, got {value:g}")
        if self.max_iter < 1:
            raise UsageError(f"--max-iter must be >= 1, got {self.max_iter}")

    @property
    def tolerances(self):
        """``(epsilon, rel_epsilon)`` as the solvers take them (:func:`stopping_tolerances`)."""
        return stopping_tolerances(self.epsilon, self.rel_epsilon)


_MEMORY_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                 "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def memory_bytes(text):
    """Type of ``--bundle-memory``: bytes, e.g. ``2000000``, ``2GB``, ``1.5G``, ``512MiB``.

    K, M, G, T are powers of 1000, Ki, Mi, Gi, Ti powers of 1024; a final B is optional.

    Raises
    ------
    argparse.ArgumentTypeError
        If `text` is not a size >= 0.
    """
    match = re.fullmatch(r"\s*(\d+\.?\d*(?:e[+-]?\d+)?)\s*([kmgt]i?)?b?\s*", str(text), re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 2GB or 512MiB, got {text!r}")
    return int(float(match[1]) * _MEMORY_UNITS[(match[2] or "").upper()])


@dataclasses.dataclass(frozen=True)
class BundleOptions:
    """How a solver that keeps a bundle manages its planes.

    `bundle_memory` may be given as text (``"2GB"``): it is held in bytes.

    Raises
    ------
    UsageError
        For ``idle_age < 0``, a bundle size of 1 or below 0, or a bad memory size.
    """

    idle_age: int = option(10, "--idle-age", type=int,
                           help="drop planes whose multiplier stayed 0 this many iterations (default 10; 0: never)")
    bundle_size: int = option(0, "--bundle-size", type=int,
                              help="keep at most this many planes (>= 2), aggregating the oldest (default 0: no limit)")
    bundle_memory: int = option(0, "--bundle-memory", type=memory_bytes, metavar="SIZE",
                                help="a budget for the bundle's planes, e.g. 2GB or 512MiB, counted as they are "
                                "stored (sparse planes by their nonzeros; default 0: none)")

    def __post_init__(self):
        if self.idle_age < 0:
            raise UsageError(f"--idle-age must be >= 0 (0 keeps every plane), got {self.idle_age}")
        if self.bundle_size < 0 or self.bundle_size == 1:
            raise UsageError(f"--bundle-size must be 0 (no limit) or >= 2, got {self.bundle_size}")
        if isinstance(self.bundle_memory, str):
            try:
                object.__setattr__(self, "bundle_memory", memory_bytes(self.bundle_memory))
            except argparse.ArgumentTypeError as error:
                raise UsageError(f"--bundle-memory: {error}") from None


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Where and how often rank 0 writes the solver's state, and the checkpoint a run resumes from.

    Raises
    ------
    UsageError
        For ``checkpoint_every < 0``, or ``checkpoint_every`` or
        ``resume_if_exists`` without a checkpoint path (or with ``resume``).
    """

    checkpoint: object = option(None, "--checkpoint", metavar="PATH",
                                help="rank 0 writes the solver state here (atomically) every --checkpoint-every "
                                "iterations, at --max-iter and on SIGINT/SIGTERM")
    checkpoint_every: int = option(0, "--checkpoint-every", type=int, metavar="N",
                                   help="checkpoint every N iterations (default 0: only at the end and on a signal)")
    resume: object = option(None, "--resume", metavar="PATH",
                            help="continue from this checkpoint (same options and data)")
    checkpoint_key: object = option(None, "--checkpoint-key", metavar="FILE",
                                    help="authenticate checkpoints with the secret key in FILE (default: the file "
                                    "$PRBMRM_CHECKPOINT_KEY names): each one written carries an HMAC-SHA256 tag, "
                                    "and --resume refuses a checkpoint without a valid one")
    resume_if_exists: bool = option(False, "--resume-if-exists", action="store_true",
                                    help="continue from the --checkpoint file if it exists, else start afresh: "
                                    "the same command starts or continues a run (a requeued batch job)")

    def __post_init__(self):
        if self.resume_if_exists and (self.checkpoint is None or self.resume is not None):
            raise UsageError("--resume-if-exists needs --checkpoint PATH (and no --resume)")
        if self.checkpoint_every < 0:
            raise UsageError(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        if self.checkpoint_every and self.checkpoint is None:
            raise UsageError("--checkpoint-every needs --checkpoint PATH")


def party_numbers(text):
    """Type of ``--model-to``: comma-separated party numbers, as a list."""
    try:
        return [int(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--model-to expects comma-separated party numbers, "
                                         f"got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class PartySettings:
    """The settings of party mode (:class:`prbmrm.party.session.Party` is built from them and validated here).

    Raises
    ------
    UsageError
        For a negative tolerance, only one of `dp_epsilon` and `dp_delta`,
        or privacy parameters out of range.
    """

    model_to: object = option(None, "--model-to", metavar="RANKS", type=party_numbers,
                              help="comma-separated parties that receive and write the model (default: all)")
    allow_score_sharing: bool = option(False, "--allow-score-sharing", action="store_true",
                                       help="accept a non-decomposable loss, whose per-example scores go to "
                                       "rank 0 unmasked")
    verify_coordinator: bool = option(False, "--verify-coordinator", action="store_true",
                                      help="every party replays the solver and stops if a w of rank 0 differs")
    tolerance: float = option(1e-9)  # of the coordinator check: not a command-line option
    audit_log: object = option("audit-{rank}.jsonl", "--audit-log",
                               help="each party's log of every w it evaluated (default audit-{rank}.jsonl)")
    dp_epsilon: object = option(None, "--dp-epsilon", type=float,
                                help="differential privacy: epsilon over the whole run")
    dp_delta: object = option(None, "--dp-delta", type=float, help="differential privacy: delta over the whole run")
    dp_clip: float = option(1.0, "--dp-clip", type=float,
                            help="norm each example's (loss, gradient) is clipped to (default 1)")
    dp_coalition: object = option(None, "--dp-coalition", type=int, metavar="T",
                                  help="the privacy target holds against any T colluding parties "
                                  "(default parties - 2)")
    signing_key: object = option(None, "--party-key", metavar="PATH", dest="party_key",
                                 help="this party's signing key file, a template such as 'site-{rank}.key' "
                                 "(prbmrm party keygen makes it)")
    roster: object = option(None, "--roster", metavar="PATH",
                            help="the parties' expected public keys (prbmrm party roster): a "
                            "substituted key stops the run")

    def __post_init__(self):
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise UsageError(f"the coordinator check's tolerance must be >= 0, got {self.tolerance:g}")
        if (self.dp_epsilon is None) != (self.dp_delta is None):
            raise UsageError("differential privacy needs both --dp-epsilon and --dp-delta")
        if self.dp_epsilon is not None:
            if not (math.isfinite(self.dp_epsilon) and self.dp_epsilon > 0):
                raise UsageError(f"--dp-epsilon must be > 0, got {self.dp_epsilon:g}")
            if not 0 < self.dp_delta < 1:
                raise UsageError(f"--dp-delta must be in (0, 1), got {self.dp_delta:g}")
            if not (math.isfinite(self.dp_clip) and self.dp_clip > 0):
                raise UsageError(f"--dp-clip must be > 0, got {self.dp_clip:g}")


GROUPS = (Stopping, BundleOptions, Checkpointing, PartySettings)
"""The option groups, in the order :func:`prbmrm.cli.train.build_parser` adds them."""


_KEYWORDS = {"--loss-param": "loss_params", "--reg-param": "reg_params", "--solver-param": "solver_params",
             "--party-key": "signing_key"}


def python_names(message):
    """`message` with the command line's flags (``--max-iter``) named as the keywords of
    :func:`prbmrm.fit` (``max_iter``), for Python callers."""
    def keyword(match):  # "--positive LABEL" -> "positive=LABEL"
        name = _KEYWORDS.get(match[1], match[1][2:].replace("-", "_"))
        return f"{name}={match[2]}" if match[2] else name

    return re.sub(r"(--[a-z][a-z0-9-]*)(?: ([A-Z][A-Z_]*)(?![\w=]))?", keyword, message)


def split_keywords(keywords):
    """Sort the keywords of :func:`prbmrm.training.fit` named after fields into their groups.

    Returns ``({group: {field: value}}, the other keywords)``.
    """
    grouped, rest = {}, dict(keywords)
    for group in (Stopping, BundleOptions, Checkpointing):
        names = {field.name for field in dataclasses.fields(group)} & set(rest)
        grouped[group] = {name: rest.pop(name) for name in names}
    return grouped, rest
