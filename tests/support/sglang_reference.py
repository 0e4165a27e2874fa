"""Extract the Prometheus metric definitions of an SGLang wheel, without importing SGLang.

The emulator must expose the same `sglang:` names, types, label names and bucket boundaries as
the pinned server. Importing SGLang needs torch and a GPU stack, so this reads the collector's
source with `ast` instead: every `Gauge(...)`, `Counter(...)`, `Histogram(...)` call with a
literal `name=` becomes one record (the collectors in metrics_collector.py and the HTTP
middleware metrics in utils/common.py).

Regenerate the committed reference (tests/emulator/data/) from a wheel:

    python tests/support/sglang_reference.py path/to/sglang-0.5.12.post1-*.whl > \
        tests/emulator/data/sglang-0.5.12.post1-metrics.json
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

COLLECTOR_PATH = "sglang/srt/observability/metrics_collector.py"
# The HTTP middleware metrics (--enable-metrics) are defined in utils/common.py.
MIDDLEWARE_PATH = "sglang/srt/utils/common.py"
SOURCES = (COLLECTOR_PATH, MIDDLEWARE_PATH)
METRIC_CLASSES = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram"}
# Which label dict each collector class is constructed with (set in the scheduler mixin and the
# tokenizer manager respectively; checked against the wheel by test_metrics_reference_wheel).
BASE_LABELS = {
    "SchedulerMetricsCollector": ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"],
    "TokenizerMetricsCollector": ["model_name", "engine_type"],
}


def _literal_numbers(node: ast.AST) -> list[float] | None:
    if isinstance(node, (ast.List, ast.Tuple)):
        try:
            return [float(ast.literal_eval(elt)) for elt in node.elts]
        except (TypeError, ValueError):  # not a list of numbers
            return None
    return None


def _label_extra(node: ast.AST) -> list[str] | None:
    """Label names added to the base dict; None when the expression is not understood."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "keys"
    ):
        return []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _label_extra(node.left) if not _is_list_of_keys(node.left) else []
        right = ast.literal_eval(node.right)
        return [*(left or []), *right]
    if isinstance(node, ast.List):
        extra = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                continue
            extra.append(ast.literal_eval(elt))
        return extra
    if isinstance(node, ast.Set):  # {"layer"}: no base labels at all
        return None
    return None


def _is_list_of_keys(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "list"
        and bool(node.args)
        and _label_extra(node.args[0]) == []
    )


def _resolve_buckets(node: ast.AST, assigns: dict[str, list[float]]) -> list[float] | None:
    direct = _literal_numbers(node)
    if direct is not None:
        return direct
    if isinstance(node, ast.Name):
        return assigns.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "generate_buckets" and len(node.args) == 2:
            # generate_buckets(None-rule, default) -> sorted(set(default))
            base = _resolve_buckets(node.args[1], assigns)
            return sorted(set(base)) if base is not None else None
        if node.func.id == "exponential_buckets":
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            return [kw["start"] * kw["width"] ** i for i in range(kw["length"])]
    return None


def _functions(tree: ast.Module) -> list[tuple[str | None, ast.FunctionDef]]:
    """(owning class or None, function) for methods and module-level functions."""
    out: list[tuple[str | None, ast.FunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out += [(node.name, f) for f in node.body if isinstance(f, ast.FunctionDef)]
        elif isinstance(node, ast.FunctionDef):
            out.append((None, node))
    return out


def extract(source: str) -> list[dict[str, Any]]:
    """One record per metric: name, type, labelnames, buckets (histograms), multiprocess_mode.

    Label names are known when the call spells them out, or when it builds on the label dict of
    a collector class listed in BASE_LABELS; otherwise they are recorded as None.
    """
    tree = ast.parse(source)
    records: list[dict[str, Any]] = []
    for owner, func in _functions(tree):
        base = BASE_LABELS.get(owner) if owner else []
        assigns: dict[str, list[float]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                values = _literal_numbers(node.value)
                if isinstance(target, ast.Name) and values is not None:
                    assigns[target.id] = values
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            kind = METRIC_CLASSES.get(node.func.id)
            if kind is None:
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            if "name" not in kw or not isinstance(kw["name"], ast.Constant):
                continue
            extra = _label_extra(kw["labelnames"]) if "labelnames" in kw else []
            labelnames = None if base is None or extra is None else [*base, *extra]
            record: dict[str, Any] = {
                "name": kw["name"].value,
                "type": kind,
                "collector": owner or func.name,
                "labelnames": labelnames,
            }
            if kind == "histogram":
                record["buckets"] = (
                    _resolve_buckets(kw["buckets"], assigns) if "buckets" in kw else None
                )
            if kind == "gauge":
                mode = kw.get("multiprocess_mode")
                record["multiprocess_mode"] = (
                    mode.value if isinstance(mode, ast.Constant) else "all"
                )
            records.append(record)
    return records


def extract_from_wheel(wheel: str | Path) -> list[dict[str, Any]]:
    with zipfile.ZipFile(wheel) as zf:
        out = []
        for member in SOURCES:
            out += extract(zf.read(member).decode())
        return out


def wheel_member(wheel: str | Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(member).decode()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: sglang_reference.py WHEEL_OR_METRICS_COLLECTOR_PY")
    src = Path(sys.argv[1])
    recs = extract_from_wheel(src) if src.suffix == ".whl" else extract(src.read_text())
    json.dump({"source": src.name, "metrics": recs}, sys.stdout, indent=1)
    sys.stdout.write("\n")
