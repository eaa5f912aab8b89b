"""Running other programs: argv lists only, C.UTF-8 output, failures as one-line errors."""

import logging
import os
import subprocess
from typing import Mapping, Optional, Sequence

from debadmin.errors import Error

log = logging.getLogger("debadmin")


def run(
    argv: Sequence[str],
    check: bool = True,
    input: Optional[bytes] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
) -> subprocess.CompletedProcess:
    """Run argv (never through a shell) and capture its output as text.

    With check, a non-zero exit raises Error naming the command and its last stderr line.
    """
    full_env = dict(os.environ)
    full_env["LC_ALL"] = "C.UTF-8"
    if env:
        full_env.update(env)
    log.debug("running: %s", " ".join(argv))
    try:
        result = subprocess.run(
            list(argv),
            input=input,
            capture_output=True,
            env=full_env,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise Error(f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise Error(f"{argv[0]} did not finish within {timeout} s") from None
    completed = subprocess.CompletedProcess(
        result.args,
        result.returncode,
        result.stdout.decode("utf-8", "replace"),
        result.stderr.decode("utf-8", "replace"),
    )
    if check and completed.returncode != 0:
        lines = completed.stderr.strip().splitlines() or completed.stdout.strip().splitlines()
        detail = lines[-1] if lines else f"exit status {completed.returncode}"
        raise Error(f"{argv[0]} failed: {detail}")
    return completed
