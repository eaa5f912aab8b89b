"""The command-line contract every tool shares: parser setup, logging, errors to exit codes."""

import argparse
import logging
import os
import sys
from typing import Callable, Optional, Sequence

from debadmin import __version__
from debadmin.errors import EXIT_ERROR, Error

log = logging.getLogger("debadmin")


def new_parser(
    prog: str, description: str, epilog: Optional[str] = None
) -> argparse.ArgumentParser:
    """An ArgumentParser with --version, -q and -v, as every tool has them."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")
    add_verbosity(parser)
    return parser


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    """-q/-v on a parser (subparsers get them too, so they work after the command)."""
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_const",
        const=-1,
        dest="verbosity",
        default=argparse.SUPPRESS,
        help="print only errors on stderr",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_const",
        const=1,
        dest="verbosity",
        default=argparse.SUPPRESS,
        help="print debugging output on stderr",
    )


def run(
    prog: str,
    parser: argparse.ArgumentParser,
    argv: Optional[Sequence[str]],
    func: Optional[Callable[[argparse.Namespace], int]] = None,
) -> int:
    """Parse argv, run args.func (or func), and turn expected failures into exit codes.

    Errors print one line, 'PROG: error: MESSAGE', on stderr.  argparse's own usage
    errors exit 2 as well.
    """
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version, usage errors
            _flush_stdout()
            return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_ERROR
    except BrokenPipeError:
        return _stdout_gone()
    verbosity = getattr(args, "verbosity", 0)
    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.DEBUG}[verbosity]
    logging.basicConfig(level=level, format=f"{prog}: %(message)s", stream=sys.stderr)
    target = func or args.func
    try:
        code = int(target(args))
        # Flush here, not at interpreter exit, where a closed pipe (| head) would end in
        # "Exception ignored ... BrokenPipeError" on stderr and exit 120.
        _flush_stdout()
        return code
    except Error as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _stdout_gone()


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def _stdout_gone() -> int:
    """stdout's reader went away (| head): the output is cut short, so exit 2, but quietly.

    What is still buffered can never be written: point stdout at /dev/null so that the
    flush at interpreter exit does not raise BrokenPipeError a second time.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_ERROR
