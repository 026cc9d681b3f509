"""Print how many CPUs this process may use (`gradsolve._cpus.usable_cpus`: its affinity,
limited by any cgroup CPU quota), at most ``cap``. `make test` starts this many pytest
workers. It runs before the package is installed, so the module is loaded by its path.

Usage: ``python3 tools/cpus.py [cap]``.
"""

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parent.parent / "gradsolve" / "_cpus.py"
_spec = importlib.util.spec_from_file_location("gradsolve_cpus", _path)
_cpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cpus)

if __name__ == "__main__":
    n = _cpus.usable_cpus()
    print(min(n, int(sys.argv[1])) if len(sys.argv) > 1 else n)
