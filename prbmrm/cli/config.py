"""Configuration files: the command-line options of an entry point as a TOML file (``--config FILE``).

A key is an option's long name without the dashes, with ``_`` or ``-``
(``rel_epsilon = 1e-4``); flags take ``true`` or ``false``; a repeatable
``NAME=VALUE`` option takes a table (``loss_param = {tau = 0.9}`` or a
``[loss_param]`` section), another repeatable option an array (or one
string for one value). The options of an argument group marked with
:func:`config_section` are the keys of their own table (``[privacy]``). The
keys follow the argparse parser, so every new option has its key without
further code. The file's values become the parser's defaults, so options
given on the command line override them.

Rank 0 reads the file and broadcasts its text; every rank then checks it the
same way, so a bad file stops every rank with the same message.

Imports: tomli_w; of prbmrm: :mod:`prbmrm.errors`.
"""

import argparse
import difflib
import sys

from ..errors import UsageError

CONFIG_DESTS = ("config", "print_config")
"""Options about the configuration itself: not keys of a configuration file."""


def add_config_options(parser):
    """Add ``--config FILE`` and ``--print-config`` to `parser`."""
    parser.add_argument("--config", metavar="FILE",
                        help="read options from this TOML file; options on the command line override it")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective options as a TOML configuration file and exit")


def config_section(group, name, keys=None):
    """Make the options of the argparse argument `group` the keys of the TOML table ``[name]``.

    Parameters
    ----------
    group : argparse._ArgumentGroup
    name : str
    keys : dict of str to str, optional
        ``{dest: key}``: keys other than the option's dest (``party_data`` as ``data``).
    """
    group.config_section = (name, dict(keys or {}))


def parse_configured(parser, argv, comm):
    """Parse `argv` over the defaults of the ``--config`` file, if one is given.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        With :func:`add_config_options` applied; its defaults are changed.
    argv : list of str or None
    comm : prbmrm.distributed.comm.SerialComm or MPIComm

    Returns
    -------
    argparse.Namespace or None
        None after ``--print-config`` printed the configuration (on rank 0).

    Raises
    ------
    UsageError
        On every rank, for an unreadable or invalid file (naming the file and
        the key) or a bad option.
    """
    args = parse_arguments(parser, argv)
    if args.config is not None:
        parser.set_defaults(**read_config(parser, args.config, comm))
        args = parse_arguments(parser, argv)
    if args.print_config:
        if comm.is_root:
            sys.stdout.write(config_text(parser, args))
            sys.stdout.flush()
        return None
    return args


def parse_arguments(parser, argv):
    """``parser.parse_args(argv)``, with "did you mean" for an unknown option."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = [flag for action in parser._actions for flag in action.option_strings]
        close = difflib.get_close_matches(unknown[0].split("=")[0], flags, n=1)
        hint = f"; did you mean {close[0]}?" if close and unknown[0].startswith("--") else ""
        raise UsageError(f"unrecognized argument{'s' * (len(unknown) > 1)}: {' '.join(unknown)}{hint}")
    return args


def read_config(parser, path, comm):
    """Return the option values of the TOML file `path` as ``{dest: value}`` for ``parser.set_defaults``.

    Values pass through the option's ``type`` as on the command line and
    must be of the matching TOML type: a number for a float option, an
    integer for an int option, ``true``/``false`` for a flag, a string for a
    text option, a table for a repeatable ``NAME=VALUE`` option.
    """
    text, problem = None, None
    if comm.is_root:
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError as error:
            problem = f"{path}: cannot read the configuration file: {error.strerror or error}"
    text, problem = comm.bcast_object((text, problem))
    if problem is not None:
        raise UsageError(problem)
    # Here alone: the TOML parser costs ~5 ms of every run's start-up, and only --config reads TOML.
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        table = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise UsageError(f"{path}: not a valid TOML file: {error}") from None
    layout = config_layout(parser)
    values = {}
    for key, value in table.items():
        if key in layout and key != "":
            _expect(isinstance(value, dict), "a table", value, f"{path}: [{key}]")
            for name, item in value.items():
                values.update(_read_key(layout, key, name, item, f"{path}: [{key}]"))
        else:
            values.update(_read_key(layout, "", key, value, path))
    return values


def _read_key(layout, section, key, value, where):
    """``{dest: value}`` of `key` in the table `section` ("" the top level), or raise UsageError."""
    actions = layout[section]
    name = key.replace("-", "_")
    if name not in actions:
        elsewhere = [other for other, keys in layout.items() if other != section and name in keys]
        if elsewhere:
            place = f"the [{elsewhere[0]}] table" if elsewhere[0] else "the top level, before any table"
            hint = f" here; it belongs in {place}"
        else:
            close = difflib.get_close_matches(name, actions, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (keys: {', '.join(actions)})"
        raise UsageError(f"{where}: unknown key {key!r}{hint}")
    action = actions[name]
    return {action.dest: _from_toml(action, value, f"{where}: key {key!r}")}


def config_layout(parser):
    """``{table: {key: action}}`` of the options a configuration file may set; "" is the top level."""
    layout = {"": {}}
    sections = {}
    for group in parser._action_groups:
        name, keys = getattr(group, "config_section", ("", {}))
        for action in group._group_actions:
            sections[action.dest] = name, keys.get(action.dest, action.dest)
    for action in parser._actions:
        if action.default is not argparse.SUPPRESS and action.dest not in CONFIG_DESTS:
            name, key = sections.get(action.dest, ("", action.dest))
            layout.setdefault(name, {})[key] = action
    return layout


def config_text(parser, args):
    """Return the options of `args` as the text of a TOML configuration file.

    Every option appears: those without a value (not set, no default) as a
    comment with their help, under their table.
    """
    import tomli_w

    parts = []
    for section, actions in config_layout(parser).items():
        table, unset = {}, []
        for key, action in actions.items():
            value = getattr(args, action.dest)
            if value is None:
                text = " ".join((action.help or "").split()) % {"default": action.default, "prog": parser.prog}
                unset.append(f"# {key} = ...  (not set: {text})")
                continue
            if _is_pairs(action):
                value = {name: _guess_type(text) for name, _, text in (pair.partition("=") for pair in value)}
            elif isinstance(value, tuple):
                value = list(value)
            table[key] = value
        text = tomli_w.dumps({section: table} if section else table)
        head, body = (text.split("\n", 1) if section and table else (f"[{section}]" if section else "", text))
        parts.append("\n".join(line for line in (head, *unset) if line) + ("\n" if head or unset else "") + body)
    return f"# {parser.prog} configuration (--config FILE)\n" + "\n".join(parts)


def _is_pairs(action):
    return isinstance(action, argparse._AppendAction) and action.metavar == "NAME=VALUE"


_TOML_TYPES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               dict: "a table", list: "an array"}


def _toml_type(value):
    return next((name for kind, name in _TOML_TYPES.items() if isinstance(value, kind)), "a date or time")


def _expect(ok, what, value, where):
    if not ok:
        raise UsageError(f"{where}: expected {what}, got {_toml_type(value)} {value!r}")


def _from_toml(action, value, where):
    """Convert a TOML `value` for `action` as the command line would, or raise UsageError."""
    if _is_pairs(action):
        _expect(isinstance(value, dict), "a table of NAME = VALUE", value, where)
        for name, item in value.items():
            _expect(isinstance(item, (str, int, float, bool)), "a string, number or boolean",
                    item, f"{where}: {name!r}")
        return [f"{name}={_text(item)}" for name, item in value.items()]
    if action.nargs == 0:  # a flag: true means given
        _expect(isinstance(value, bool), "true or false", value, where)
        return action.const if value else action.default
    if isinstance(action, argparse._AppendAction) and isinstance(value, str):
        return [_convert(action, value, where)]  # the option given once
    if isinstance(action, argparse._AppendAction) or action.nargs not in (None, "?"):
        _expect(isinstance(value, list), "an array", value, where)
        return [_convert(action, item, where) for item in value]
    return _convert(action, value, where)


def _convert(action, value, where):
    kind = action.type
    if kind is float:
        _expect(isinstance(value, (int, float)) and not isinstance(value, bool), "a number", value, where)
        converted = float(value)
    elif kind is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), "an integer", value, where)
        converted = value
    elif kind is None or kind is str:
        _expect(isinstance(value, str), "a string", value, where)
        converted = value
    else:
        # Any other type parses the option's text: give it what one would type.
        text = ",".join(map(_text, value)) if isinstance(value, list) else _text(value)
        try:
            converted = kind(text)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
            raise UsageError(f"{where}: {error}") from None
    if action.choices is not None and converted not in action.choices:
        raise UsageError(f"{where}: {converted!r} is not one of {', '.join(map(repr, action.choices))}")
    return converted


def _text(value):
    """The command-line text of a TOML scalar (``true``/``false`` for booleans, repr for numbers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


def _guess_type(text):
    """The TOML value for the text of a ``NAME=VALUE`` pair: a boolean or number where it reads as one."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
