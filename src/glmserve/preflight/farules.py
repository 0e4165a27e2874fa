"""The rules for the patched `flashattention_backend.py`: SGLang's fa3 absorbed-MLA path (the
default MLA backend on SM90) without the full-pool cast.

    python -m glmserve.preflight --rules-only FILE           # picks these rules for this file

FlashAttention reads paged KV through `flash_attn_with_kvcache(..., k_cache=, v_cache=,
page_table=, cache_seqlens=)`: no plan, no wrapper. Upstream feeds its absorbed-MLA calls views of
`get_key_buffer(layer_id).to(q.dtype)`, the whole pool converted per layer and step. The series
feeds them views of `fp8_gather.cast_pages(pool, page_table, cache_seqlens, page_size, dtype)`:
only the pages that call's table maps. Stated on data flow (flow.py), with the series on
(GLMSERVE_FP8_GATHER=1) and off (=0):

  kv-source        every absorbed-MLA FlashAttention call (its KV comes from the latent pool,
                   `get_key_buffer`) reads, with the series on, the gather of the pool upstream
                   converts, through THAT call's own page_table and cache_seqlens (or through
                   every column of its table, cache_seqlens None);
  no-full-cast     with the series on, no path of forward_extend/forward_decode (or anything they
                   call in this file) casts a KV-pool tensor, whole or sliced;
  switch-polarity  with the series off, the gather object (None then) is never touched and every
                   absorbed-MLA call reads the upstream cast;
  structure        the import, the class, and at least one call whose KV upstream converts.

These forward methods have far more paths than the flashinfer backend's (thousands of branch
combinations over CP, SWA, local attention, cascade, FA3/FA4), so they are analysed with paths
joined after every statement (flow.Interpreter's join): a value is the set of everything it may be
there, and a check passes only if it holds for that whole set. What joining cannot tell apart is
which alternative of one value goes with which of another on the same path; the table and the
lengths a gather uses are each checked against the call's own.
"""

from __future__ import annotations

import ast

from glmserve.preflight.flow import (
    NATIVE,
    AnalysisLimit,
    Event,
    Interpreter,
    Module,
    Value,
    alternatives,
    render,
    strip_views,
)
from glmserve.preflight.rules import (
    ENV_SWITCH,
    GATHER_ON,
    KV_SOURCE,
    NO_FULL_CAST,
    SERIES_OFF,
    STRUCTURE,
    SWITCH,
    Config,
    Report,
    backend_classes,
)

FORWARD_METHODS = ("forward_extend", "forward_decode")
# flash_attn_with_kvcache(q, k_cache, v_cache, ...): positions and keywords of the paged KV.
FA_KV = (("k_cache", 1), ("v_cache", 2))
FA_TABLE = "page_table"
FA_LENS = "cache_seqlens"


def is_flashattention_backend(tree: ast.Module) -> bool:
    """Whether these rules (not the flashinfer backend's) are the ones for this file: it calls
    FlashAttention's paged kernel and plans no FlashInfer wrapper."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    fa = any(isinstance(c.func, ast.Name) and c.func.id == "flash_attn_with_kvcache" for c in calls)
    plans = any(isinstance(c.func, ast.Attribute) and c.func.attr == "plan" for c in calls)
    return fa and not plans


def check_flashattention_backend(tree: ast.Module) -> Report:
    """Run every rule on a parsed `flashattention_backend.py`."""
    module, report, entries = backend_classes(tree, FORWARD_METHODS)
    try:
        for cls, methods in entries:
            for name in FORWARD_METHODS:
                _check_forward(module, cls, methods[name], report)
    except AnalysisLimit as exc:
        report.add(0, STRUCTURE, f"cannot analyse the file: {exc}")
    if entries and not report.run_sites:
        report.add(
            0,
            STRUCTURE,
            "no flash_attn_with_kvcache call reads the latent KV pool (get_key_buffer): the "
            "absorbed-MLA path is not understood",
        )
    report.problems.sort()
    return report


def _events(module: Module, cls: str, fn: ast.FunctionDef, config: Config) -> list[Event]:
    modes = {**config.modes, NATIVE: False}
    interp = Interpreter(module, modes=modes, env=config.env, inline=True, join=True)
    return [e for path, _ in interp.run_function(cls, fn).returns for e in path.events]


def _kv_args(ev: Event) -> list[Value]:
    args, kwargs = ev.data["args"], ev.data["kwargs"]
    return [kwargs[k] if k in kwargs else args[i] for k, i in FA_KV if k in kwargs or len(args) > i]


def _off_calls(events: list[Event], report: Report) -> None:
    for ev in events:
        if ev.kind == "off_call":
            report.add(
                ev.line,
                SWITCH,
                f"{ev.where} calls {ev.data['method']}() on a switch object although "
                f"{ENV_SWITCH}=0 makes the gather object None",
            )


def _latent(src: Value) -> bool:
    """Whether a KV value comes from `get_key_buffer`: the latent pool the absorbed-MLA calls
    read (the MHA calls read `get_kv_buffer`'s K and V, FP8 included, through descales)."""
    base = strip_views(src)
    if base[0] in ("cast", "gather"):
        base = strip_views(base[1])
    return base[0] == "pool" and base[2] == "get_key_buffer"


def _kv_sources(ev: Event) -> list[Value]:
    return [strip_views(a) for kv in _kv_args(ev) for a in alternatives(kv, ev.data["facts"])]


def _check_forward(module: Module, cls: str, fn: ast.FunctionDef, report: Report) -> None:
    entry = fn.name
    off = _events(module, cls, fn, SERIES_OFF)
    _off_calls(off, report)
    upstream: dict[int, set[Value]] = {}  # MLA call line -> the pools upstream converts for it
    for ev in off:
        sources = _kv_sources(ev) if ev.kind == "fa" else []
        if not any(_latent(src) for src in sources):
            continue
        report.run_sites.add(ev.line)
        for src in sources:
            if src[0] == "cast":
                upstream.setdefault(ev.line, set()).add(strip_views(src[1]))
            else:
                report.add(
                    ev.line,
                    SWITCH,
                    f"{entry}: with {ENV_SWITCH}=0, flash_attn_with_kvcache() reads "
                    f"{render(src)} instead of the upstream cast of the pool",
                )
    on = _events(module, cls, fn, GATHER_ON)
    _off_calls(on, report)
    mla_calls = False
    for ev in on:
        if ev.kind == "cast":
            via = "" if ev.where.endswith(f".{entry}") else f" (via {ev.where})"
            report.add(
                ev.line,
                NO_FULL_CAST,
                f"{entry}{via} casts the KV pool {render(ev.data['source'])} with the series on: "
                "every step would convert the whole pool again",
            )
        elif ev.kind == "fa":
            sources = _kv_sources(ev)
            if not (any(_latent(src) for src in sources) or ev.line in upstream):
                continue
            mla_calls = True
            report.run_sites.add(ev.line)
            for src in sources:
                _check_kv(entry, ev, src, upstream.get(ev.line, set()), report)
    if (mla_calls or upstream) and not any(ev.kind == "gather" for ev in on):
        report.add(fn.lineno, KV_SOURCE, f"{entry} never calls the fp8 gather")


def _check_kv(entry: str, ev: Event, src: Value, pools: set[Value], report: Report) -> None:
    who = f"{entry}: flash_attn_with_kvcache()"
    if src[0] == "cast":
        report.add(
            ev.line, KV_SOURCE, f"{who} reads a full-pool cast instead of the gather's output"
        )
        return
    if src[0] != "gather" or len(src) < 4:
        report.add(
            ev.line,
            KV_SOURCE,
            f"{who} reads {render(src)}, which is not the paged gather (cast_pages) of the pool",
        )
        return
    facts = ev.data["facts"]
    kwargs = ev.data["kwargs"]
    pool, table, lens = strip_views(src[1]), src[2], src[3]
    if pools and pool not in pools:
        report.add(
            ev.line,
            KV_SOURCE,
            f"{who} reads KV gathered from {render(pool)}, but upstream converts "
            f"{' / '.join(sorted(render(u) for u in pools))}",
        )
    own_table = set(alternatives(kwargs[FA_TABLE], facts)) if FA_TABLE in kwargs else set()
    if not set(alternatives(table, facts)) <= own_table:
        report.add(
            ev.line,
            KV_SOURCE,
            f"{who} reads KV gathered through the page table {render(table)}, not through its "
            f"own page_table ({render(kwargs[FA_TABLE]) if FA_TABLE in kwargs else 'none'})",
        )
    own_lens = set(alternatives(kwargs[FA_LENS], facts)) if FA_LENS in kwargs else set()
    wrong = [x for x in alternatives(lens, facts) if x != ("c", None) and x not in own_lens]
    if wrong:
        report.add(
            ev.line,
            KV_SOURCE,
            f"{who} reads KV gathered for the lengths {render(wrong[0])}, not for its own "
            f"cache_seqlens ({render(kwargs[FA_LENS]) if FA_LENS in kwargs else 'none'})",
        )
