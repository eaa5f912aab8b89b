"""Reports on stdout: plain text or one JSON document."""

import json
import sys
from typing import Any

# Whether this run has printed its JSON document: cli.run prints one for an error only
# when the tool has not (a fleet's parser gets exactly one object).
emitted = False


def emit_json(document: Any) -> None:
    """Print one JSON document (stable key order as built, UTF-8, trailing newline).

    Encoded as one string and written once: json.dump writes every token on its own
    (a million writes for a large report, most of the time spent).
    """
    write_json_text(json.dumps(document, indent=2, ensure_ascii=False))


def write_json_text(text: str) -> None:
    """One JSON document already encoded as text, on stdout, counted as this run's."""
    global emitted
    # A file name's undecodable bytes (surrogateescape) are lone surrogates, which UTF-8
    # cannot encode: write them as JSON's own \udcXX escapes, which decode back to them.
    sys.stdout.write(text.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
    emitted = True
    sys.stdout.flush()
