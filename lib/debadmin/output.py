"""Reports on stdout: plain text or one JSON document."""

import json
import sys
from typing import Any


def emit_json(document: Any) -> None:
    """Print one JSON document (stable key order as built, UTF-8, trailing newline)."""
    json.dump(document, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
