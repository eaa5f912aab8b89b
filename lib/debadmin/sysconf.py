"""Reading system configuration: /etc/default files and systemd-style drop-in directories."""

from __future__ import annotations  # annotations stay text: typing is never imported

import shlex
from pathlib import Path

from debadmin.errors import Error

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple


def read_default(
    path: Path,
    keys: Iterable[str],
    strict: bool = False,
) -> Optional[Dict[str, Tuple[int, str]]]:
    """KEY=value assignments of an /etc/default file, parsed as the shell would quote them.

    Returns {key: (line number, value)} for the wanted keys (the last assignment wins), or
    None when the file does not exist.  With strict, any other assignment is an error.
    """
    wanted = set(keys)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise Error(f"cannot read {path}: {exc}") from None
    values: Dict[str, Tuple[int, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, rest = line.partition("=")
        key = key.strip()
        if not sep or key not in wanted:
            if strict:
                expected = " or ".join(f"{k}=..." for k in sorted(wanted))
                raise Error(f"{path}:{number}: expected {expected}")
            continue
        try:
            values[key] = (number, " ".join(shlex.split(rest, comments=True)))
        except ValueError:
            raise Error(f"{path}:{number}: cannot parse {key}") from None
    return values


def dropin_files(root: Path, directories: Iterable[str], suffix: str) -> List[Path]:
    """Files ending in suffix from directories (under root), in systemd's order.

    A file name in an earlier directory masks the same name in later ones; the result is
    sorted by file name, as systemd reads drop-ins and .network files.
    """
    found: Dict[str, Path] = {}
    for base in directories:
        directory = root / base
        try:
            entries = list(directory.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise Error(f"cannot read {directory}: {exc.strerror}") from None
        for entry in entries:
            if entry.name.endswith(suffix) and entry.name not in found:
                found[entry.name] = entry
    return [found[name] for name in sorted(found)]
