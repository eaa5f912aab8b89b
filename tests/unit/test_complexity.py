"""No function or method above cyclomatic complexity 20, as radon counts it (issue 27).

Above that, a function holds several decisions that have names of their own (per format,
per manager, per step): split it there. radon is a test dependency of 'make check'
(CHECK_DEPENDS); the package build does not install it and skips this test.
"""

from pathlib import Path

import pytest

radon_complexity = pytest.importorskip("radon.complexity")

SRC = Path(__file__).resolve().parents[2]
LIMIT = 20


def python_files():
    yield from sorted((SRC / "lib").rglob("*.py"))
    yield from sorted((SRC / "tests" / "unit").glob("*.py"))
    for directory in ("bin", "build-aux", "bench"):
        for path in sorted((SRC / directory).iterdir()):
            if not path.is_file():  # __pycache__ where a test imported a script
                continue
            with path.open("rb") as f:
                if b"python3" in f.readline():
                    yield path


def test_no_function_above_the_limit():
    over = []
    for path in python_files():
        for block in radon_complexity.cc_visit(path.read_text()):
            blocks = [block, *getattr(block, "methods", [])]
            for b in blocks:
                if b.complexity > LIMIT:
                    over.append(f"{path.relative_to(SRC)}:{b.lineno} {b.name} {b.complexity}")
    assert not over, "above complexity 20: " + ", ".join(over)
