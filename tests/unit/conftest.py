"""Import debadmin from the tree under test, never from an installed python3-debadmin.

pybuild runs the tests from its build directory (which holds debadmin/ and comes first on
sys.path); anywhere else the source tree's lib/ goes first.
"""

import sys
from pathlib import Path

if not (Path.cwd() / "debadmin" / "__init__.py").is_file():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lib"))
