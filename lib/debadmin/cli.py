"""The command-line contract every tool shares: parser setup, logging, errors to exit codes."""

from __future__ import annotations  # annotations stay text: typing is never imported

import argparse
import os
import sys

from debadmin import __version__
from debadmin.errors import EXIT_ERROR, Error, NotApplicable

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    import logging
    from typing import Callable, Optional, Sequence, Tuple

# logging's ERROR, WARNING and DEBUG for -q, neither, -v.  run() sets logging up without
# importing it when the tool has not imported it: logging and what it pulls in are ~6 ms
# of start-up, which a tool that logs nothing on its common path need not pay.
LEVELS = {-1: 40, 0: 30, 1: 10}
_pending: Optional[Tuple[str, int]] = None  # (prog, level) until logging is set up


def logger() -> "logging.Logger":
    """The "debadmin" logger, set up as run() was asked to: for a tool that imports
    logging only once it has something to log."""
    import logging

    global _pending
    if _pending is not None:
        prog, level = _pending
        _pending = None
        logging.basicConfig(level=level, format=f"{prog}: %(message)s", stream=sys.stderr)
    return logging.getLogger("debadmin")


def enabled(level: int) -> bool:
    """Whether a message at level (logging.INFO...) would be shown; without importing
    logging while nothing has (run()'s level is then the only setting)."""
    if _pending is not None and "logging" not in sys.modules:
        return level >= _pending[1]
    return logger().isEnabledFor(level)


def terminal_width() -> int:
    """The terminal's width as shutil.get_terminal_size() reads it ($COLUMNS, then the
    terminal on stdout, else 80), without importing shutil."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help formatter for the descriptions as written, whose width does not
    cost an import of shutil: argparse makes a formatter for every add_argument, and
    shutil pulls in bz2, lzma and fnmatch, ~1.5 ms of every run of a tool that never
    prints its help (measured on journal-acl-setup check, whose speed is a target)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: Optional[int] = None,
    ) -> None:
        if width is None:
            width = terminal_width() - 2  # as HelpFormatter does with shutil's width
        super().__init__(prog, indent_increment, max_help_position, width)


def new_parser(
    prog: str, description: str, epilog: Optional[str] = None
) -> argparse.ArgumentParser:
    """An ArgumentParser with --version, -q and -v, as every tool has them; subparsers
    take formatter_class=Formatter for the same width at the same cost."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=Formatter,
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
    errors exit 2 as well.  Not applicable (exit 3) is a verdict, not an error: its line
    is 'PROG: MESSAGE'.  With --json every run prints one JSON object on stdout: when the
    tool printed none (an error, a usage error, a refusal), {"error": MESSAGE,
    "exit_status": CODE} (not applicable: {"applicable": false, "reason": ...}).
    """
    as_json = _json_asked(argv)
    try:
        try:
            args = _parse(parser, argv, as_json)
        except SystemExit as exc:  # --help, --version, usage errors
            code = int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_ERROR
            if as_json and code:
                _emit_error(_usage_message(exc), code)
            _flush_stdout()
            return code
    except BrokenPipeError:
        return _stdout_gone()
    as_json = bool(getattr(args, "json", False))
    global _pending
    _pending = (prog, LEVELS[getattr(args, "verbosity", 0)])
    if "logging" in sys.modules or _pending[1] < LEVELS[0]:  # the tool logs, or -v
        logger()
    target = func or args.func
    metrics = sys.modules.get("debadmin.metrics")
    if metrics is not None:
        metrics.start()  # a new run (tests call main() again in one process)
    code = EXIT_ERROR
    try:
        code = _run_command(prog, target, args, as_json)
        return code
    finally:
        if getattr(args, "metrics", False):
            _write_metrics(prog, args, code)


def _write_metrics(prog: str, args: argparse.Namespace, code: int) -> None:
    """The run's node_exporter textfile (debadmin.metrics), for the commands that
    declare one; a failure to write it is a warning, never the run's exit status."""
    from debadmin import metrics

    try:
        metrics.finish(prog, args, code)
    except Error as exc:
        logger().warning("warning: metrics not written: %s", exc)


def _run_command(prog: str, target, args: argparse.Namespace, as_json: bool) -> int:
    """target(args), its expected failures turned into exit codes (see run())."""
    try:
        code = int(target(args))
        if as_json:  # a tool that returned without its document (a refusal it printed)
            _emit_error("failed: see the message on stderr" if code else None, code)
        # Flush here, not at interpreter exit, where a closed pipe (| head) would end in
        # "Exception ignored ... BrokenPipeError" on stderr and exit 120.
        _flush_stdout()
        return code
    except NotApplicable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        if as_json:
            _emit_error(str(exc), exc.code, applicable=False)
        return exc.code
    except Error as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        if as_json:
            _emit_error(str(exc), exc.code)
        return exc.code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        if as_json:
            _emit_error("interrupted", 130)
        return 130
    except BrokenPipeError:
        return _stdout_gone()


def _json_asked(argv) -> bool:
    """Whether the command line asks for --json (before an argument parser has read it:
    its own usage errors then go into the JSON object too); a new run's output state."""
    output = sys.modules.get("debadmin.output")
    if output is not None:
        output.emitted = False  # a new run (tests call main() again in one process)
    words = list(sys.argv[1:] if argv is None else argv)
    words = words[: words.index("--")] if "--" in words else words
    # argparse takes an unambiguous abbreviation (--js) for --json too
    return any(len(word) > 2 and "--json".startswith(word) for word in words)


def _parse(parser: argparse.ArgumentParser, argv, as_json: bool) -> argparse.Namespace:
    """parser.parse_args(argv); with --json, argparse's usage error is kept (SystemExit's
    __context__ is not enough: argparse prints it itself) to go into the JSON object."""
    if not as_json:
        return parser.parse_args(argv)
    import contextlib
    import io

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parser.parse_args(argv)
    except SystemExit as exc:
        exc.usage_text = captured.getvalue()
        raise
    finally:
        sys.stderr.write(captured.getvalue())


def _usage_message(exc: SystemExit) -> str:
    """argparse's 'PROG: error: MESSAGE' line, without 'PROG: error: '."""
    lines = getattr(exc, "usage_text", "").strip().splitlines()
    last = lines[-1] if lines else "usage error"
    return last.split(": error: ", 1)[-1]


def _emit_error(message: Optional[str], code: int, applicable: bool = True) -> None:
    """The run's JSON object, when the tool printed none: the error (or, for not
    applicable, the reason) and the exit status."""
    output = sys.modules.get("debadmin.output")
    if output is not None and getattr(output, "emitted", False):
        return
    from debadmin.output import emit_json

    if not applicable:
        emit_json({"applicable": False, "reason": message, "exit_status": code})
    elif message is None:
        emit_json({"exit_status": code})
    else:
        emit_json({"error": message, "exit_status": code})


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
