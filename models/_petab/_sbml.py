"""An SBML model as SymPy right-hand sides: what becomes one JAX vector field ``f(t, y, p)``.

libSBML reads the file (and expands function definitions), sbmlmath turns each MathML
expression into SymPy. The state ``y`` holds every species (its amount when the species has
only substance units, its concentration otherwise, as its symbol means in SBML math) and every
parameter or compartment driven by a rate rule; ``p`` holds every other constant parameter and
compartment size. Assignment rules are substituted into every expression that uses them.
"""

from __future__ import annotations

import dataclasses
import warnings

import libsbml
import sbmlmath
import sympy as sp
from sbmlmath.csymbol import CSymbol, TimeSymbol

__all__ = ["SbmlOdes", "read_sbml", "TIME"]

TIME = sp.Symbol("__time__")
"""The symbol of model time in every expression this module returns."""

_MAX_RULE_DEPTH = 100


@dataclasses.dataclass
class SbmlOdes:
    """An SBML model reduced to ODEs, symbolically.

    Attributes:
        model_id: the SBML model's id.
        state_ids: ids of the state variables, in the order of ``y``.
        rhs: ``d(state)/dt`` for each state, SymPy in `TIME`, state and parameter symbols.
        init: each state's initial value, SymPy in parameter symbols (initial assignments,
            initial amounts or concentrations converted by their compartment's size).
        param_ids: ids of the constant parameters and compartment sizes, the order of ``p``.
        param_values: their values in the SBML file.
        rules: assignment-rule targets (and parameters set by initial assignments) mapped to
            expressions in state and parameter symbols, for observables that use them.
        species_ids: ids of the species (all of them are states).
        events: the targets of time-triggered events (boundary species, non-constant
            parameters) mapped to their value as a piecewise function of `TIME`, already in
            ``rhs``; `resolve` puts it in the expressions it returns.
    """

    model_id: str
    state_ids: list[str]
    rhs: list[sp.Expr]
    init: list[sp.Expr]
    param_ids: list[str]
    param_values: list[float]
    rules: dict[str, sp.Expr]
    species_ids: list[str]
    events: dict[str, sp.Expr] = dataclasses.field(default_factory=dict)

    def symbols(self) -> dict[str, sp.Symbol]:
        """Every id this model defines, mapped to its SymPy symbol."""
        return {i: sp.Symbol(i) for i in (*self.state_ids, *self.param_ids, *self.rules)}

    def resolve(self, expr: sp.Expr) -> sp.Expr:
        """``expr`` with assignment-rule targets replaced by their expressions (recursively)
        and the targets of events by their piecewise values."""
        expr = _substitute_rules(expr, {sp.Symbol(k): v for k, v in self.rules.items()})
        return expr.xreplace({sp.Symbol(k): v for k, v in self.events.items()})


def _substitute_rules(expr, rules: dict) -> sp.Expr:
    for _ in range(_MAX_RULE_DEPTH):
        if not (expr.free_symbols & rules.keys()):
            return expr
        expr = expr.xreplace(rules)
    raise ValueError("assignment rules refer to each other in a cycle")


def _math(element, what: str, eid: str) -> sp.Expr:
    """SBML math of ``element`` as SymPy, with plain symbols and `TIME` for model time."""
    if element.getMath() is None:
        raise ValueError(f"SBML {what} '{eid}' has no math")
    expr = sbmlmath.sbml_math_to_sympy(element, ignore_units=True, floats_as_rationals=False,
                                       evaluate=True)
    if not isinstance(expr, sp.Basic):
        expr = sp.sympify(expr)
    repl = {}
    for s in expr.free_symbols:
        if isinstance(s, TimeSymbol):
            repl[s] = TIME
        elif isinstance(s, CSymbol):
            raise NotImplementedError(
                f"SBML csymbol '{s}' (in {what} '{eid}') is not supported")
        else:
            repl[s] = sp.Symbol(str(s.name))
    for a in expr.atoms(sp.Function):
        if type(a).__name__.lower() in ("delay", "rateof"):
            raise NotImplementedError(f"SBML '{type(a).__name__}' (in {what} '{eid}') is not "
                                      "supported")
        if isinstance(a, sp.core.function.AppliedUndef):
            raise NotImplementedError(
                f"SBML function call '{a.func}' (in {what} '{eid}') could not be expanded")
    return expr.xreplace(repl)


def _document(source):
    """``(model, path)``: the SBML model of a file or document, function definitions
    expanded."""
    if isinstance(source, libsbml.SBMLDocument):
        doc, path = source, "SBML document"
    else:
        path = str(source)
        doc = libsbml.readSBMLFromFile(path)
    if doc.getNumErrors(libsbml.LIBSBML_SEV_ERROR) + doc.getNumErrors(libsbml.LIBSBML_SEV_FATAL):
        raise ValueError(f"libSBML could not read {path}: {doc.getErrorLog().toString()}")
    props = libsbml.ConversionProperties()
    props.addOption("expandFunctionDefinitions", True)
    if doc.convert(props) != libsbml.LIBSBML_OPERATION_SUCCESS:
        raise NotImplementedError(f"{path}: libSBML could not expand the function definitions")
    m = doc.getModel()
    if m is None:
        raise ValueError(f"{path} holds no SBML model")
    return m, path


def _rules(m):
    """``(rate rules, assignment rules, initial assignments)``: id -> SymPy expression."""
    rate_rules: dict[str, sp.Expr] = {}
    assign_rules: dict[str, sp.Expr] = {}
    for r in m.getListOfRules():
        if r.isAlgebraic():
            raise NotImplementedError(
                f"SBML algebraic rules are not supported (rule '{r.getId() or r.getMetaId()}')")
        var = r.getVariable()
        if r.isRate():
            rate_rules[var] = _math(r, "rate rule", var)
        else:
            assign_rules[var] = _math(r, "assignment rule", var)
    init_assign = {ia.getSymbol(): _math(ia, "initial assignment", ia.getSymbol())
                   for ia in m.getListOfInitialAssignments()}
    return rate_rules, assign_rules, init_assign


def _trigger_time(ev) -> sp.Expr:
    """The time at which a trigger ``time >= T`` (or ``>``, ``T <= time``, ...) becomes
    true, ``T`` an expression in parameters; ``NotImplementedError`` for any other
    trigger."""
    eid = ev.getId()
    if ev.getTrigger() is None:
        raise ValueError(f"SBML event '{eid}' has no trigger")
    cond = _math(ev.getTrigger(), "event trigger", eid)
    if not isinstance(cond, sp.core.relational.Relational) or TIME not in cond.free_symbols:
        raise NotImplementedError(
            f"SBML events whose trigger is not a comparison of time with a parameter "
            f"expression are not supported (event '{eid}', trigger {cond}): only "
            "time-triggered events are")
    d = sp.expand(cond.lhs - cond.rhs)
    a = d.diff(TIME)
    rest = sp.simplify(d - a * TIME)
    greater = isinstance(cond, (sp.GreaterThan, sp.StrictGreaterThan))
    less = isinstance(cond, (sp.LessThan, sp.StrictLessThan))
    if a == 0 or a.free_symbols or TIME in rest.free_symbols or not (greater or less) \
            or greater != bool(a > 0):
        raise NotImplementedError(
            f"SBML event '{eid}': trigger {cond} does not become true at one time as time "
            "increases (only 'time >= T' is supported)")
    return -rest / a


def _time_events(m, species_by_id, rate_rules, assign_rules, init_assign
                 ) -> dict[str, sp.Expr]:
    """Time-triggered events as piecewise functions of time: target id -> its value.

    An event ``time >= T_k`` that sets ``X = v_k`` (``v_k`` in parameters) where nothing
    else changes ``X`` (a boundary species, a non-constant parameter: no reaction, rule or
    other assignment) makes ``X`` at time ``t`` the value of the latest event fired by
    ``t``, or ``X``'s own value before the first: ``Piecewise((v_k, t >= T_k and every
    other T_m <= T_k or t < T_m), ..., (X, True))``, which needs no order of the ``T_k``
    (they may differ between conditions). Each switch then becomes a solver switch state
    (`models.PetabProblem`). Events that reset a state changed by reactions, use the
    state, are delayed or are triggered by the state raise ``NotImplementedError``."""
    by_target: dict[str, list] = {}
    params = {p.getId(): p for p in m.getListOfParameters()}
    for ev in m.getListOfEvents():
        eid = ev.getId()
        if ev.isSetDelay():
            raise NotImplementedError(f"SBML event delays are not supported (event '{eid}')")
        tau = _trigger_time(ev)
        for ea in ev.getListOfEventAssignments():
            x = ea.getVariable()
            sp_ = species_by_id.get(x)
            if sp_ is not None and not sp_.getBoundaryCondition():
                raise NotImplementedError(
                    f"SBML event '{eid}' assigns species '{x}', which reactions change: "
                    "state resets are not supported")
            if sp_ is None and x not in params:
                raise NotImplementedError(
                    f"SBML event '{eid}' assigns '{x}' (not a species or parameter): not "
                    "supported")
            if x in rate_rules or x in assign_rules:
                raise NotImplementedError(
                    f"SBML event '{eid}' assigns '{x}', which a rule also sets: not supported")
            value = _math(ea, "event assignment", eid)
            used = {str(s) for s in value.free_symbols}
            if TIME in value.free_symbols or used & set(species_by_id) or used & set(
                    rate_rules):
                raise NotImplementedError(
                    f"SBML event '{eid}': the value assigned to '{x}' depends on time or the "
                    "state; only values in parameters are supported")
            by_target.setdefault(x, []).append((tau, value))
    out = {}
    for x, evs in by_target.items():
        pieces = []
        for k, (tk, vk) in enumerate(evs):
            later = [sp.Or(TIME < tm, tm <= tk) for m_, (tm, _) in enumerate(evs) if m_ != k]
            pieces.append((vk, sp.And(TIME >= tk, *later)))
        out[x] = sp.Piecewise(*pieces, (sp.Symbol(x), True))
    return out


def _compartment_sizes(m, species, rate_rules, assign_rules, init_assign) -> dict:
    """Each compartment's size; one that holds species must be constant."""
    comp_size = {}
    for c in m.getListOfCompartments():
        comp_size[c.getId()] = c.getSize() if c.isSetSize() else 1.0
    comps_with_species = {s.getCompartment() for s in species}
    for cid in comp_size:
        if cid in comps_with_species and (cid in rate_rules or cid in assign_rules):
            raise NotImplementedError(
                f"SBML compartments of varying size that hold species are not supported "
                f"(compartment '{cid}')")
        if cid in init_assign and cid in comps_with_species:
            raise NotImplementedError(
                f"SBML initial assignments to compartments that hold species are not "
                f"supported (compartment '{cid}')")
    return comp_size


def _species_states(m, species, assign_rules, init_assign):
    """``(species ids, initial values)`` of the species that are states (those set by an
    assignment rule are not): initial amounts or concentrations converted by their
    compartment's size."""
    init: dict[str, sp.Expr] = {}
    species_ids = []
    for s in species:
        sid = s.getId()
        if sid in assign_rules:
            continue  # a function of other symbols, substituted where used
        if s.isSetConversionFactor() or m.isSetConversionFactor():
            raise NotImplementedError(
                f"SBML conversion factors are not supported (species '{sid}')")
        size = sp.Symbol(s.getCompartment())
        if s.isSetInitialAmount():
            v = sp.Float(s.getInitialAmount())
            v0 = v if s.getHasOnlySubstanceUnits() else v / size
        elif s.isSetInitialConcentration():
            v = sp.Float(s.getInitialConcentration())
            v0 = v * size if s.getHasOnlySubstanceUnits() else v
        else:
            v0 = sp.Float(0.0)
            if sid not in init_assign:
                warnings.warn(f"species '{sid}' has no initial value: taken as 0", stacklevel=4)
        init[sid] = init_assign.get(sid, v0)
        species_ids.append(sid)
    return species_ids, init


def _add_reactions(m, rhs, species_by_id, rate_rules, assign_rules, init_assign) -> None:
    """Add every reaction's rate to its species' ``rhs``: amounts per time; a
    concentration species changes by rate / compartment size."""
    for rx in m.getListOfReactions():
        rid = rx.getId()
        if rx.isSetFast() and rx.getFast():
            raise NotImplementedError(f"SBML fast reactions are not supported (reaction '{rid}')")
        kl = rx.getKineticLaw()
        if kl is None or kl.getMath() is None:
            raise ValueError(f"SBML reaction '{rid}' has no kinetic law")
        local = {sp.Symbol(lp.getId()): sp.Float(lp.getValue())
                 for lp in (list(kl.getListOfLocalParameters()) + list(kl.getListOfParameters()))}
        rate = _math(kl, "kinetic law of reaction", rid).xreplace(local)
        for refs, sign in ((rx.getListOfReactants(), -1), (rx.getListOfProducts(), 1)):
            for ref in refs:
                sid = ref.getSpecies()
                if ref.isSetStoichiometryMath():
                    raise NotImplementedError(
                        f"SBML stoichiometryMath is not supported (reaction '{rid}', species "
                        f"'{sid}')")
                if ref.isSetId() and (ref.getId() in assign_rules or ref.getId() in rate_rules
                                      or ref.getId() in init_assign):
                    raise NotImplementedError(
                        f"SBML variable stoichiometry is not supported (species reference "
                        f"'{ref.getId()}' in reaction '{rid}')")
                sp_ = species_by_id[sid]
                if sp_.getBoundaryCondition() or sp_.getConstant() or sid in assign_rules \
                        or sid in rate_rules:
                    continue
                stoich = ref.getStoichiometry() if ref.isSetStoichiometry() else 1.0
                term = sign * sp.Float(stoich) * rate
                if not sp_.getHasOnlySubstanceUnits():
                    term = term / sp.Symbol(sp_.getCompartment())
                rhs[sid] = rhs[sid] + term


def _constants(m, comp_size, state_ids, init, rate_rules, assign_rules, init_assign):
    """``(parameter ids, their values, rules)``: constant parameters and compartment sizes;
    those under a rate rule join ``state_ids``/``init``; those set by an initial assignment
    join the rules (their initial value holds throughout)."""
    param_ids: list[str] = []
    param_values: list[float] = []
    rules = dict(assign_rules)
    entries = [(p.getId(), p.getValue() if p.isSetValue() else None)
               for p in m.getListOfParameters()] + list(comp_size.items())
    n_params = m.getNumParameters()
    for i, (pid, value) in enumerate(entries):
        if pid in assign_rules:
            continue
        if pid in rate_rules:
            state_ids.append(pid)
            init[pid] = init_assign.get(pid, sp.Float(0.0 if value is None else value))
            continue
        if pid in init_assign:
            rules[pid] = init_assign[pid]  # constant: its initial value holds throughout
            continue
        param_ids.append(pid)
        param_values.append(float("nan") if value is None and i < n_params else value)
    return param_ids, param_values, rules


def read_sbml(source) -> SbmlOdes:
    """Read an SBML model into `SbmlOdes`.

    Args:
        source: a path to an SBML file, or a ``libsbml.SBMLDocument`` (which is modified:
            its function definitions are expanded in place).

    Raises:
        NotImplementedError: naming the construct and the element id for what this reader
            does not support (events other than time-triggered ones that set a boundary
            species or a non-constant parameter, algebraic rules, delays, fast reactions,
            variable compartments that hold species, stoichiometry math, ...).
        ValueError: when libSBML reports errors reading the file.
    """
    m, path = _document(source)
    mid = m.getId()
    for c in m.getListOfConstraints():
        warnings.warn(f"SBML constraint in model '{mid}' is not checked", stacklevel=3)
        break
    rate_rules, assign_rules, init_assign = _rules(m)
    species = list(m.getListOfSpecies())
    events = _time_events(m, {s.getId(): s for s in species}, rate_rules, assign_rules,
                          init_assign)
    comp_size = _compartment_sizes(m, species, rate_rules, assign_rules, init_assign)
    species_ids, init = _species_states(m, species, assign_rules, init_assign)
    state_ids = list(species_ids)
    rhs: dict[str, sp.Expr] = {sid: sp.Float(0.0) for sid in species_ids}
    _add_reactions(m, rhs, {s.getId(): s for s in species}, rate_rules, assign_rules,
                   init_assign)
    param_ids, param_values, rules = _constants(m, comp_size, state_ids, init, rate_rules,
                                                assign_rules, init_assign)
    for var, expr in rate_rules.items():
        if var not in state_ids:
            raise NotImplementedError(
                f"SBML rate rule on '{var}' (not a species, parameter or compartment) is not "
                "supported")
        rhs[var] = expr

    rule_syms = {sp.Symbol(k): v for k, v in rules.items()}
    event_syms = {sp.Symbol(k): v for k, v in events.items()}
    rhs_list = [_substitute_rules(rhs[s], rule_syms).xreplace(event_syms) for s in state_ids]
    # Initial values may use other states' initial values and rules evaluated at t = 0.
    init_syms = {sp.Symbol(s): init[s] for s in state_ids}
    both = {**rule_syms, **init_syms}
    init_list = [_substitute_rules(init[s], both).xreplace({TIME: sp.Float(0.0)})
                 for s in state_ids]
    known = set(state_ids) | set(param_ids) | set(rules)
    for s_id, e in zip(state_ids, rhs_list):
        unknown = {str(x) for x in e.free_symbols} - known - {str(TIME)}
        if unknown:
            raise ValueError(f"d{s_id}/dt uses undefined symbols {sorted(unknown)}")
    return SbmlOdes(mid, state_ids, rhs_list, init_list, param_ids, param_values, rules,
                    species_ids, events)
