"""One shape for what a check found, shared by every tool's text and --json output.

A finding is a dict with these keys, in this order:

  code      stable kebab-case identifier (``storage-volatile``, ``not-persisted``)
  severity  ``action`` (the check exits 1), ``warning`` (worth knowing, exit unchanged)
            or ``info``
  subject   what it is about: a path, an interface, a variable name; None when global
  message   one line for a person

A tool may add keys after these for its own detail (``group``, ``path``...).  A JSON
report carries them as a top-level ``findings`` list; the exit code is 1 when any has
severity ``action``.
"""

from __future__ import annotations  # annotations stay text: typing is never imported

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional


SEVERITIES = ("action", "warning", "info")


def finding(
    code: str, severity: str, message: str, subject: Optional[str] = None, **detail: Any
) -> Dict[str, Any]:
    """A finding in the shared shape; extra keyword arguments become extra keys."""
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r}")
    result: Dict[str, Any] = {
        "code": code,
        "severity": severity,
        "subject": subject,
        "message": message,
    }
    result.update(detail)
    return result


def needs_action(findings: Iterable[Dict[str, Any]]) -> bool:
    """True when any finding asks for action (exit 1)."""
    return any(f["severity"] == "action" for f in findings)


def text_lines(findings: Iterable[Dict[str, Any]], indent: str = "") -> List[str]:
    """'SEVERITY: message' lines, in the order found."""
    return [f"{indent}{f['severity']}: {f['message']}" for f in findings]
