"""node_exporter textfile metrics, one shape for every tool (debadmin(7), METRICS).

A command that a tool declares with ``set_defaults(metrics=True)`` (or a function of
the parsed arguments saying whether this run writes) leaves, when cli.run() ends it,
DIRECTORY/debadmin_TOOL.prom with:

  debadmin_findings{tool="TOOL",severity}            the run's findings by severity
  debadmin_TOOL_exit_status{command}                  the run's exit status
  debadmin_TOOL_last_run_timestamp_seconds{command}   when it ended
  debadmin_TOOL_NAME{...}                             the tool's own gauges, if any

TOOL is the program name with "-" turned into "_".  The file is replaced atomically
(temp file, fsync, rename); nothing is written with --dry-run, when DIRECTORY does not
exist or is not writable by the caller (a user's run), and a failure to write is one
warning line, never the tool's exit status.
"""

from __future__ import annotations  # annotations stay text: typing is never imported

import os
import re
import time
from pathlib import Path

from debadmin import fsutil
from debadmin.errors import Error
from debadmin.findings import SEVERITIES

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

    Sample = Tuple[Dict[str, str], float]

# Where Debian's prometheus-node-exporter reads textfiles (its --collector.textfile.directory).
DIRECTORY = Path("/var/lib/prometheus/node-exporter")
NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")
FINDINGS_HELP = "Findings of the last run of a debadmin tool, by severity."

# The run in progress: what the tool told about it (cli.run() starts and ends it).
_findings: List[Dict[str, Any]] = []
_gauges: List[Tuple[str, str, List[Sample]]] = []


def metric_tool(prog: str) -> str:
    """The TOOL part of the metric names: the program name, "-" turned into "_"."""
    return prog.replace("-", "_")


def file_name(prog: str) -> str:
    return f"debadmin_{metric_tool(prog)}.prom"


def start() -> None:
    """A new run: forget what an earlier one (tests run main() again) recorded."""
    _findings.clear()
    _gauges.clear()


def findings(items: Iterable[Dict[str, Any]]) -> None:
    """This run's findings (debadmin.findings shape), counted in debadmin_findings; a
    later call replaces them (what is left after a fix, say)."""
    _findings[:] = list(items)


def gauge(name: str, help_text: str, samples: Iterable[Sample]) -> None:
    """A gauge of the tool's own, exported as debadmin_TOOL_NAME; samples are
    (labels, value) pairs.  A name given twice replaces the earlier one."""
    if not NAME.match(name):
        raise ValueError(f"bad metric name {name!r}")
    _gauges[:] = [g for g in _gauges if g[0] != name]
    _gauges.append((name, help_text, list(samples)))


def escape(value: str) -> str:
    """A label value in the text exposition format."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(name: str, labels: Dict[str, str], value: float) -> str:
    text = ",".join(f'{key}="{escape(str(val))}"' for key, val in labels.items())
    number = repr(float(value)) if isinstance(value, float) else str(int(value))
    return f"{name}{{{text}}} {number}" if text else f"{name} {number}"


def render(
    prog: str,
    command: str,
    status: int,
    now: float,
    found: Sequence[Dict[str, Any]] = (),
    gauges: Sequence[Tuple[str, str, List[Sample]]] = (),
) -> str:
    """The textfile: every family's HELP, TYPE and samples together."""
    tool = metric_tool(prog)
    counts = {severity: 0 for severity in SEVERITIES}
    for item in found:
        counts[item.get("severity", "info") if item.get("severity") in counts else "info"] += 1
    families: List[Tuple[str, str, List[Sample]]] = [
        (
            "debadmin_findings",
            FINDINGS_HELP,
            [({"tool": tool, "severity": sev}, n) for sev, n in counts.items()],
        ),
        (
            f"debadmin_{tool}_exit_status",
            f"Exit status of the last run of {prog}: 0 ok, 1 action needed, 2 error, "
            "3 not applicable.",
            [({"command": command}, status)],
        ),
        (
            f"debadmin_{tool}_last_run_timestamp_seconds",
            f"When the last run of {prog} ended, in seconds since the epoch.",
            [({"command": command}, int(now))],
        ),
    ]
    families += [(f"debadmin_{tool}_{name}", text, samples) for name, text, samples in gauges]
    out: List[str] = []
    for name, help_text, samples in families:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out += [_sample(name, labels, value) for labels, value in samples]
    return "\n".join(out) + "\n"


def wanted(args: Optional[argparse.Namespace]) -> bool:
    """Whether this run writes metrics: its command declares it, and it is no --dry-run."""
    if args is None or getattr(args, "dry_run", False):
        return False
    declared = getattr(args, "metrics", False)
    return bool(declared(args) if callable(declared) else declared)


def command_of(args: argparse.Namespace) -> str:
    """The command label: the subcommand, else the tool's metrics_command (a name, or a
    function of the arguments: secureboot-ca-check's check or fix), else 'run'."""
    name = getattr(args, "command", None) or getattr(args, "metrics_command", None)
    if callable(name):
        name = name(args)
    return str(name) if name else "run"


def finish(
    prog: str,
    args: Optional[argparse.Namespace],
    status: int,
    directory: Optional[Path] = None,
) -> Optional[Path]:
    """Write this run's textfile if it is wanted and the directory is there and ours to
    write; the path written, else None.  A failure to write is an Error, which cli.run()
    turns into a warning line: the tool's exit status stands."""
    try:
        if not wanted(args):
            return None
        target = DIRECTORY if directory is None else directory
        if not target.is_dir() or not os.access(target, os.W_OK | os.X_OK):
            return None  # no node_exporter here, or a user's run: nothing to say
        path = target / file_name(prog)
        text = render(prog, command_of(args), status, time.time(), _findings, _gauges)
        try:
            fsutil.atomic_write(path, text, mode=0o644)
        except OSError as exc:
            raise Error(f"cannot write {path}: {exc.strerror or exc}") from None
        return path
    finally:
        start()
