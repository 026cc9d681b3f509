"""README.md's Python examples: each block parses, and every ``gs.X``, ``inference.X`` and
``models.X`` it names exists (running them takes minutes: ``python
tools/readme_examples.py``, which this test's extraction is shared with)."""

import ast
import importlib.util
from pathlib import Path

import pytest

import gradsolve
import inference
import models

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_examples",
                                               ROOT / "tools" / "readme_examples.py")
readme_examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_examples)

BLOCKS = readme_examples.python_blocks((ROOT / "README.md").read_text())
PACKAGES = {"gs": gradsolve, "gradsolve": gradsolve, "inference": inference, "models": models}


def test_the_four_examples_are_found():
    assert len(BLOCKS) == 4
    assert "gs.enable_x64()" in BLOCKS[0]  # the first block switches float64 on for the rest


@pytest.mark.parametrize("n", range(len(BLOCKS)), ids=[f"block{n + 1}" for n in range(len(BLOCKS))])
def test_block_parses_and_names_existing_public_attributes(n):
    tree = ast.parse(BLOCKS[n], filename=f"README block {n + 1}")
    compile(tree, f"README block {n + 1}", "exec")
    named = [(node.value.id, node.attr) for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id in PACKAGES]
    missing = [f"{p}.{a}" for p, a in named if a.startswith("_") or not hasattr(PACKAGES[p], a)]
    assert not missing, f"README block {n + 1} names what does not exist: {missing}"
    assert named or n == 0


def test_no_example_reads_a_file_relative_to_the_checkout():
    """The examples run from any directory: data come from ``models.load_dataset``, not a
    path inside the checkout."""
    for n, block in enumerate(BLOCKS, start=1):
        assert "models/data" not in block, f"README block {n} reads a checkout path"


def test_extraction_finds_python_blocks_only():
    text = "a\n```bash\nmake\n```\n```python\nx = 1\n```\ntext\n```python\ny = 2\n```\n"
    assert readme_examples.python_blocks(text) == ["x = 1\n", "y = 2\n"]
