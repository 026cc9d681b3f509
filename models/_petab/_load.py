"""A PEtab problem's files read and checked: the YAML, its tables, the linter, the SBML model.

`read_problem` is `load_petab` up to the `PetabProblem`: it finds the YAML (a file, a folder
holding one, or the name of a problem shipped in ``models/data/petab``), refuses a file that
is not a PEtab YAML or an empty table with an error naming the file, drops missing
visualization files, runs the `petab` linter, warns about columns that do not enter the
likelihood, and reads the SBML model into an `SbmlOdes`.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import petab.v1 as petab
import yaml

from ._sbml import SbmlOdes, read_sbml

__all__ = ["read_problem", "check_tables"]


class _Collect(logging.Handler):
    """A logging handler that keeps the messages of the errors logged (the linter's)."""

    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _lint(problem, path):
    """The `petab` linter's errors as one ValueError."""
    handler = _Collect()
    logger = logging.getLogger("petab")
    logger.addHandler(handler)
    try:
        failed = petab.lint_problem(problem)
    finally:
        logger.removeHandler(handler)
    if failed:
        msgs = "\n  ".join(handler.messages) or "(no message)"
        raise ValueError(f"{path}: the PEtab linter found errors:\n  {msgs}")


_TABLES = (("measurement", "measurement_df", petab.MEASUREMENT_DF_COLS),
           ("observable", "observable_df", petab.OBSERVABLE_DF_COLS),
           # parameterType: pyPESTO's marks of hierarchical (inner) parameters, read by
           # `_hierarchical`
           ("parameter", "parameter_df", list(petab.PARAMETER_DF_COLS) + ["parameterType"]))


def _warn_unused_columns(problem, path) -> None:
    """A warning for every table column this importer does not read, so nothing is dropped
    unseen: columns outside PEtab v1 (e.g. ``useData``, or ``noiseDistribution`` in the
    measurement table, an older convention: both would change the likelihood where read;
    ``parameterType``, pyPESTO's marks of inner parameters, is read) and initialization
    priors (multistart fits draw their starts by Latin hypercube within
    the bounds)."""
    for table, attr, known in _TABLES:
        df = getattr(problem, attr, None)
        if df is None:
            continue
        cols = [c for c in list(df.columns) + list(df.index.names or [])
                if c is not None and c not in known]
        if cols:
            warnings.warn(f"{path}: {table} table column(s) {cols} are not PEtab v1 columns: "
                          "ignored (they do not enter the likelihood)", stacklevel=4)
    df = problem.parameter_df
    for col in ("initializationPriorType", "initializationPriorParameters"):
        if df is not None and col in df.columns and df[col].notna().any() and \
                (df[col].astype(str).str.strip() != "").any():
            warnings.warn(f"{path}: parameter table column {col!r} is not used: multistart "
                          "fits draw their starts by Latin hypercube within the bounds "
                          "(inference.fit(problem, n_starts=...))", stacklevel=4)
            break


# (table, petab.Problem attribute, YAML key of its files, what its rows are needed for)
_NEEDED = (("measurement", "measurement_df", "measurement_files",
            "there is nothing to fit"),
           ("condition", "condition_df", "condition_files",
            "it must define every simulationConditionId of the measurement table"),
           ("observable", "observable_df", "observable_files",
            "it must define every observableId of the measurement table"),
           ("parameter", "parameter_df", "parameter_file",
            "it lists the parameters to estimate"))


def _table_files(config: dict) -> dict[str, list[str]]:
    """The files of each table a PEtab YAML names (several are concatenated)."""
    def listed(v):
        return [] if v is None else [v] if isinstance(v, str) else list(v)

    files = {table: [] for table, *_ in _NEEDED}
    for table, _, key, _ in _NEEDED:
        for sub in [config] + list(config.get("problems") or []):
            files[table] += listed(sub.get(key))
    return files


def _check_files(path: Path, files: dict[str, list[str]]) -> None:
    """A ``ValueError`` naming a table file that is empty (not even a header row), which
    pandas would report without naming the file."""
    for table, names in files.items():
        for name in names:
            f = path.parent / name
            if not f.is_file():
                continue
            with open(f, "rb") as fh:
                blank = not fh.read(1 << 16).strip()
            if blank:
                raise ValueError(f"{path}: the {table} table {name} is empty (not even its "
                                 "header row)")


def check_tables(problem, path=None, files: dict[str, list[str]] | None = None) -> None:
    """A ``ValueError`` naming every table (and its files, where known) that is missing or
    has no rows: each is needed (`_NEEDED` says why), and an empty one would otherwise fail
    later with an error that does not say so."""
    bad = []
    for table, attr, _, why in _NEEDED:
        df = getattr(problem, attr, None)
        if df is None or len(df) == 0:
            names = (files or {}).get(table)
            named = f" ({', '.join(names)})" if names else ""
            state = "is missing" if df is None else "has no rows"
            bad.append(f"the {table} table{named} {state}: {why}")
    if bad:
        raise ValueError(("" if path is None else f"{path}: ") + "; ".join(bad))


def _read_yaml(path: Path) -> dict:
    """The problem's YAML as a dict; a ``ValueError`` naming ``path`` where the file is not
    a PEtab problem's YAML (a table, a text file: petab would fail on it without saying
    so)."""
    if not path.exists():
        raise FileNotFoundError(f"models.load_petab: `path` {path} does not exist")

    def refuse(what: str):
        hint = (" (a .tsv file is one of the problem's tables; pass the YAML file that names "
                "them)" if path.suffix.lower() == ".tsv" else "")
        return ValueError(f"models.load_petab: `path` must be a PEtab problem's YAML file "
                          f"(or a folder holding one); {path} {what}{hint}")

    try:
        config = petab.yaml.load_yaml(str(path))
    except UnicodeDecodeError:
        raise refuse("is not a text file") from None
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()
        raise refuse(f"is not YAML ({first[1] if len(first) > 1 else first[0]})") from None
    if not isinstance(config, dict):
        raise refuse(f"reads as a {type(config).__name__}, not a mapping of the problem's "
                     "files")
    if "problems" not in config:
        raise refuse("has no `problems` entry (a PEtab YAML file has `format_version`, "
                     "`parameter_file` and `problems`)")
    return config


def read_problem(path, *, lint: bool = True) -> tuple[petab.Problem, SbmlOdes]:
    """The PEtab problem at ``path`` and its SBML model as ODEs (`load_petab`'s ``path``
    and ``lint``; its errors are this function's)."""
    path = Path(path)
    shipped = Path(__file__).parent.parent / "data" / "petab" / path.name
    if not path.exists() and len(path.parts) == 1 and shipped.is_dir():
        path = shipped
    if path.is_dir():
        yamls = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml"))
        named = [y for y in yamls if y.stem == path.name]
        if len(named) == 1:
            yamls = named
        if len(yamls) != 1:
            raise ValueError(f"{path}: expected one PEtab YAML file (or one named after the "
                             f"folder), found {[y.name for y in yamls]}")
        path = yamls[0]
    config = _read_yaml(path)
    for sub in config.get("problems", []):
        vis = sub.get("visualization_files") or []
        missing = [v for v in vis if not (path.parent / v).exists()]
        if missing:
            warnings.warn(f"{path}: visualization files {missing} are missing; loading "
                          "without them (they do not enter the likelihood)", stacklevel=3)
            sub["visualization_files"] = [v for v in vis if v not in missing]
    files = _table_files(config)
    _check_files(path, files)
    problem = petab.Problem.from_yaml(config, base_path=str(path.parent))
    check_tables(problem, path, files)
    if lint:
        _lint(problem, path)
    _warn_unused_columns(problem, path)
    if problem.model is None or not hasattr(problem.model, "sbml_document"):
        raise NotImplementedError(f"{path}: only SBML models are supported")
    return problem, read_sbml(problem.model.sbml_document)
