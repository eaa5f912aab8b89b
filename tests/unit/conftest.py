"""Import debadmin from the tree under test: pybuild's build dir, else ../../lib."""

import sys
from pathlib import Path

try:
    import debadmin  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lib"))
