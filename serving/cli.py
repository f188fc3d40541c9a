"""The ``fanout token`` subcommand: mint a bearer token for one user.

``infra/cli.py`` owns the ``fanout`` command and calls :func:`register` with its
subparsers. The secret comes from ``FANOUT_AUTH_SECRET`` in ``args.environ``, the
environment that ``fanout`` gives its subcommands: the process's over the run
directory's stack's, whose secret is ``<run>/auth.secret`` (see
``infra.stack.stack.Stack.env``), so ``fanout token 42`` works against ``fanout up`` as it is.
"""

from __future__ import annotations

import argparse
import os
import sys

from serving.settings import ServingSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``token`` to the ``fanout`` command's subparsers."""
    p = subparsers.add_parser("token", help="print a bearer token that acts as USER")
    p.add_argument("user", metavar="USER", help="user id (decimal, 1..2^63-1)")
    p.add_argument("--ttl", type=int, default=None, metavar="SECONDS",
                   help=f"lifetime ({ServingSettings.env_help('token_ttl_s')})")
    p.set_defaults(func=run_token, environ=os.environ)


def run_token(args: argparse.Namespace) -> int:
    """Print the token on stdout (only it, for ``$(fanout token 42)``); 2 on bad input."""
    # Imported here: registering the subcommand must not load FastAPI for every command.
    from serving.callers import mint
    from serving.errors import BadRequest, ConfigError
    from serving.ids import parse_id

    settings = ServingSettings.from_env(args.environ)
    try:
        user = parse_id(args.user, "USER")
        token = mint(user, settings.secret(), args.ttl or settings.token_ttl_s)
    except (BadRequest, ConfigError) as exc:
        print(f"fanout token: {exc.message}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"fanout token: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0
