"""Run README.md's Python examples, in order, in one fresh process, and time them.

The ```python blocks of README.md are executed one after another in a single namespace
(as a user pasting them into one session would), in a fresh Python process whose working
directory is a new temporary directory, not the checkout: an example that reads a file
by a path relative to the checkout fails here as it would for a user. Each block's time
and each of its statements that took over a second are printed as they finish, so a slow
statement (the Boehm sample of example 4) shows while it runs.

    python tools/readme_examples.py                # every block
    python tools/readme_examples.py --blocks 1,2   # some of them (1-based)

Exit status: 0 when every block ran, 1 otherwise (the traceback is printed).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)

# Executed in the fresh process: argv[1] the blocks as one JSON list.
_RUNNER = r'''
import ast, json, sys, time, traceback
blocks = json.loads(open(sys.argv[1]).read())
scope = {"__name__": "__main__"}
t_all = time.perf_counter()
for n, src in blocks:
    t_block = time.perf_counter()
    try:
        for node in ast.parse(src).body:
            t = time.perf_counter()
            exec(compile(ast.Module([node], []), f"<README block {n}>", "exec"), scope)
            dt = time.perf_counter() - t
            if dt > 1.0:
                line = ast.get_source_segment(src, node).splitlines()[0]
                print(f"  block {n}, line {node.lineno}: {dt:7.1f} s  {line}", flush=True)
    except Exception:
        traceback.print_exc()
        print(f"block {n}: FAILED after {time.perf_counter() - t_block:.1f} s", flush=True)
        sys.exit(1)
    print(f"block {n}: {time.perf_counter() - t_block:.1f} s", flush=True)
print(f"all blocks: {time.perf_counter() - t_all:.1f} s", flush=True)
'''


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown ``text``, in order."""
    return [m.group(1) for m in _BLOCK.finditer(text)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", type=Path, default=README)
    ap.add_argument("--blocks", default="", help="1-based block numbers, comma separated")
    args = ap.parse_args(argv)
    import json

    blocks = list(enumerate(python_blocks(args.readme.read_text()), start=1))
    if args.blocks:
        keep = {int(b) for b in args.blocks.split(",")}
        blocks = [(n, b) for n, b in blocks if n in keep]
    with tempfile.TemporaryDirectory(prefix="readme_examples_") as tmp:
        spec = Path(tmp) / "blocks.json"
        spec.write_text(json.dumps(blocks))
        print(f"{len(blocks)} blocks of {args.readme}, run in {tmp}", flush=True)
        return subprocess.call([sys.executable, "-u", "-c", _RUNNER, str(spec)], cwd=tmp)


if __name__ == "__main__":
    sys.exit(main())
