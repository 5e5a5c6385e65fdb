"""Party mode's keys: each party's signing key (keygen) and the roster of the parties' public keys (roster).

Run as ``prbmrm party keygen PREFIX`` and ``prbmrm party roster PUB... --out FILE``.

Each party makes its long-term signing key once (:func:`prbmrm.party.keys.keygen`); the roster
collects their public keys in rank order (:func:`prbmrm.party.keys.write_roster`).
"""

import argparse
import sys

from ..errors import InputError
from ..party.keys import keygen, write_roster
from .common import program


def main(argv=None):
    """``prbmrm party keygen PREFIX`` or ``roster PUB... --out FILE``."""
    parser = argparse.ArgumentParser(prog=program("prbmrm.cli.party"), description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("keygen", help="make this party's signing key: PREFIX.key and PREFIX.pub")
    make.add_argument("prefix")
    roster = commands.add_parser("roster", help="collect the parties' public keys, in rank order")
    roster.add_argument("public", nargs="+", help="the .pub files, party 0 first")
    roster.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "keygen":
            print(f"{args.prefix}.key written (keep it secret); {args.prefix}.pub fingerprint "
                  f"{keygen(args.prefix)}")
        else:
            write_roster(args.public, args.out)
            print(f"roster of {len(args.public)} parties written to {args.out}")
    except (InputError, OSError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
