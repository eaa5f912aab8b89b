"""Reports on stdout: plain text or one JSON document."""

import json
import sys
from typing import Any


def emit_json(document: Any) -> None:
    """Print one JSON document (stable key order as built, UTF-8, trailing newline).

    Encoded as one string and written once: json.dump writes every token on its own
    (a million writes for a large report, most of the time spent).
    """
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()
