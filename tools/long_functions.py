"""List functions longer than a limit (code lines: the docstring not counted).

    python tools/long_functions.py [limit]     # default 100
"""

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def lengths():
    for pkg in ("gradsolve", "inference", "models"):
        for path in sorted((ROOT / pkg).glob("**/*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    body = node.body
                    if body and isinstance(body[0], ast.Expr) and \
                            isinstance(getattr(body[0], "value", None), ast.Constant) and \
                            isinstance(body[0].value.value, str):
                        n -= body[0].end_lineno - body[0].lineno + 1
                    yield n, str(path.relative_to(ROOT)), node.name, node.lineno


if __name__ == "__main__":
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    for n, path, name, line in sorted(lengths(), reverse=True):
        if n > limit:
            print(f"{n:5d}  {path}:{line}  {name}")
