"""Every public name of ``gradsolve``, ``models`` and ``inference`` is documented.

Import-only (nothing is solved or compiled). For every name in the packages' ``__all__``:

- it has its own docstring (for a plain data attribute such as ``models.ZOO``: the string
  literal right after its assignment, which is what mkdocstrings renders);
- a callable or class with arguments has an ``Args:``/``Arguments:``/``Attributes:``/
  ``Parameters:`` section that mentions each argument by name (an enum: each member);
- a callable or class shows an example (an ``Example`` section or a ``>>>`` line).

The API reference (``docs/api/*.md``, built with ``make docs``) renders these docstrings.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import pathlib
import re

import pytest

PACKAGES = ("gradsolve", "models", "inference")

SECTION = re.compile(r"^\s*(Args|Arguments|Attributes|Parameters):\s*$", re.MULTILINE)


def _public():
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        for name in mod.__all__:
            yield pytest.param(mod, name, id=f"{pkg}.{name}")
            sub = getattr(mod, name)
            if inspect.ismodule(sub):  # a public namespace (gs.drivers): its names too
                for inner in sub.__all__:
                    yield pytest.param(sub, inner, id=f"{pkg}.{name}.{inner}")


def _attribute_docstring(mod, name: str) -> str | None:
    """The docstring literal following ``name = ...`` at the top level of ``mod``."""
    tree = ast.parse(pathlib.Path(mod.__file__).read_text(encoding="utf-8"))
    body = tree.body
    for node, nxt in zip(body, body[1:]):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                return nxt.value.value
    return None


def _own_doc(obj) -> str | None:
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return inspect.cleandoc(doc) if doc else None


def _argument_names(obj) -> list[str]:
    """Names a docstring must mention: an enum's members, otherwise the signature's."""
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return [m.name for m in obj]
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    names = []
    for p in sig.parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        # Abstract class variables of equinox modules are set by subclasses, not passed.
        if "AbstractClassVar" in str(p.annotation):
            continue
        names.append(p.name)
    return names


@pytest.mark.parametrize(("mod", "name"), list(_public()))
def test_public_name_is_documented(mod, name):
    obj = getattr(mod, name)
    if inspect.ismodule(obj):
        assert obj.__doc__ and obj.__doc__.strip(), f"{mod.__name__}.{name}: no module docstring"
        return
    if not (callable(obj) or inspect.isclass(obj)):
        doc = _attribute_docstring(mod, name)
        assert doc and doc.strip(), f"{mod.__name__}.{name}: no docstring after its assignment"
        return

    doc = _own_doc(obj)
    assert doc, f"{mod.__name__}.{name}: no docstring"

    args = _argument_names(obj)
    if args:
        assert SECTION.search(doc), (
            f"{mod.__name__}.{name}: no Args/Arguments/Attributes/Parameters section "
            f"(arguments {args})"
        )
        missing = [a for a in args if not re.search(rf"\b{re.escape(a)}\b", doc)]
        assert not missing, f"{mod.__name__}.{name}: arguments not documented: {missing}"

    assert "Example" in doc or ">>>" in doc, f"{mod.__name__}.{name}: no example"


def test_all_names_exist():
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        for name in mod.__all__:
            assert hasattr(mod, name), f"{pkg}.__all__ lists missing name {name!r}"


def test_api_reference_covers_all_public_names():
    """docs/api/<pkg>.md has a ``::: pkg.name`` directive for every public name."""
    root = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api"
    if not root.is_dir():
        pytest.skip("docs/api not present")
    for pkg in PACKAGES:
        text = (root / f"{pkg}.md").read_text(encoding="utf-8")
        mod = importlib.import_module(pkg)
        missing = [n for n in mod.__all__ if not re.search(rf"^:::\s+{pkg}\.{n}\s*$", text, re.M)]
        assert not missing, f"docs/api/{pkg}.md lacks directives for {missing}"
