"""Pure logic of the end-to-end harness: the server plan, prompts, token comparison, the server's
ITL histogram, the bars and the report. No processes, no sockets: tests/e2e covers all of it.

The harness (harness.py) runs the servers and feeds what it measured into these functions.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# The seed's pool: GPU.md's unpatched numbers were measured with exactly this many KV slots.
MAX_TOTAL_TOKENS = 495_552

VARIANTS: dict[str, dict[str, str]] = {
    # (a) FP8 KV with the patch switched off: upstream's full-pool cast on every layer and step.
    "fp8_upstream": {
        "kv_cache_dtype": "fp8_e4m3",
        "fp8_gather": "0",
        "label": "(a) FP8 KV, unpatched",
    },
    # (b) FP8 KV with the gather-then-cast path.
    "fp8_patched": {
        "kv_cache_dtype": "fp8_e4m3",
        "fp8_gather": "1",
        "label": "(b) FP8 KV, patched",
    },
    # (c) BF16 KV: no cast at all, the speed the patch must reach.
    "bf16": {"kv_cache_dtype": "bf16", "fp8_gather": "1", "label": "(c) BF16 KV"},
}

# Bars from issue #7, all ratios of numbers measured in the same device call.
BAR_PATCHED_OVER_BF16_SINGLE = 1.05
BAR_PATCHED_OVER_BF16_CONC = 1.10
BAR_PATCHED_OVER_UPSTREAM_SINGLE = 0.2
BAR_SOURCES_AGREE = 0.05


@dataclass(frozen=True)
class ServerSpec:
    """One server of the plan. `group` ties the (a)/(b)/(c) triple whose ratios are compared."""

    key: str
    group: str
    variant: str
    layers: int
    port: int
    tp: int = 1
    gpus: str = "0"
    cuda_graph_max_bs: int = 8
    # What this server is measured for; the deep model skips the 8-stream phase because its
    # graphs are captured for batch 1 only (capture time grows with depth x batch sizes).
    concurrency: bool = True
    # 0 = core (the bars), higher = dropped first when the deadline approaches.
    priority: int = 0
    # The launcher profile (deploy/profiles/<name>.json); the deep one overrides the layers.
    profile: str = "tiny-mla"

    @property
    def kv_cache_dtype(self) -> str:
        return VARIANTS[self.variant]["kv_cache_dtype"]

    @property
    def fp8_gather(self) -> str:
        return VARIANTS[self.variant]["fp8_gather"]

    @property
    def label(self) -> str:
        return VARIANTS[self.variant]["label"]


def plan_servers(
    n_gpus: int, *, deep_layers: int = 78, base_port: int = 30000, tp2: bool = True
) -> list[ServerSpec]:
    """Every server of one device call; they run side by side, each idle while another is timed.

    All of them fit one H200 at once (8-layer pools 2.3/4.6 GB, 78-layer pools 22/45 GB), so the
    start-up cost (JIT + graph capture) is paid once in parallel instead of once per server.
    With two GPUs the deep servers go to the second one and a TP=2 pair spans both.
    """
    if n_gpus < 1:
        raise ValueError("need at least one GPU")
    deep_gpu = "1" if n_gpus >= 2 else "0"
    specs = [
        ServerSpec("a8", "tp1-8L", "fp8_upstream", 8, base_port + 0),
        ServerSpec("b8", "tp1-8L", "fp8_patched", 8, base_port + 1),
        ServerSpec("c8", "tp1-8L", "bf16", 8, base_port + 2),
    ]
    if deep_layers:
        if deep_layers != 78:
            raise ValueError("the deep profile (tiny-mla-78l) has 78 layers")
        deep = dict(
            layers=deep_layers, gpus=deep_gpu, cuda_graph_max_bs=1, concurrency=False,
            profile="tiny-mla-78l",
        )  # fmt: skip
        grp = f"tp1-{deep_layers}L"
        specs += [
            ServerSpec(
                f"b{deep_layers}", grp, "fp8_patched", port=base_port + 3, priority=1, **deep
            ),
            ServerSpec(f"c{deep_layers}", grp, "bf16", port=base_port + 4, priority=1, **deep),
            ServerSpec(
                f"a{deep_layers}", grp, "fp8_upstream", port=base_port + 5, priority=2, **deep
            ),
        ]
    if tp2 and n_gpus >= 2:
        both = dict(layers=8, tp=2, gpus="0,1", priority=3)
        specs += [
            ServerSpec("a8tp2", "tp2-8L", "fp8_upstream", port=base_port + 6, **both),
            ServerSpec("b8tp2", "tp2-8L", "fp8_patched", port=base_port + 7, **both),
        ]
    return specs


def make_prompts(
    n: int, vocab_size: int, *, seed: int = 7, min_len: int = 16, max_len: int = 1536
) -> list[list[int]]:
    """Deterministic token-id prompts of varied length (different KV lengths per step).

    Ids are drawn from [100, vocab) so that special tokens at the bottom of the vocabulary
    (BOS/EOS/pad in the tiny tokenizer) never appear; token ids, not text, so that the
    tokenizer cannot be a source of difference between servers.
    """
    if n < 1 or vocab_size <= 200 or not 1 <= min_len <= max_len:
        raise ValueError("bad prompt parameters")
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        # Spread lengths log-uniformly so short and long contexts are both covered.
        frac = i / max(n - 1, 1)
        length = round(min_len * (max_len / min_len) ** frac)
        prompts.append([rng.randrange(100, vocab_size) for _ in range(length)])
    return prompts


@dataclass(frozen=True)
class Agreement:
    prompts: int
    identical: int
    position_match: float  # matching positions / compared positions, over all prompts
    first_divergence: tuple[int | None, ...]  # per prompt; None = identical

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_tokens(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> Agreement:
    """Per-prompt comparison of greedy outputs. Length differences count as divergence."""
    if len(a) != len(b):
        raise ValueError(f"different prompt counts: {len(a)} vs {len(b)}")
    if not a:
        raise ValueError("no outputs to compare")
    identical, matched, compared = 0, 0, 0
    first: list[int | None] = []
    for x, y in zip(a, b, strict=True):
        n = max(len(x), len(y))
        same = [i < len(x) and i < len(y) and x[i] == y[i] for i in range(n)]
        matched += sum(same)
        compared += n
        div = next((i for i, s in enumerate(same) if not s), None)
        first.append(div)
        identical += div is None
    return Agreement(len(a), identical, matched / compared if compared else 1.0, tuple(first))


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape_sum_count(text: str, metric: str) -> tuple[float, float]:
    """(sum, count) of a Prometheus histogram, summed over its label sets.

    SGLang observes inter-token latency per detokenizer batch: `_sum` grows by the batch's
    interval and `_count` by the number of tokens in it, so delta(sum)/delta(count) is the
    server's own mean time per output token over a window.
    """
    total = {"_sum": 0.0, "_count": 0.0}
    seen = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        for suffix in total:
            if name == metric + suffix:
                total[suffix] += float(m.group(3))
                seen = True
    if not seen:
        raise ValueError(f"metric {metric} not found in the scrape")
    return total["_sum"], total["_count"]


_POOL = re.compile(r"max_total_num_tokens=(\d+)")
_DECODE_GRAPH = re.compile(r"Decode batch.*?graph: (True|False), gen throughput")
_CAPTURE_BS = re.compile(r"Capture cuda graph bs \[?([0-9, ]+)\]?")


def log_facts(text: str) -> dict[str, Any]:
    """What a server's own log proves: its pool size, the decode-graph batch sizes it captured,
    and how many logged decode batches ran inside a CUDA graph (SGLang logs one line every
    --decode-log-interval steps, with `cuda graph: True/False`), plus the launcher's verdict."""
    pools = [int(m) for m in _POOL.findall(text)]
    graph = _DECODE_GRAPH.findall(text)
    capture = _CAPTURE_BS.search(text)
    selftest = None
    for line in text.splitlines():
        if "glmserve.launch: self-test" in line:
            selftest = line.split("glmserve.launch: ", 1)[1].strip()[:300]
    return {
        "max_total_num_tokens": pools[-1] if pools else None,
        "capture_bs": [int(x) for x in capture.group(1).replace(" ", "").split(",") if x]
        if capture
        else None,
        "decode_lines_graph": graph.count("True"),
        "decode_lines_eager": graph.count("False"),
        "selftest": selftest,
    }


def histogram_mean(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    d_sum, d_count = after[0] - before[0], after[1] - before[1]
    return d_sum / d_count if d_count > 0 else None


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0 or math.isnan(num) or math.isnan(den):
        return None
    return num / den


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


@dataclass
class Bar:
    name: str
    value: float | str | None
    limit: str
    passed: bool | None  # None = not measured

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bar_le(name: str, value: float | None, limit: float) -> Bar:
    return Bar(name, value, f"<= {limit:g}", None if value is None else value <= limit)


def evaluate_group(
    results: Mapping[str, Mapping[str, Any]], specs: Sequence[ServerSpec]
) -> list[Bar]:
    """Bars of one (a)/(b)/(c) group from the per-server results (missing servers give None)."""
    by_variant = {s.variant: results.get(s.key, {}) for s in specs}
    a, b, c = (by_variant.get(v, {}) for v in ("fp8_upstream", "fp8_patched", "bf16"))
    bars = []
    if b and c:
        bars.append(_bar_le("patched/BF16 TPOT, 1 stream", ratio(b.get("tpot_1"), c.get("tpot_1")),
                            BAR_PATCHED_OVER_BF16_SINGLE))  # fmt: skip
        if any(s.concurrency for s in specs):
            bars.append(_bar_le("patched/BF16 TPOT, 8 streams", ratio(b.get("tpot_8"), c.get("tpot_8")),
                                BAR_PATCHED_OVER_BF16_CONC))  # fmt: skip
    if a and b:
        bars.append(_bar_le("patched/unpatched TPOT, 1 stream", ratio(b.get("tpot_1"), a.get("tpot_1")),
                            BAR_PATCHED_OVER_UPSTREAM_SINGLE))  # fmt: skip
        ta, tb = a.get("greedy_ids"), b.get("greedy_ids")
        if ta and tb and len(ta) == len(tb):
            agree = compare_tokens(ta, tb)
            bars.append(Bar("(a) == (b) greedy tokens", f"{agree.identical}/{agree.prompts} prompts",
                            "all", agree.identical == agree.prompts))  # fmt: skip
        else:
            bars.append(Bar("(a) == (b) greedy tokens", None, "all", None))
        ca, cb = a.get("greedy_ids_cached"), b.get("greedy_ids_cached")
        if ca and cb and len(ca) == len(cb):
            agree = compare_tokens(ca, cb)
            bars.append(Bar("(a) == (b) greedy tokens, prefix-cached (paged extend)",
                            f"{agree.identical}/{agree.prompts} prompts", "all",
                            agree.identical == agree.prompts))  # fmt: skip
    pools = {
        s.key: (results.get(s.key, {}).get("log") or {}).get("max_total_num_tokens") for s in specs
    }
    if any(v is not None for v in pools.values()):
        # SGLang silently shrinks the pool when memory is short; the ratios assume the seed's.
        wrong = sorted(k for k, v in pools.items() if v is not None and v != MAX_TOTAL_TOKENS)
        bars.append(Bar(f"pool = {MAX_TOTAL_TOKENS} on every server", ", ".join(wrong) or "all",
                        "all", not wrong))  # fmt: skip
    for key, r in results.items():
        if key not in {s.key for s in specs}:
            continue
        spread = source_spread(r)
        if spread is not None:
            bars.append(
                _bar_le(f"{key}: canary/client/server TPOT spread", spread, BAR_SOURCES_AGREE)
            )
    return bars


def source_spread(r: Mapping[str, Any]) -> float | None:
    """Largest relative deviation of canary and server-histogram TPOT from the client's."""
    client = r.get("tpot_1_mean")
    others = [r.get("canary_tpot"), r.get("server_itl_mean")]
    if client is None or any(o is None for o in others):
        return None
    return max(abs(o / client - 1.0) for o in others)


@dataclass
class Report:
    meta: dict[str, Any] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    agreement: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1e3:.3f}"


def _num(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None:
        return "—"
    return fmt.format(v) if isinstance(v, float) else str(v)


def render_markdown(report: Report, specs: Sequence[ServerSpec]) -> str:
    m = report.meta
    lines = [
        f"# End-to-end: patched SGLang on {m.get('device', '?')} ({m.get('date', '?')})",
        "",
        f"- mode: `{m.get('mode', '?')}`; SGLang {m.get('sglang', '?')}, FlashInfer {m.get('flashinfer', '?')}, "
        f"torch {m.get('torch', '?')}, patch series `{m.get('patch_series', '?')}`",
        f"- every server: `--max-total-tokens {MAX_TOTAL_TOKENS}`, CUDA graphs on, `--attention-backend flashinfer`, "
        "dummy weights (same seed in every server), started through `python -m glmserve.launch`",
        f"- client: `glmserve.streaming` ({m.get('client', '?')}); canary: {m.get('canary_source', '?')}",
        f"- command: `{m.get('command', '?')}`",
        "",
        "## Servers",
        "",
        "| server | variant | layers | TP | pool | graph decode | ready s | self-test | TTFT ms "
        "| TPOT 1 ms | TPOT 8 ms | tok/s 8 | canary ms | server ITL ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in specs:
        r = report.servers.get(s.key, {})
        if not r:
            continue
        lg = r.get("log") or {}
        graph = (
            f"{lg['decode_lines_graph']}/{lg['decode_lines_graph'] + lg['decode_lines_eager']}"
            if lg
            else "—"
        )
        lines.append(
            f"| {s.key} | {s.label} | {s.layers} | {s.tp} | {_num(lg.get('max_total_num_tokens'))} "
            f"| {graph} | {_num(r.get('ready_s'), '{:.0f}')} "
            f"| {r.get('selftest', '—')} | {_ms(r.get('ttft_1'))} | {_ms(r.get('tpot_1'))} "
            f"| {_ms(r.get('tpot_8'))} | {_num(r.get('tok_s_8'), '{:.0f}')} "
            f"| {_ms(r.get('canary_tpot'))} | {_ms(r.get('server_itl_mean'))} |"
        )
        if r.get("error"):
            lines.append(f"| {s.key} | error: {str(r['error'])[:160]} |||||||||||||")
    lines += [
        "",
        "TPOT and TTFT are medians over requests; 8 streams: median of per-stream TPOTs. pool: "
        "max_total_num_tokens from the server's log; graph decode: logged decode batches that "
        "ran in a CUDA graph / all logged decode batches.",
        "",
    ]
    lines += ["## Bars", "", "| group | bar | value | limit | pass |", "|---|---|---|---|---|"]
    for grp, bars in report.groups.items():
        for bar in bars:
            val = bar["value"]
            shown = _num(val) if not isinstance(val, str) else val
            verdict = {True: "yes", False: "**NO**", None: "not measured"}[bar["passed"]]
            lines.append(f"| {grp} | {bar['name']} | {shown} | {bar['limit']} | {verdict} |")
    if report.agreement:
        lines += ["", "## Greedy agreement", "", "| pair | identical prompts | position match | first divergence |",
                  "|---|---|---|---|"]  # fmt: skip
        for pair, ag in report.agreement.items():
            div = ", ".join("=" if d is None else str(d) for d in ag["first_divergence"])
            lines.append(
                f"| {pair} | {ag['identical']}/{ag['prompts']} | {ag['position_match']:.3f} | {div} |"
            )
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(lines) + "\n"
