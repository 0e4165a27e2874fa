"""The backend rules: what a correct wiring of the patched `flashinfer_mla_backend.py` is.

    python -m glmserve.preflight --rules-only FILE     # these rules alone, on one file

The lock's hashes guarantee the shipped series; these rules are what must refuse a wrong NEW
series (a port to another SGLang version). They are stated on data flow, found by running every
path of the file symbolically (flow.py) in each configuration the switches (glmserve.switches)
allow: the series on with native FP8 decode (FP8_ATTENTION native, the patched module's
default), the series on with gather-then-cast decode (gather, or a model/GPU native rules out),
and the series off (FP8_GATHER 0).

  kv-source        the KV each `<wrapper>.run(...)` on a forward path reads is the gather's
                   output for THAT wrapper's own index buffer, converted from the same pool the
                   upstream cast converts (or, where upstream converts a per-step KV buffer of
                   only the step's rows, e.g. decode context parallelism's, that same cast);
  plan-rows        every plan site (method `.plan(...)`, an alias of it, or a plain-function
                   plan such as `fast_mla_decode_plan(wrapper, ...)`) is preceded, on every path
                   that reaches it, by `note_rows` of the very indptr value the plan uses,
                   unmodified since (on CUDA-graph replay that is the host indptr);
  no-full-cast     with the series on, no path of forward_decode/forward_extend (or anything
                   they call in this file) casts a KV-pool tensor, whole or sliced;
  switch-polarity  with a switch off its object (None then) is never touched, and with the series
                   off every `run()` reads the upstream cast: each switch selects what it says;
  native-decode    the native kernel reads the raw pool through the step's wrapper's own indices
                   and the kv_indptr recorded when that wrapper was planned (`note_plan` after the
                   plan, of the device indptr whose row count was noted for it); once any plan
                   is recorded, every plan is (decode's and speculative batches'); the native
                   kernel is reachable;
  structure        what the rules need to find at all (the import, the class, a plan site).

The report also says which FlashInfer MLA backends the wrappers may plan with, the series on
(`BatchMLAPagedAttentionWrapper(..., backend=...)`): a constant names itself, the gather object's
`wrapper_backend` the ones its module allows (WRAPPER_BACKENDS), anything else "auto". The
preflight's FlashInfer check (fichecks.py) then only holds those backends to reading the
gathered indices.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

from glmserve import switches
from glmserve.preflight.flow import (
    GATHER,
    MLA_WRAPPER,
    NATIVE,
    AnalysisLimit,
    Event,
    Interpreter,
    Module,
    Path,
    Value,
    alternatives,
    render,
    strip_views,
)

GATHER_MODULE = "sglang.srt.layers.attention.fp8_kv_gather"
NATIVE_MODULE = "sglang.srt.layers.attention.fp8_mla_decode"
ENV_SWITCH = switches.FP8_GATHER.name
ENV_MODE = switches.FP8_ATTENTION.name
FORWARD_METHODS = ("forward_decode", "forward_extend")
# run(q_nope, q_pe, ckv_cache, kpe_cache, ...) in every FlashInfer release we know;
# newer ones also take kv_cache=(ckv, kpe) or a packed tensor.
RUN_KV_POSITIONS = (2, 3)
RUN_KV_KEYWORDS = ("ckv_cache", "kpe_cache", "kv_cache")

KV_SOURCE = "kv-source"
PLAN_ROWS = "plan-rows"
NO_FULL_CAST = "no-full-cast"
SWITCH = "switch-polarity"
NATIVE_RULE = "native-decode"
STRUCTURE = "structure"
# What `<gather object>.wrapper_backend` may be (fp8_kv_gather.WRAPPER_BACKENDS, SGLang 0.5.23+).
GATHER_WRAPPER_BACKENDS = frozenset({"fa2", "fa3"})


@dataclass(frozen=True)
class Config:
    name: str
    modes: dict[str, bool]
    env: dict[str, str]

    def __hash__(self) -> int:
        return hash(self.name)


def _env(gather: str, mode: str) -> dict[str, str]:
    return {**switches.FP8_GATHER.setting(gather), **switches.FP8_ATTENTION.setting(mode)}


NATIVE_ON = Config(
    "native", {GATHER: True, NATIVE: True}, _env(switches.GATHER_ON, switches.NATIVE)
)
GATHER_ON = Config(
    "gather", {GATHER: True, NATIVE: False}, _env(switches.GATHER_ON, switches.GATHER)
)
SERIES_OFF = Config(
    "off", {GATHER: False, NATIVE: False}, _env(switches.GATHER_OFF, switches.NATIVE)
)
SWITCH_TEXT = {
    GATHER: f"{ENV_SWITCH}=0 makes the gather object None",
    NATIVE: f"{ENV_MODE}=gather (or {ENV_SWITCH}=0) makes the native decode object None",
}


@dataclass(frozen=True, order=True)
class Problem:
    line: int
    rule: str
    text: str

    def render(self, filename: str) -> str:
        where = f"{filename}:{self.line}" if self.line else filename
        return f"{where}: [{self.rule}] {self.text}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    # Wrapper attributes the patched path reads as the indices run() uses (FlashInfer check).
    wrapper_attrs: set[str] = field(default_factory=set)
    plan_sites: set[int] = field(default_factory=set)
    run_sites: set[int] = field(default_factory=set)
    native_sites: set[int] = field(default_factory=set)
    # FlashInfer MLA backends the wrappers may plan with, the series on ("auto": any).
    wrapper_backends: set[str] = field(default_factory=set)

    def add(self, line: int, rule: str, text: str) -> None:
        problem = Problem(line, rule, text)
        if problem not in self.problems:
            self.problems.append(problem)


def backend_classes(
    tree: ast.Module, forward_methods: tuple[str, ...]
) -> tuple[Module, Report, list[tuple[str, dict[str, ast.FunctionDef]]]]:
    """The parsed backend module, a report holding its structural problems (the gather not
    imported, no class with both forward methods), and each class that defines both."""
    module = Module(tree, GATHER_MODULE, NATIVE_MODULE)
    report = Report()
    if not module.gather_names:
        report.add(0, STRUCTURE, f"does not import {GATHER_MODULE}: the gather is not wired in")
    entries = [
        (cls, methods)
        for cls, methods in module.methods.items()
        if all(name in methods for name in forward_methods)
    ]
    if not entries:
        report.add(0, STRUCTURE, f"no class defines {' and '.join(forward_methods)}")
    return module, report, entries


def check_backend(tree: ast.Module) -> Report:
    """Run every rule on a parsed `flashinfer_mla_backend.py`."""
    module, report, entries = backend_classes(tree, FORWARD_METHODS)
    on_configs = [NATIVE_ON, GATHER_ON] if module.native_names else [GATHER_ON]
    try:
        recorded = _check_plans(module, on_configs, report)
        for cls, methods in entries:
            for name in FORWARD_METHODS:
                _check_forward(module, cls, methods[name], on_configs, report)
        if module.native_names and not report.native_sites:
            report.add(
                0,
                NATIVE_RULE,
                f"the backend imports {NATIVE_MODULE} but no forward path reaches its kernel "
                f"with {ENV_MODE}=native",
            )
        _wrapper_backends(module, on_configs[0], report)
        if report.native_sites and not recorded:
            report.add(
                min(report.native_sites),
                NATIVE_RULE,
                "no plan is ever recorded for native decode (note_plan): the kernel never "
                "gets a planned kv_indptr, so decode silently stays on the gather",
            )
    except AnalysisLimit as exc:
        report.add(0, STRUCTURE, f"cannot analyse the file: {exc}")
    report.problems.sort()
    return report


def _paths(module: Module, cls: str | None, fn: ast.FunctionDef, config: Config, inline: bool):
    interp = Interpreter(module, modes=config.modes, env=config.env, inline=inline)
    return [path for path, _ in interp.run_function(cls, fn).returns]


def _events(paths: Iterable[Path], kind: str) -> list[Event]:
    return [e for p in paths for e in p.events if e.kind == kind]


def _run_kv_args(ev: Event) -> list[Value]:
    args, kwargs = ev.data["args"], ev.data["kwargs"]
    found = [args[i] for i in RUN_KV_POSITIONS if len(args) > i]
    found += [kwargs[k] for k in RUN_KV_KEYWORDS if k in kwargs]
    # kv_cache=(ckv, kpe): check each half.
    return [x for v in found for x in (v[1] if v[0] == "seq" else (v,))]


def _off_calls(paths: Iterable[Path], config: Config, report: Report) -> None:
    for ev in _events(paths, "off_call"):
        report.add(
            ev.line,
            SWITCH,
            f"{ev.where} calls {ev.data['method']}() on a switch object although "
            f"{SWITCH_TEXT[ev.data['switch']]}",
        )


def _check_forward(
    module: Module, cls: str, fn: ast.FunctionDef, on_configs: list[Config], report: Report
) -> None:
    entry = fn.name
    off_paths = _paths(module, cls, fn, SERIES_OFF, inline=True)
    _off_calls(off_paths, SERIES_OFF, report)
    upstream_pools: dict[int, set[Value]] = {}
    upstream_steps: dict[int, set[Value]] = {}
    for ev in _events(off_paths, "run"):
        report.run_sites.add(ev.line)
        for kv in _run_kv_args(ev):
            for alt in alternatives(kv, ev.data["facts"]):
                src = strip_views(alt)
                if src[0] == "cast":
                    upstream_pools.setdefault(ev.line, set()).add(strip_views(src[1]))
                elif src[0] == "stepcast":
                    upstream_steps.setdefault(ev.line, set()).add(src[1])
                else:
                    report.add(
                        ev.line,
                        SWITCH,
                        f"{entry}: with {ENV_SWITCH}=0, {ev.data['text']}() reads "
                        f"{render(src)} instead of the upstream cast of the pool",
                    )
    all_upstream = set().union(*upstream_pools.values()) if upstream_pools else set()

    reached = False
    for config in on_configs:
        on_paths = _paths(module, cls, fn, config, inline=True)
        _off_calls(on_paths, config, report)
        for ev in _events(on_paths, "cast"):
            via = "" if ev.where.endswith(f".{entry}") else f" (via {ev.where})"
            report.add(
                ev.line,
                NO_FULL_CAST,
                f"{entry}{via} casts the KV pool {render(ev.data['source'])} with the series on: "
                "every step would convert the whole pool again",
            )
        run_wrappers = set()
        for ev in _events(on_paths, "run"):
            report.run_sites.add(ev.line)
            wrapper = ev.data["wrapper"]
            run_wrappers.add(wrapper)
            kvs = _run_kv_args(ev)
            if not kvs:
                report.add(ev.line, KV_SOURCE, f"{entry}: cannot find the KV arguments of run()")
            for kv in kvs:
                for alt in alternatives(kv, ev.data["facts"]):
                    src = strip_views(alt)
                    if src[0] == "stepcast" and src[1] in upstream_steps.get(ev.line, ()):
                        continue  # upstream's own conversion of a step-sized buffer
                    _check_run_kv(entry, ev, wrapper, src, upstream_pools, report)
        natives = _events(on_paths, "native")
        for ev in natives:
            report.native_sites.add(ev.line)
            _check_native(entry, ev, run_wrappers, all_upstream, report)
        reached = reached or bool(natives or _events(on_paths, "gather"))
    if not reached:
        report.add(fn.lineno, KV_SOURCE, f"{entry} never calls the fp8 gather")


def _check_run_kv(
    entry: str,
    ev: Event,
    wrapper: Value,
    src: Value,
    upstream_pools: dict[int, set[Value]],
    report: Report,
) -> None:
    who = f"{entry}: {ev.data['text']}()"
    if src[0] == "gather":
        pool, idx = strip_views(src[1]), src[2]
        if idx[0] == "attr" and idx[1] == wrapper:
            report.wrapper_attrs.add(idx[2])
        else:
            report.add(
                ev.line,
                KV_SOURCE,
                f"{who} reads KV gathered at {render(idx)}, not at the index buffer of the "
                f"wrapper it runs ({render(wrapper)})",
            )
        upstream = upstream_pools.get(ev.line)
        if upstream and pool not in upstream:
            report.add(
                ev.line,
                KV_SOURCE,
                f"{who} reads KV gathered from {render(pool)}, but upstream converts "
                f"{' / '.join(sorted(render(u) for u in upstream))}",
            )
    elif src[0] == "cast":
        report.add(
            ev.line, KV_SOURCE, f"{who} reads a full-pool cast instead of the gather's output"
        )
    else:
        report.add(
            ev.line,
            KV_SOURCE,
            f"{who} reads {render(src)}, which is not the gather's output for this wrapper",
        )


def _check_native(
    entry: str, ev: Event, run_wrappers: set[Value], upstream: set[Value], report: Report
) -> None:
    args = ev.data["args"]
    missing = [k for k in ("kv_pool", "kv_indptr", "kv_indices") if k not in args]
    if missing:
        report.add(
            ev.line, NATIVE_RULE, f"{entry}: the native kernel call lacks {', '.join(missing)}"
        )
        return
    facts = ev.data["facts"]
    for alt in alternatives(args["kv_pool"], facts):
        pool = strip_views(alt)
        if pool[0] != "pool":
            report.add(
                ev.line,
                NATIVE_RULE,
                f"{entry}: the native kernel reads {render(pool)}, not the raw FP8 pool",
            )
        elif upstream and pool not in upstream:
            report.add(
                ev.line,
                NATIVE_RULE,
                f"{entry}: the native kernel reads {render(pool)}, but upstream converts "
                f"{' / '.join(sorted(render(u) for u in upstream))}",
            )
    planned_by = set()
    for indptr in alternatives(args["kv_indptr"], facts):
        if indptr[0] == "unpack" and indptr[1][0] == "planned" and indptr[2] == 0:
            planned_by.add(indptr[1][1])
        else:
            report.add(
                ev.line,
                NATIVE_RULE,
                f"{entry}: the native kernel's kv_indptr is {render(indptr)}, not the kv_indptr "
                "recorded when the wrapper was planned (note_plan / planned)",
            )
    for idx in alternatives(args["kv_indices"], facts):
        owner = idx[1] if idx[0] == "attr" else None
        if owner is None or (planned_by and owner not in planned_by):
            report.add(
                ev.line,
                NATIVE_RULE,
                f"{entry}: the native kernel's kv_indices is {render(idx)}, not the index "
                "buffer of the wrapper whose plan gave its kv_indptr",
            )
            continue
        report.wrapper_attrs.add(idx[2])
        if run_wrappers and owner not in run_wrappers:
            report.add(
                ev.line,
                NATIVE_RULE,
                f"{entry}: the native kernel reads the plan of {render(owner)}, but the step's "
                f"run() uses {' / '.join(sorted(render(w) for w in run_wrappers))}",
            )


def _wrapper_backends(module: Module, config: Config, report: Report) -> None:
    """Which backends each MLA wrapper construction may name, with its helpers inlined."""
    builders = [
        (cls, fn)
        for cls, fn in module.function_items()
        if any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == MLA_WRAPPER
            for n in ast.walk(fn)
        )
    ]
    for cls, fn in builders:
        for ev in _events(_paths(module, cls, fn, config, inline=True), "wrapper"):
            for alt in alternatives(ev.data["backend"], ev.data["facts"]):
                if alt[0] == "c" and isinstance(alt[1], str):
                    report.wrapper_backends.add(alt[1])
                elif (
                    alt[0] == "attr"
                    and alt[2] == "wrapper_backend"
                    and (
                        module.switch_attrs.get(alt[1][2]) == GATHER
                        if alt[1][0] == "attr"
                        else False
                    )
                ):
                    report.wrapper_backends |= GATHER_WRAPPER_BACKENDS
                else:
                    report.wrapper_backends.add("auto")


def _resolve(v: Value, facts: dict[Value, bool]) -> Value:
    """A noted value as this path decided it; an undecided conditional stays itself."""
    while v[0] == "ifexp" and v[1] in facts:
        v = v[2] if facts[v[1]] else v[3]
    return v


def _check_plans(module: Module, on_configs: list[Config], report: Report) -> bool:
    """plan-rows, and the native plan records; True when any plan is recorded for native."""
    # (line, indptr) -> the failing paths' conditions: one problem per plan site and value.
    misses: dict[tuple[int, Value], list[tuple[Event, str]]] = {}
    planning: list[list[Path]] = []  # per function, its paths with the native mode on
    for cls, fn in module.function_items():
        if cls is None and fn.name in module.plan_impls:
            continue  # the plan implementation itself; its callers are the plan sites
        for config in [SERIES_OFF, *on_configs]:
            paths = _paths(module, cls, fn, config, inline=False)
            _off_calls(paths, config, report)
            if config is on_configs[0]:
                planning.append(paths)
    # Once any plan is recorded for the native kernel, every plan anywhere must be: a wrapper
    # planned without a record would keep whatever an earlier plan of it recorded (decode and
    # speculative batches are recorded by different functions, and either could be lost).
    recorded = any(_events(paths, "native_note") for paths in planning)
    for paths in planning:
        for path in paths:
            _check_path_plans(path, misses, report, must_record=recorded)
    for (line, want), failed in sorted(misses.items(), key=lambda kv: kv[0][0]):
        ev, why = min(failed, key=lambda f: len(f[0].data["fact_text"]))
        cond = " and ".join(ev.data["fact_text"].values())
        more = f" (and {len(failed) - 1} more paths)" if len(failed) > 1 else ""
        report.add(
            line,
            PLAN_ROWS,
            f"{ev.where}: {ev.data['text']}() plans with kv_indptr {render(want)}, but {why}"
            + (f" on the path where {cond}" if cond else "")
            + more,
        )
    if not report.plan_sites:
        report.add(0, STRUCTURE, "no FlashInfer plan call found: this backend is not understood")
    return recorded


def _check_path_plans(
    path: Path,
    misses: dict[tuple[int, Value], list[tuple[Event, str]]],
    report: Report,
    must_record: bool,
) -> None:
    notes: list[Event] = []
    # wrapper -> (the plan event, the device indptr values whose row count was noted for it)
    planned: dict[Value, tuple[Event, list[Value]]] = {}
    unrecorded: dict[Value, Event] = {}
    for ev in path.events:
        if ev.kind == "note":
            notes.append(ev)
        elif ev.kind == "plan":
            report.plan_sites.add(ev.line)
            for want, why in _uncovered(ev, notes):
                misses.setdefault((ev.line, want), []).append((ev, why))
            facts = ev.data["facts"]
            wrapper = _resolve(ev.data["wrapper"], facts)
            device = [_resolve(n.data["args"][0], facts) for n in notes if n.data["args"]]
            planned[wrapper] = (ev, device)
            unrecorded[wrapper] = ev
        elif ev.kind == "native_note":
            _check_record(ev, planned, report)
            unrecorded.pop(_resolve(ev.data["wrapper"], ev.data["facts"]), None)
    if must_record:
        cond = " and ".join(path.fact_text.values())
        for ev in unrecorded.values():
            report.add(
                ev.line,
                NATIVE_RULE,
                f"{ev.where}: {ev.data['text']}() plans a wrapper that is not recorded for "
                "native decode (note_plan) after it"
                + (f" on the path where {cond}" if cond else ""),
            )


def _check_record(ev: Event, planned: dict[Value, tuple[Event, list[Value]]], report: Report):
    """note_plan(wrapper, kv_indptr, ...) must follow that wrapper's plan and record the device
    kv_indptr whose row count was noted for it (or None: not a native-decode batch)."""
    facts = ev.data["facts"]
    wrapper = _resolve(ev.data["wrapper"], facts)
    if wrapper not in planned:
        report.add(
            ev.line,
            NATIVE_RULE,
            f"{ev.where} records a plan of {render(wrapper)} for native decode, but no plan of "
            "that wrapper precedes it",
        )
        return
    _, device = planned[wrapper]
    for indptr in alternatives(_resolve(ev.data["indptr"], facts), facts):
        if indptr != ("c", None) and indptr not in device:
            report.add(
                ev.line,
                NATIVE_RULE,
                f"{ev.where} records kv_indptr {render(indptr)} for native decode, not the "
                "device indptr whose row count was noted for the plan "
                f"({' / '.join(render(d) for d in device) or 'none'})",
            )


def _uncovered(plan: Event, notes: list[Event]) -> list[tuple[Value, str]]:
    """The indptr values this plan may use whose row count no earlier note recorded as is."""
    facts = plan.data["facts"]
    versions = plan.data["versions"]
    out = []
    for want in alternatives(plan.data["indptr"], facts):
        root = strip_views(want)
        same = [
            note for note in notes if any(_resolve(arg, facts) == want for arg in note.data["args"])
        ]
        if any(n.data["versions"].get(root, 0) == versions.get(root, 0) for n in same):
            continue
        out.append(
            (
                want,
                "it was written after its row count was noted"
                if same
                else "its row count is not noted (note_rows) before the plan",
            )
        )
    return out
