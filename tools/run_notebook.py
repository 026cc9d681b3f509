"""Run a tutorial notebook's code cells in one namespace and write it back with their
printed output, for machines without Jupyter (the lent TPU machine has no package index).

    python tools/run_notebook.py tutorials/11_on_a_tpu.ipynb OUT.ipynb

Each code cell's stdout and stderr become its ``stream`` outputs (execution counts in
order); a failing cell stops the run, its traceback kept as the cell's error output. Only
what a cell prints is kept (no rich display), which is all the tutorials written as
scripts produce. Uses only the standard library: a notebook is JSON.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback


def main(src: str, dst: str) -> int:
    with open(src) as fh:
        nb = json.load(fh)
    ns: dict = {"__name__": "__main__"}
    count, failed = 0, False
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        if failed:
            cell["outputs"], cell["execution_count"] = [], None
            continue
        count += 1
        code = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        out, err = io.StringIO(), io.StringIO()
        outputs = []
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(compile(code, f"<cell {count}>", "exec"), ns)
        except Exception as e:  # noqa: BLE001 - written into the notebook
            failed = True
            tb = traceback.format_exc()
            outputs.append({"output_type": "error", "ename": type(e).__name__,
                            "evalue": str(e), "traceback": tb.splitlines()})
        for name, buf in (("stdout", out), ("stderr", err)):
            text = buf.getvalue()
            if text:
                outputs.insert(0 if name == "stdout" else len(outputs),
                               {"output_type": "stream", "name": name,
                                "text": text.splitlines(keepends=True)})
        sys.stdout.write(out.getvalue())
        sys.stderr.write(err.getvalue())
        cell["outputs"], cell["execution_count"] = outputs, count
    with open(dst, "w") as fh:
        json.dump(nb, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
