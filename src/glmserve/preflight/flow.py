"""Path-sensitive symbolic execution of one Python file, for the backend rules (rules.py).

The rules ask data-flow questions of the patched `flashinfer_mla_backend.py`: which tensor a
`wrapper.run(...)` really reads, which indptr a plan really uses, and whether its row count was
recorded before it on every path. Names prove nothing (a wrong port can keep every name), so
this module walks every path through a function, binding each local to a symbolic value that
says where it came from, and records the calls that matter as events.

Symbolic values are nested tuples (hashable, so two expressions with the same provenance are
equal): ``("arg", "kv_indptr")`` is a parameter, ``("attr", base, "name")`` an attribute,
``("sub", base, index)`` a subscript, ``("call", func, args, kwargs)`` an opaque call result,
``("pool", ...)`` a `get_key_buffer(...)` result, ``("gather", pool, indices)`` the gather's
output, ``("cast", source)`` a dtype cast of a pool-derived tensor, ``("stepcast", source)`` one
of a per-step KV buffer (STEP_KV_BUFFERS), ``("ifexp", test, a, b)``
a conditional not yet decided, ``("phi", alternatives)`` the values an inlined call may return.

The environment switch is evaluated, not guessed: the analysis runs once with the gather on
and once with it off, and `if` tests on the gather object (or on the environment variable)
pick their branch. Other tests fork the path and remember the outcome, so a later test on the
same value (e.g. `init_metadata_replay`) follows the same branch. Loops run zero or one time.
Stdlib only: this runs inside the server image at start.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

Value = tuple

# The series' own API, as the rules know it (rules.py): the gather object's methods, and the
# native decode module's kernel and per-backend plan record.
GATHER = "gather"  # switch: the object from fp8_kv_gather's factory (None: the series switched off)
NATIVE = "native"  # switch: the object from fp8_mla_decode's factory (None: gather decode)
GATHER_CAST = "cast"
GATHER_PAGES = "cast_pages"  # cast_pages(pool, page_table, cache_seqlens, page_size, dtype)
GATHER_NOTE = "note_rows"
NATIVE_FUNCTION = "mla_decode_fp8"
NATIVE_PARAMS = ("q_nope", "q_pe", "kv_pool", "kv_indptr", "kv_indices", "sm_scale", "out")
NATIVE_NOTE = "note_plan"  # note_plan(wrapper, kv_indptr, sm_scale) after the wrapper's plan
NATIVE_PLANNED = "planned"  # planned(wrapper) -> (kv_indptr, sm_scale) or None
# KV pool methods returning one layer's whole buffer.
POOL_GETTERS = frozenset({"get_key_buffer", "get_kv_buffer"})
# Attributes holding a KV buffer built per step with only that step's rows (decode context
# parallelism's all-gathered KV, SGLang 0.5.17+): converting it costs what a gather costs, so
# upstream's cast of it stays (a "stepcast"), and the step's wrapper indexes it, not the pool.
STEP_KV_BUFFERS = frozenset({"dcp_kv_buffer"})
# Tensor methods that convert a whole tensor's dtype.
CAST_METHODS = frozenset({"to", "type", "type_as", "bfloat16", "half", "float", "double"})
# Tensor methods that return a view of the same storage (the data is unchanged).
VIEW_METHODS = frozenset(
    {"view", "reshape", "narrow", "select", "unflatten", "flatten", "squeeze", "unsqueeze",
     "permute", "transpose", "expand", "contiguous", "__getitem__"}
)  # fmt: skip
# Module-level functions returning a view of their first argument (SGLang 0.5.23's
# mem_cache/layout/paged_view.py: `[slots, ...]` as `[pages, page_size, ...]` by as_strided).
VIEW_FUNCTIONS = frozenset({"paged_view", "paged_row_view", "paged_kv_view"})
# FlashInfer's module-level plan ABI, called as `wrapper._cached_module.plan(...)`:
# (float_ws, int_ws, pinned_ws, qo_indptr_host, kv_indptr_host, kv_len_host, ...).
MODULE_PLAN_INDPTR = 4
# BatchMLAPagedAttentionWrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, ...).
WRAPPER_PLAN_INDPTR = 1
# FlashInfer's MLA wrapper class: its constructions are recorded as "wrapper" events (backend=).
MLA_WRAPPER = "BatchMLAPagedAttentionWrapper"
# FlashAttention's paged-KV entry point (flashattention_backend.py): recorded as "fa" events.
FA_KERNELS = frozenset({"flash_attn_with_kvcache"})
MAX_PATHS = 4096
MAX_INLINE_DEPTH = 6

# Event data that identifies an event (the rest is the path context it was recorded in).
_KEYED = (
    "pool", "indices", "lens", "source", "wrapper", "indptr", "args", "kwargs", "method", "switch",
    "backend",
)  # fmt: skip


class AnalysisLimit(Exception):
    """The function has more paths than MAX_PATHS: refuse rather than guess."""


@dataclass(frozen=True)
class Event:
    kind: str  # note | plan | run | gather | cast | native | off_call
    line: int
    where: str  # qualified name of the function the call is in
    data: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class Path:
    """One path through a function: bindings, what its tests assumed, what it did."""

    env: dict[str, Value]
    facts: dict[Value, bool]
    events: tuple[Event, ...] = ()
    versions: dict[Value, int] = field(default_factory=dict)
    heap: dict[tuple[Value, str], Value] = field(default_factory=dict)
    fact_text: dict[Value, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """Every finished path of a function (returned or fell off the end), with its value."""

    returns: list[tuple[Path, Value]]


_OP_TEXT = {
    "Add": "+", "Sub": "-", "Mult": "*", "Div": "/", "FloorDiv": "//", "Mod": "%",
    "USub": "-", "isnot": "is not", "notin": "not in", "BitAnd": "&", "BitOr": "|",
}  # fmt: skip


def render(v: Value) -> str:
    """A symbolic value as source-like text, for messages."""
    kind = v[0]
    if kind == "arg":
        return v[1]
    if kind == "g":
        return v[1]
    if kind == "c":
        return repr(v[1])
    if kind == "attr":
        return f"{render(v[1])}.{v[2]}"
    if kind == "sub":
        return f"{render(v[1])}[{render(v[2])}]"
    if kind == "slice":
        parts = ["" if p == ("c", None) else render(p) for p in v[1:]]
        return ":".join(parts[:2]) + (f":{parts[2]}" if parts[2] else "")
    if kind == "call":
        args = [render(a) for a in v[2]] + [f"{k}={render(a)}" for k, a in v[3]]
        return f"{render(v[1])}({', '.join(args)})"
    if kind == "pool":
        return f"{render(v[1])}.{v[2]}({', '.join(render(a) for a in v[3])})"
    if kind == "gather":
        return f"<gather of {render(v[1])} at {render(v[2])}>"
    if kind == "cast":
        return f"<cast of {render(v[1])}>"
    if kind == "stepcast":
        return f"<cast of the step buffer {render(v[1])}>"
    if kind == "planned":
        return f"<what {render(v[1])} was planned with>"
    if kind == "func":
        return v[2] if v[1] is None else f"{v[1]}.{v[2]}"
    if kind == "ifexp":
        return f"({render(v[2])} if {render(v[1])} else {render(v[3])})"
    if kind == "phi":
        return " | ".join(render(a) for a in v[1])
    if kind == "op":
        op = _OP_TEXT.get(v[1], v[1])
        if op == "not":
            return f"not {render(v[2])}"
        if len(v) == 3:
            return f"{op}{render(v[2])}"
        if len(v) == 4:
            return f"{render(v[2])} {op} {render(v[3])}"
        return f" {op} ".join(render(a) for a in v[2:])
    if kind == "unpack":
        return f"{render(v[1])}[{v[2]}]" if isinstance(v[2], int) else f"<item of {render(v[1])}>"
    if kind == "seq":
        return "(" + ", ".join(render(a) for a in v[1]) + ")"
    return kind


def strip_views(v: Value) -> Value:
    """The tensor a view (subscripts, reshapes) was taken of."""
    while True:
        if v[0] == "sub":
            v = v[1]
        elif v[0] == "call" and v[1][0] == "attr" and v[1][2] in VIEW_METHODS:
            v = v[1][1]
        elif v[0] == "call" and v[1][0] == "g" and v[1][1] in VIEW_FUNCTIONS and v[2]:
            v = v[2][0]
        else:
            return v


def alternatives(v: Value, facts: dict[Value, bool]) -> list[Value]:
    """The concrete values `v` may be on a path with these facts (ifexp and phi expanded)."""
    if v[0] == "ifexp":
        known = facts.get(v[1])
        if known is True:
            return alternatives(v[2], facts)
        if known is False:
            return alternatives(v[3], facts)
        return alternatives(v[2], facts) + alternatives(v[3], facts)
    if v[0] == "phi":
        return [a for alt in v[1] for a in alternatives(alt, facts)]
    if v[0] == "sub":
        return [("sub", b, v[2]) for b in alternatives(v[1], facts)]
    return [v]


def step_buffer(v: Value) -> bool:
    base = strip_views(v)
    return base[0] == "attr" and base[2] in STEP_KV_BUFFERS


def pool_derived(v: Value) -> bool:
    base = strip_views(v)
    if base[0] in ("ifexp", "phi"):
        return any(pool_derived(a) for a in alternatives(base, {}))
    return base[0] == "pool"


class Module:
    """One parsed file: its functions, classes, and what it imports from the series' modules."""

    def __init__(
        self, tree: ast.Module, gather_module: str, native_module: str | None = None
    ) -> None:
        self.tree = tree
        self.functions: dict[str, ast.FunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.methods: dict[str, dict[str, ast.FunctionDef]] = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                self.methods[node.name] = {
                    n.name: n for n in node.body if isinstance(n, ast.FunctionDef)
                }
        self.gather_names = self._imports(gather_module)
        self.native_names = self._imports(native_module) if native_module else {}
        # attribute / module-level name -> which switch's object it holds
        self.switch_attrs: dict[str, str] = {}
        self.switch_globals: dict[str, str] = {}
        self._switch_bindings(self.gather_names, GATHER)
        self._switch_bindings(self.native_names, NATIVE)
        self.plan_impls = {
            name: pos
            for name, fn in self.functions.items()
            if (pos := _plan_impl_indptr(fn)) is not None
        }

    def _imports(self, module: str) -> dict[str, str]:
        """{local name: name in `module`} for `from <module> import X`."""
        short = module.rsplit(".", 1)[1]
        found: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and (
                node.module == module or (node.level >= 1 and node.module == short)
            ):
                for alias in node.names:
                    found[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == module:
                        found[alias.asname or alias.name] = "*"
        return found

    def _switch_bindings(self, imported: dict[str, str], switch: str) -> None:
        """Attributes and module names bound to a switch object: a factory call from one of the
        series' modules, e.g. `self.fp8_gather = Fp8KvGather.create(...)`, None when off."""
        for node in ast.walk(self.tree):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            call = node.value
            if not isinstance(call, ast.Call):
                continue
            root = call.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in imported):
                continue
            if imported.get(root.id) == NATIVE_FUNCTION:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute):
                    self.switch_attrs[t.attr] = switch
                elif isinstance(t, ast.Name) and node in self.tree.body:
                    self.switch_globals[t.id] = switch

    def function_items(self) -> Iterator[tuple[str | None, ast.FunctionDef]]:
        for fn in self.functions.values():
            yield None, fn
        for cls, methods in self.methods.items():
            for fn in methods.values():
                yield cls, fn


def _plan_impl_indptr(fn: ast.FunctionDef) -> int | None:
    """For a module-level function that plans its first argument (SGLang's
    `fast_mla_decode_plan(wrapper, ...)` style), the position of its kv_indptr parameter."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if not params:
        return None
    first = params[0]
    for node in ast.walk(fn):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "plan"
        ):
            continue
        recv = node.func.value
        if isinstance(recv, ast.Name) and recv.id == first:
            pos = WRAPPER_PLAN_INDPTR
        elif (
            isinstance(recv, ast.Attribute)
            and recv.attr == "_cached_module"
            and isinstance(recv.value, ast.Name)
            and recv.value.id == first
        ):
            pos = MODULE_PLAN_INDPTR
        else:
            continue
        if len(node.args) > pos and isinstance(node.args[pos], ast.Name):
            name = node.args[pos].id
            if name in params:
                return params.index(name)
    return None


_CMP = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.Is: "is", ast.IsNot: "isnot", ast.In: "in", ast.NotIn: "notin",
}  # fmt: skip


class Interpreter:
    """Runs the functions of one Module symbolically with the gather switch on or off."""

    def __init__(
        self,
        module: Module,
        *,
        modes: dict[str, bool],
        env: dict[str, str],
        inline: bool,
        join: bool = False,
    ) -> None:
        """`modes`: which switch objects exist (GATHER, NATIVE -> True/False); `env`: the value
        each environment variable read by the file has in this configuration. `join`: merge
        the paths after every statement (values that differ become a phi, only the facts all
        paths share are kept): for functions far past MAX_PATHS, such as FlashAttention's
        forward methods, at the price of pairing values of different paths."""
        self.m = module
        self.modes = modes
        self.env = env
        self.inline = inline
        self.join = join
        self._stack: list[tuple[str | None, str]] = []
        self._call_text = ""  # source of the call being evaluated, for messages

    # --- entry ---------------------------------------------------------------------------

    def run_function(self, cls: str | None, fn: ast.FunctionDef) -> Outcome:
        """Every path through `fn`, its parameters unknown."""
        env = {a.arg: ("arg", a.arg) for a in _all_params(fn)}
        return self._call(cls, fn, Path(env=env, facts={}))

    def _call(self, cls: str | None, fn: ast.FunctionDef, start: Path) -> Outcome:
        self._stack.append((cls, fn.name))
        try:
            paths, returns = self._block(fn.body, [start])
        finally:
            self._stack.pop()
        returns += [(p, ("c", None)) for p in paths]
        return Outcome(returns=returns)

    @property
    def where(self) -> str:
        cls, name = self._stack[-1]
        return name if cls is None else f"{cls}.{name}"

    # --- statements ----------------------------------------------------------------------

    def _block(
        self, stmts: list[ast.stmt], paths: list[Path]
    ) -> tuple[list[Path], list[tuple[Path, Value]]]:
        returns: list[tuple[Path, Value]] = []
        for stmt in stmts:
            nxt: list[Path] = []
            for p in paths:
                live, ret = self._stmt(stmt, p)
                nxt += live
                returns += ret
            paths = nxt
            if self.join and len(paths) > 1:
                paths = [join_paths(paths)]
            if len(paths) > MAX_PATHS:
                raise AnalysisLimit(f"{self.where} has more than {MAX_PATHS} paths")
            if not paths:
                break
        return paths, returns

    def _stmt(self, s: ast.stmt, p: Path) -> tuple[list[Path], list[tuple[Path, Value]]]:
        if isinstance(s, ast.Expr):
            p, _ = self.ev(s.value, p)
            return [p], []
        if isinstance(s, ast.Assign):
            p, v = self.ev(s.value, p)
            for t in s.targets:
                p = self._bind(t, v, p)
            return [p], []
        if isinstance(s, ast.AnnAssign):
            if s.value is None:
                return [p], []
            p, v = self.ev(s.value, p)
            return [self._bind(s.target, v, p)], []
        if isinstance(s, ast.AugAssign):
            p, cur = self.ev(s.target, p)
            p, rhs = self.ev(s.value, p)
            return [self._bind(s.target, ("op", type(s.op).__name__, cur, rhs), p)], []
        if isinstance(s, ast.Return):
            if s.value is None:
                return [], [(p, ("c", None))]
            p, v = self.ev(s.value, p)
            return [], [(p, v)]
        if isinstance(s, ast.Raise):
            if s.exc is not None:
                p, _ = self.ev(s.exc, p)
            return [], []
        if isinstance(s, ast.Assert):
            p, t = self.ev(s.test, p)
            truth = self.truth(t, p)
            if truth is False:
                return [], []
            return [self._assume(p, t, True, s.test)], []
        if isinstance(s, ast.If):
            p, t = self.ev(s.test, p)
            return self._branch(t, s.test, p, s.body, s.orelse)
        if isinstance(s, (ast.For, ast.AsyncFor)):
            p, it = self.ev(s.iter, p)
            once = self._bind(s.target, ("unpack", it, "item"), p)
            body_paths, rets = self._block(s.body, [once])
            done, rets2 = self._block(s.orelse, [p, *body_paths])
            return done, rets + rets2
        if isinstance(s, ast.While):
            p, t = self.ev(s.test, p)
            truth = self.truth(t, p)
            body_paths: list[Path] = []
            rets: list[tuple[Path, Value]] = []
            if truth is not False:
                body_paths, rets = self._block(s.body, [self._assume(p, t, True, s.test)])
            skip = [p] if truth is not True else []
            done, rets2 = self._block(s.orelse, skip + body_paths)
            return done, rets + rets2
        if isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                p, v = self.ev(item.context_expr, p)
                if item.optional_vars is not None:
                    p = self._bind(item.optional_vars, v, p)
            return self._block(s.body, [p])
        if isinstance(s, ast.Try):
            body, rets = self._block(s.body, [p])
            body, rets2 = self._block(s.orelse, body)
            handled: list[Path] = []
            for h in s.handlers:
                hp, hr = self._block(h.body, [p])
                handled += hp
                rets2 += hr
            done, rets3 = self._block(s.finalbody, body + handled)
            return done, rets + rets2 + rets3
        if isinstance(s, ast.Match):
            p, _ = self.ev(s.subject, p)
            out: list[Path] = []
            rets = []
            for case in s.cases:
                cp, cr = self._block(case.body, [p])
                out += cp
                rets += cr
            return [*out, p], rets
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            env = dict(p.env)
            for alias in s.names:
                name = alias.asname or alias.name.split(".")[0]
                env[name] = ("g", name)
            return [replace(p, env=env)], []
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            env = dict(p.env)
            env[s.name] = ("g", f"<local {s.name}>")
            return [replace(p, env=env)], []
        return [p], []  # pass, global, nonlocal, delete, break, continue

    def _branch(
        self, t: Value, test: ast.expr, p: Path, body: list[ast.stmt], orelse: list[ast.stmt]
    ) -> tuple[list[Path], list[tuple[Path, Value]]]:
        truth = self.truth(t, p)
        live: list[Path] = []
        rets: list[tuple[Path, Value]] = []
        if truth is not False:
            bp, br = self._block(body, [self._assume(p, t, True, test)])
            live += bp
            rets += br
        if truth is not True:
            ep, er = self._block(orelse, [self._assume(p, t, False, test)])
            live += ep
            rets += er
        return live, rets

    def _assume(self, p: Path, t: Value, truth: bool, test: ast.expr) -> Path:
        facts = dict(p.facts)
        text = dict(p.fact_text)
        src = ast.unparse(test)
        if t[0] != "c" and not self.is_switch(t) and self.truth(t, p) is None:
            text[t] = src[4:] if not truth and src.startswith("not ") else src
            if not truth and not src.startswith("not "):
                text[t] = f"not ({src})"
        todo = [(t, truth)]
        while todo:
            v, b = todo.pop()
            if v[0] == "c":
                continue
            facts[v] = b
            if v[0] == "op" and v[1] == "not":
                todo.append((v[2], not b))
            elif v[0] == "op" and ((v[1] == "and" and b) or (v[1] == "or" and not b)):
                todo += [(x, b) for x in v[2:]]
        return replace(p, facts=facts, fact_text=text)

    def _bind(self, target: ast.expr, v: Value, p: Path) -> Path:
        if isinstance(target, ast.Name):
            env = dict(p.env)
            env[target.id] = v
            return replace(p, env=env)
        if isinstance(target, (ast.Tuple, ast.List)):
            elems = v[1] if v[0] == "seq" and len(v[1]) == len(target.elts) else None
            if v[0] == "phi":
                # Only the alternatives that can be unpacked into this many names survive.
                fits = [a[1] for a in v[1] if a[0] == "seq" and len(a[1]) == len(target.elts)]
                if len(fits) == 1:
                    elems = fits[0]
            for i, t in enumerate(target.elts):
                if isinstance(t, ast.Starred):
                    t = t.value
                p = self._bind(t, elems[i] if elems else ("unpack", v, i), p)
            return p
        if isinstance(target, ast.Attribute):
            p, base = self.ev(target.value, p)
            heap = dict(p.heap)
            heap[(base, target.attr)] = v
            return replace(p, heap=heap)
        if isinstance(target, ast.Subscript):
            p, base = self.ev(target.value, p)
            return self._written(p, base)
        if isinstance(target, ast.Starred):
            return self._bind(target.value, v, p)
        return p

    def _written(self, p: Path, v: Value) -> Path:
        """An in-place write to `v` (or to a view of it): its contents change."""
        root = strip_views(v)
        versions = dict(p.versions)
        versions[root] = versions.get(root, 0) + 1
        return replace(p, versions=versions)

    # --- expressions ---------------------------------------------------------------------

    def ev(self, e: ast.expr, p: Path) -> tuple[Path, Value]:
        if isinstance(e, ast.Constant):
            return p, ("c", e.value)
        if isinstance(e, ast.Name):
            if e.id in p.env:
                return p, p.env[e.id]
            if e.id in self.m.functions:
                return p, ("func", None, e.id)
            return p, ("g", e.id)
        if isinstance(e, ast.Attribute):
            p, base = self.ev(e.value, p)
            return p, self._attr(base, e.attr, p)
        if isinstance(e, ast.Subscript):
            p, base = self.ev(e.value, p)
            p, idx = self.ev(e.slice, p)
            if base[0] == "seq" and idx[0] == "c" and isinstance(idx[1], int):
                try:
                    return p, base[1][idx[1]]
                except IndexError:
                    pass
            if base[0] == "dict" and idx in base[1]:
                return p, base[1][idx]
            return p, ("sub", base, idx)
        if isinstance(e, ast.Slice):
            parts = []
            for x in (e.lower, e.upper, e.step):
                if x is None:
                    parts.append(("c", None))
                else:
                    p, v = self.ev(x, p)
                    parts.append(v)
            return p, ("slice", *parts)
        if isinstance(e, (ast.Tuple, ast.List)):
            elems = []
            for x in e.elts:
                p, v = self.ev(x.value if isinstance(x, ast.Starred) else x, p)
                elems.append(v)
            return p, ("seq", tuple(elems))
        if isinstance(e, ast.Dict):
            items = []
            for k, x in zip(e.keys, e.values, strict=True):
                p, kv = self.ev(k, p) if k is not None else (p, ("c", "**"))
                p, vv = self.ev(x, p)
                items.append((kv, vv))
            return p, ("dict", tuple(items))
        if isinstance(e, ast.Call):
            return self._eval_call(e, p)
        if isinstance(e, ast.IfExp):
            p, t = self.ev(e.test, p)
            truth = self.truth(t, p)
            if truth is True:
                return self.ev(e.body, p)
            if truth is False:
                return self.ev(e.orelse, p)
            p, a = self.ev(e.body, p)
            p, b = self.ev(e.orelse, p)
            return p, ("ifexp", t, a, b)
        if isinstance(e, ast.BoolOp):
            vals = []
            for x in e.values:
                p, v = self.ev(x, p)
                vals.append(v)
            return p, ("op", "and" if isinstance(e.op, ast.And) else "or", *vals)
        if isinstance(e, ast.UnaryOp):
            p, v = self.ev(e.operand, p)
            if isinstance(e.op, ast.Not):
                return p, ("op", "not", v)
            return p, ("op", type(e.op).__name__, v)
        if isinstance(e, ast.BinOp):
            p, a = self.ev(e.left, p)
            p, b = self.ev(e.right, p)
            return p, ("op", type(e.op).__name__, a, b)
        if isinstance(e, ast.Compare):
            p, left = self.ev(e.left, p)
            parts = []
            for op, comp in zip(e.ops, e.comparators, strict=True):
                p, right = self.ev(comp, p)
                parts.append(("op", _CMP[type(op)], left, right))
                left = right
            return p, parts[0] if len(parts) == 1 else ("op", "and", *parts)
        if isinstance(e, ast.NamedExpr):
            p, v = self.ev(e.value, p)
            return self._bind(e.target, v, p), v
        if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            # The element expression runs for its calls (events); the result is opaque.
            q = p
            for gen in e.generators:
                q, it = self.ev(gen.iter, q)
                q = self._bind(gen.target, ("unpack", it, "item"), q)
            elts = [e.key, e.value] if isinstance(e, ast.DictComp) else [e.elt]
            for x in elts:
                q, _ = self.ev(x, q)
            return replace(p, events=q.events, versions=q.versions), ("comp", e.lineno)
        if isinstance(e, ast.Starred):
            return self.ev(e.value, p)
        if isinstance(e, ast.JoinedStr):
            return p, ("c", "<f-string>")
        if isinstance(e, ast.Lambda):
            return p, ("g", f"<lambda line {e.lineno}>")
        if isinstance(e, ast.Await):
            return self.ev(e.value, p)
        return p, ("g", f"<{type(e).__name__}>")

    def _attr(self, base: Value, name: str, p: Path) -> Value:
        if (base, name) in p.heap:
            return p.heap[(base, name)]
        cls = self._stack[-1][0] if self._stack else None
        if base == ("arg", "self") and cls is not None and name in self.m.methods.get(cls, {}):
            return ("func", cls, name)
        if base[0] == "c" and isinstance(base[1], str) and name in ("strip", "lower", "upper"):
            return ("strmethod", base[1], name)
        return ("attr", base, name)

    def switch_of(self, v: Value) -> str | None:
        """Which switch object `v` is (None when that switch is off), if any."""
        if v[0] == "attr":
            return self.m.switch_attrs.get(v[2])
        if v[0] == "g":
            return self.m.switch_globals.get(v[1])
        return None

    def is_switch(self, v: Value) -> bool:
        return self.switch_of(v) is not None

    def truth(self, v: Value, p: Path) -> bool | None:
        """True/False when decided by the switch, a constant or an earlier test; None if not."""
        if v in p.facts:
            return p.facts[v]
        kind = v[0]
        if kind == "c":
            return bool(v[1])
        switch = self.switch_of(v)
        if switch is not None:
            return self.modes[switch]
        if kind == "op":
            op = v[1]
            if op == "not":
                inner = self.truth(v[2], p)
                return None if inner is None else not inner
            if op in ("and", "or"):
                vals = [self.truth(x, p) for x in v[2:]]
                if op == "and":
                    return False if False in vals else (True if all(vals) else None)
                return True if True in vals else (False if all(x is False for x in vals) else None)
            if op in ("is", "isnot") and ("c", None) in (v[2], v[3]):
                other = v[3] if v[2] == ("c", None) else v[2]
                is_none = self._is_none(other, p)
                if is_none is None:
                    return None
                return is_none if op == "is" else not is_none
            if v[2][0] == "c" and v[3][0] == "c" and op in ("==", "!=", "in", "notin"):
                a, b = v[2][1], v[3][1]
                try:
                    return {"==": a == b, "!=": a != b, "in": a in b, "notin": a not in b}[op]
                except TypeError:
                    return None
            if (
                op in ("in", "notin")
                and v[2][0] == "c"
                and v[3][0] == "seq"
                and all(x[0] == "c" for x in v[3][1])
            ):
                hit = v[2][1] in [x[1] for x in v[3][1]]
                return hit if op == "in" else not hit
        return None

    def _is_none(self, v: Value, p: Path) -> bool | None:
        switch = self.switch_of(v)
        if switch is not None:
            return not self.modes[switch]
        if v[0] == "c":
            return v[1] is None
        if v[0] == "phi":
            each = {self._is_none(a, p) for a in v[1]}
            return each.pop() if len(each) == 1 else None
        if v[0] in ("seq", "dict", "gather", "cast", "pool", "native", "partial", "func"):
            return False
        return None

    def _eval_call(self, e: ast.Call, p: Path) -> tuple[Path, Value]:
        p, func = self.ev(e.func, p)
        args: list[Value] = []
        for a in e.args:
            p, v = self.ev(a, p)
            args.append(v)
        kwargs: dict[str, Value] = {}
        for kw in e.keywords:
            p, v = self.ev(kw.value, p)
            if kw.arg is not None:
                kwargs[kw.arg] = v
            elif v[0] == "dict":
                kwargs.update({k[1]: x for k, x in v[1] if k[0] == "c" and isinstance(k[1], str)})
        self._call_text = ast.unparse(e.func)
        return self.call(func, args, kwargs, e.lineno, p)

    def _event(self, p: Path, kind: str, line: int, **data: Any) -> Path:
        # What the path knew at this point: later checks resolve conditional values with it.
        data.update(facts=p.facts, fact_text=p.fact_text, versions=p.versions)
        data.setdefault("text", self._call_text)
        return replace(p, events=(*p.events, Event(kind, line, self.where, data)))

    def call(
        self, func: Value, args: list[Value], kwargs: dict[str, Value], line: int, p: Path
    ) -> tuple[Path, Value]:
        """The value of a call, recording the events the rules need."""
        if "out" in kwargs:
            p = self._written(p, kwargs["out"])
        if func[0] == "partial":
            return self.call(func[1], [*func[2], *args], {**dict(func[3]), **kwargs}, line, p)
        if args and func in (("g", "partial"), ("attr", ("g", "functools"), "partial")):
            return p, ("partial", args[0], tuple(args[1:]), tuple(sorted(kwargs.items())))
        if func == ("g", "getattr") and len(args) >= 2 and args[1][0] == "c":
            return p, self._attr(args[0], str(args[1][1]), p)
        if func[0] == "g" and self.m.native_names.get(func[1]) == NATIVE_FUNCTION:
            bound = dict(zip(NATIVE_PARAMS, args, strict=False))
            bound.update({k: v for k, v in kwargs.items() if k in NATIVE_PARAMS})
            p = self._event(p, "native", line, args=bound)
            return p, ("native", line)
        if func == ("g", MLA_WRAPPER):
            p = self._event(p, "wrapper", line, backend=kwargs.get("backend", ("c", "auto")))
            return p, ("call", func, tuple(args), tuple(sorted(kwargs.items())))
        if func[0] == "g" and func[1] in FA_KERNELS:
            p = self._event(p, "fa", line, args=tuple(args), kwargs=kwargs)
            return p, ("call", func, tuple(args), tuple(sorted(kwargs.items())))
        if func[0] == "strmethod":
            s = func[1]
            return p, ("c", {"strip": s.strip, "lower": s.lower, "upper": s.upper}[func[2]]())
        env_read = self._env_read(func, args)
        if env_read is not None:
            return p, env_read
        site = self._plan_site(func, args, kwargs)
        if site is not None:
            wrapper, indptr = site
            p = self._event(p, "plan", line, wrapper=wrapper, indptr=indptr)
            return p, ("c", None)
        if func[0] == "attr":
            recv, meth = func[1], func[2]
            switch = self.switch_of(recv)
            if switch is not None:
                if not self.modes[switch]:
                    p = self._event(p, "off_call", line, method=meth, switch=switch)
                    return p, ("c", None)
                if switch == GATHER and meth == GATHER_PAGES and len(args) >= 3:
                    p = self._event(p, "gather", line, pool=args[0], indices=args[1], lens=args[2])
                    return p, ("gather", args[0], args[1], args[2])
                if switch == GATHER and meth == GATHER_CAST and len(args) >= 2:
                    p = self._event(p, "gather", line, pool=args[0], indices=args[1])
                    return p, ("gather", args[0], args[1])
                if switch == GATHER and meth == GATHER_NOTE:
                    p = self._event(p, "note", line, args=(*args, *kwargs.values()))
                    return p, ("c", None)
                if switch == NATIVE and meth == NATIVE_NOTE and len(args) >= 2:
                    p = self._event(p, "native_note", line, wrapper=args[0], indptr=args[1])
                    return p, ("c", None)
                if switch == NATIVE and meth == NATIVE_PLANNED and args:
                    return p, ("planned", args[0])
            if meth in POOL_GETTERS:
                return p, ("pool", recv, meth, tuple(args))
            if meth in CAST_METHODS and step_buffer(recv):
                return p, ("stepcast", strip_views(recv))
            if meth in CAST_METHODS and pool_derived(recv):
                return self._event(p, "cast", line, source=recv), ("cast", recv)
            if meth == "copy_" and args and pool_derived(args[0]):
                p = self._event(p, "cast", line, source=args[0])
                return self._written(p, recv), recv
            if meth == "run":
                p = self._event(p, "run", line, wrapper=recv, args=tuple(args), kwargs=kwargs)
                return p, ("call", func, tuple(args), tuple(sorted(kwargs.items())))
            if meth.endswith("_") and not meth.startswith("_"):
                p = self._written(p, recv)
        if func[0] == "func" and self.inline and len(self._stack) < MAX_INLINE_DEPTH:
            cls, name = func[1], func[2]
            fn = self.m.functions.get(name) if cls is None else self.m.methods[cls].get(name)
            if fn is not None and (cls, name) not in self._stack:
                lead = [("arg", "self")] if cls is not None else []
                return self._inline(cls, fn, [*lead, *args], kwargs, p)
        return p, ("call", func, tuple(args), tuple(sorted(kwargs.items())))

    def _env_read(self, func: Value, args: list[Value]) -> Value | None:
        """`os.environ.get(VAR, d)` / `os.getenv(VAR, d)` of a variable this configuration sets."""
        reader = func in (
            ("attr", ("attr", ("g", "os"), "environ"), "get"),
            ("attr", ("g", "os"), "getenv"),
        )
        if reader and args and args[0][0] == "c" and args[0][1] in self.env:
            return ("c", self.env[args[0][1]])
        return None

    def _plan_site(
        self, func: Value, args: list[Value], kwargs: dict[str, Value]
    ) -> tuple[Value, Value] | None:
        """(wrapper, kv_indptr) when this call plans a FlashInfer MLA wrapper."""
        if func[0] == "func" and func[1] is None and func[2] in self.m.plan_impls:
            pos = self.m.plan_impls[func[2]]
            params = [a.arg for a in _all_params(self.m.functions[func[2]])]
            indptr = args[pos] if len(args) > pos else kwargs.get(params[pos])
            if args and indptr is not None:
                return args[0], indptr
            return None
        if func[0] != "attr" or func[2] != "plan":
            return None
        recv = func[1]
        if recv[0] == "attr" and recv[2] == "_cached_module":
            indptr = args[MODULE_PLAN_INDPTR] if len(args) > MODULE_PLAN_INDPTR else None
            return (recv[1], indptr) if indptr is not None else None
        indptr = kwargs.get("kv_indptr")
        if indptr is None and len(args) > WRAPPER_PLAN_INDPTR:
            indptr = args[WRAPPER_PLAN_INDPTR]
        return (recv, indptr) if indptr is not None else None

    def _inline(
        self,
        cls: str | None,
        fn: ast.FunctionDef,
        args: list[Value],
        kwargs: dict[str, Value],
        p: Path,
    ) -> tuple[Path, Value]:
        env: dict[str, Value] = {}
        positional = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        defaults = fn.args.defaults
        first_default = len(positional) - len(defaults)
        for i, name in enumerate(positional):
            if i < len(args):
                env[name] = args[i]
            elif name in kwargs:
                env[name] = kwargs.pop(name)
            elif i >= first_default:
                _, env[name] = self.ev(defaults[i - first_default], p)
            else:
                env[name] = ("arg", name)
        for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
            if a.arg in kwargs:
                env[a.arg] = kwargs.pop(a.arg)
            elif d is not None:
                _, env[a.arg] = self.ev(d, p)
            else:
                env[a.arg] = ("arg", a.arg)
        if fn.args.vararg:
            env[fn.args.vararg.arg] = ("seq", tuple(args[len(positional) :]))
        if fn.args.kwarg:
            env[fn.args.kwarg.arg] = (
                "dict",
                tuple((("c", k), v) for k, v in sorted(kwargs.items())),
            )
        inner = self._call(cls, fn, Path(env=env, facts={}, versions=dict(p.versions)))
        events = [e for path, _ in inner.returns for e in path.events]
        # Events of every path through the callee may happen on this one: keep one of each.
        seen: set[tuple[str, int, str]] = set()
        merged = list(p.events)
        for ev in events:
            key = (ev.kind, ev.line, repr({k: v for k, v in ev.data.items() if k in _KEYED}))
            if key not in seen:
                seen.add(key)
                merged.append(ev)
        values = tuple(dict.fromkeys(v for _, v in inner.returns))
        result = values[0] if len(values) == 1 else ("phi", values)
        return replace(p, events=tuple(merged)), result


def _phi(values: list[Value]) -> Value:
    flat: list[Value] = []
    for v in values:
        flat += list(v[1]) if v[0] == "phi" else [v]
    unique = tuple(dict.fromkeys(flat))
    return unique[0] if len(unique) == 1 else ("phi", unique)


def join_paths(paths: list[Path]) -> Path:
    """One path standing for all of `paths`: each binding the phi of its values, the facts
    they all share, every event of any (once), the highest write count of each value."""
    env = {
        k: _phi([q.env[k] for q in paths if k in q.env]) for k in dict.fromkeys(
            k for q in paths for k in q.env
        )
    }  # fmt: skip
    heap = {
        k: _phi([q.heap[k] for q in paths if k in q.heap]) for k in dict.fromkeys(
            k for q in paths for k in q.heap
        )
    }  # fmt: skip
    first = paths[0]
    facts = {k: v for k, v in first.facts.items() if all(q.facts.get(k) == v for q in paths)}
    seen: set[tuple[str, int, str]] = set()
    events: list[Event] = []
    for q in paths:
        for ev in q.events:
            key = (ev.kind, ev.line, repr({k: v for k, v in ev.data.items() if k in _KEYED}))
            if key not in seen:
                seen.add(key)
                events.append(ev)
    versions: dict[Value, int] = {}
    for q in paths:
        for k, n in q.versions.items():
            versions[k] = max(n, versions.get(k, 0))
    return Path(
        env=env,
        facts=facts,
        events=tuple(events),
        versions=versions,
        heap=heap,
        fact_text={k: t for k, t in first.fact_text.items() if k in facts},
    )


def _all_params(fn: ast.FunctionDef) -> list[ast.arg]:
    a = fn.args
    out = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    if a.vararg:
        out.append(a.vararg)
    if a.kwarg:
        out.append(a.kwarg)
    return out
