"""How exactly does the emulator keep its promised timing? Measured from outside.

Starts `python -m glmserve.emulator` as a separate process, opens N concurrent streaming chat
requests (ignore_eos, fixed max_tokens, continuous usage stats), times every stream with
glmserve.streaming.StreamTimer (the project's one definition of TTFT/TPOT), and compares the
per-request p50 and mean TPOT and TTFT with the configured --tpot-ms / --ttft-ms.

The client is a minimal asyncio HTTP/1.1 Protocol that only records (arrival time, bytes) while
streams run, and parses after the level ends: on a 2-core machine a client that parses as it
reads falls behind at 256 streams and timestamps its backlog late, so its own CPU cost would be
what we measure. Client and server run in separate processes; the client uses uvloop.

    .venv/bin/python bench/emulator_accuracy.py                    # 1, 128, 256 streams
    .venv/bin/python bench/emulator_accuracy.py --concurrency 1 128 --tokens 512 --write

--write stores bench/results/emulator-accuracy-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from glmserve.emulator.costmodel import MODES, DecodeCostModel
from glmserve.emulator.protocol import (
    CHAT_ASSISTANT_PREFIX,
    CHAT_MESSAGE_OVERHEAD,
    count_text_tokens,
)
from glmserve.streaming import StreamError, StreamRequest, StreamTimer, summarize
from glmserve.testing.emulator import start_process

try:
    import uvloop
except ImportError:  # the client falls back to asyncio's loop
    uvloop = None

RESULTS = Path(__file__).resolve().parent / "results"


class StreamProtocol(asyncio.Protocol):
    """One HTTP/1.1 request whose response bytes are only *recorded* while they arrive.

    data_received stores (arrival time, bytes) and nothing else; de-chunking and the
    StreamTimer run after every stream of the level has ended, with the recorded times
    (StreamTimer.feed takes an explicit `now`). The timing definition is unchanged, but the
    client's per-event cost drops to an append: on 2 cores a client that parses as it reads
    falls behind at 256 streams and then timestamps its backlog late, which is the client's
    error, not the emulator's.
    """

    def __init__(self, request: bytes, start_at: float, done: asyncio.Future[Recording]) -> None:
        self.request, self.start_at, self.done = request, start_at, done
        self.rec = Recording()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + max(0.0, self.start_at - time.perf_counter()), self._send)

    def _send(self) -> None:
        assert self.transport is not None
        self.rec.t_request = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.rec.log.append((time.perf_counter(), data))
        if data.endswith(b"0\r\n\r\n") and not self.done.done():  # the terminal chunk
            self.done.set_result(self.rec)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():  # Connection: close; replay() tells complete from broken
            self.done.set_result(self.rec)


@dataclass
class Recording:
    t_request: float = 0.0
    log: list[tuple[float, bytes]] = field(default_factory=list)


class _Incomplete(Exception):
    pass


def replay(t_request: float, log: list[tuple[float, bytes]]) -> StreamTimer:
    """De-chunk the recorded response and feed a StreamTimer at the recorded arrival times."""
    timer = StreamTimer(t_request)
    buf = b""
    headers_done = False
    need = -1  # bytes left in the current chunk incl. its CRLF; -1 while reading a size line
    for now, data in log:
        buf += data
        if not headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            status = buf[:end].split(b"\r\n", 1)[0]
            if b" 200 " not in status:
                raise StreamError("http_status", status.decode(errors="replace"))
            buf, headers_done = buf[end + 4 :], True
        payload = []
        while True:
            if need < 0:
                nl = buf.find(b"\r\n")
                if nl < 0:
                    break
                size = int(buf[:nl].split(b";")[0], 16)
                buf = buf[nl + 2 :]
                if size == 0:
                    if payload:
                        timer.feed(b"".join(payload), now=now)
                    return timer
                need = size + 2
            if len(buf) < need:
                break
            payload.append(buf[: need - 2])
            buf, need = buf[need:], -1
        if payload:
            timer.feed(b"".join(payload), now=now)
    raise _Incomplete


async def one_stream(
    host: str, port: int, body: bytes, path: str, start_at: float, timeout_s: float
) -> Recording:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Recording] = loop.create_future()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    transport, _ = await loop.create_connection(
        lambda: StreamProtocol(request, start_at, done), host, port
    )
    try:
        return await asyncio.wait_for(done, timeout_s)
    finally:
        transport.close()


async def run_level(
    url: str,
    concurrency: int,
    tokens: int,
    stagger_s: float,
    timeout_s: float = 300.0,
    prompt: str = "accuracy",
    rounds: int = 1,
) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    req = StreamRequest(route="chat", prompt=prompt, max_tokens=tokens, ignore_eos=True)
    body = json.dumps(req.payload()).encode()
    results: list = []
    # Waves run one after another, so a low concurrency still yields enough requests for a
    # median; within a wave, starts spread over one stagger window so streams do not all tick
    # in the same ms.
    for _ in range(rounds):
        base = time.perf_counter() + 0.2
        starts = [base + stagger_s * i / max(concurrency, 1) for i in range(concurrency)]
        results += await asyncio.gather(
            *(one_stream(host, port, body, req.path, s, timeout_s) for s in starts),
            return_exceptions=True,
        )
    timings, failures = [], []
    for r in results:  # parsing happens here, after every stream has ended
        if isinstance(r, BaseException):
            failures.append(repr(r))
            continue
        try:
            timer = replay(r.t_request, r.log)
            t_end = r.log[-1][0]
            timings.append(timer.finish(now=t_end))
        except _Incomplete:
            failures.append("broken_stream: no terminal chunk")
        except StreamError as exc:
            failures.append(str(exc))
    tpots = [t.tpot_s for t in timings if t.tpot_s is not None]
    itl = [x for t in timings for x in t.itl_s]
    return {
        "concurrency": concurrency,
        "requests_ok": len(timings),
        "failures": failures[:5],
        "failure_count": len(failures),
        "output_tokens": sorted({t.output_tokens for t in timings}),
        "tpot_s": summarize(tpots).as_dict(),
        "ttft_s": summarize([t.ttft_s for t in timings]).as_dict(),
        "itl_s": summarize(itl).as_dict(),
        "ack_s": summarize([t.ack_s for t in timings]).as_dict(),
        "tpot_stdev_s": statistics.pstdev(tpots) if len(tpots) > 1 else 0.0,
    }


def err_pct(measured: float, target: float) -> float:
    return (measured - target) / target * 100.0


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tpot-ms", type=float, default=20.0)
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 128, 256])
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--stagger-s", type=float, default=1.0, help="spread of stream starts")
    ap.add_argument(
        "--min-requests",
        type=int,
        default=16,
        help="run back-to-back waves of N streams until a level has at least this many requests",
    )
    ap.add_argument("--write", action="store_true", help="write bench/results files")
    ap.add_argument("--note", default="", help="free text for the .md (e.g. machine load)")
    ap.add_argument(
        "--cost-model",
        choices=MODES,
        default="off",
        help="run the emulator with this decode cost MODEL; the target TPOT becomes the model's "
        "prediction at the mean active tokens (a demo of the model, not an accuracy check)",
    )
    ap.add_argument(
        "--prompt-tokens", type=int, default=0, help="prompt length (emulator count rule)"
    )
    args = ap.parse_args(argv)
    if args.tokens < 2:
        ap.error("--tokens must be >= 2 (TPOT needs two tokens)")

    emu_args = [
        "--tpot-ms", str(args.tpot_ms), "--ttft-ms", str(args.ttft_ms),
        "--tokens-per-chunk", str(args.tokens_per_chunk),
        "--max-concurrency", str(max(args.concurrency)),
        "--cost-model", args.cost_model,
    ]  # fmt: skip
    # The emulator counts ceil(bytes / 4) tokens per message, plus the chat template's share.
    prompt = "abcd" * args.prompt_tokens if args.prompt_tokens else "accuracy"
    chat_prompt_tokens = count_text_tokens(prompt) + CHAT_MESSAGE_OVERHEAD + CHAT_ASSISTANT_PREFIX
    load_before = loadavg()
    emu = start_process(emu_args)
    levels = []
    run = uvloop.run if uvloop is not None else asyncio.run
    try:
        for c in args.concurrency:
            rounds = -(-args.min_requests // c)  # ceil
            levels.append(
                run(
                    run_level(emu.url, c, args.tokens, args.stagger_s, prompt=prompt, rounds=rounds)
                )
            )
    finally:
        emu.stop()
    load_after = loadavg()

    target_ttft = args.ttft_ms / 1000
    model = DecodeCostModel(args.cost_model)
    rows = []
    for lv in levels:
        # With a cost model the step time grows with the active tokens of all streams; predict
        # it at their mean (all streams concurrent, halfway through their outputs).
        active = lv["concurrency"] * (chat_prompt_tokens + args.tokens / 2)
        target_tpot = args.tpot_ms / 1000 + model.extra_step_s(int(active))
        rows.append(
            {
                "concurrency": lv["concurrency"],
                "target_tpot_ms": target_tpot * 1000,
                "ok": lv["requests_ok"],
                "fail": lv["failure_count"],
                "tpot_p50_ms": lv["tpot_s"]["p50"] * 1000,
                "tpot_p50_err_pct": err_pct(lv["tpot_s"]["p50"], target_tpot),
                "tpot_mean_ms": lv["tpot_s"]["mean"] * 1000,
                "tpot_mean_err_pct": err_pct(lv["tpot_s"]["mean"], target_tpot),
                "ttft_p50_ms": lv["ttft_s"]["p50"] * 1000,
                "ttft_p50_err_pct": err_pct(lv["ttft_s"]["p50"], target_ttft),
                "ttft_mean_ms": lv["ttft_s"]["mean"] * 1000,
                "ttft_mean_err_pct": err_pct(lv["ttft_s"]["mean"], target_ttft),
                "itl_p50_ms": lv["itl_s"]["p50"] * 1000,
                "itl_p99_ms": lv["itl_s"]["p99"] * 1000,
            }
        )
    header = (
        "| streams | target TPOT ms | ok | fail | TPOT p50 ms (err %) | TPOT mean ms (err %) | "
        "TTFT p50 ms (err %) | TTFT mean ms (err %) | ITL p50 / p99 ms |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['target_tpot_ms']:.3f} | {r['ok']} | {r['fail']} "
            f"| {r['tpot_p50_ms']:.3f} ({r['tpot_p50_err_pct']:+.2f}) "
            f"| {r['tpot_mean_ms']:.3f} ({r['tpot_mean_err_pct']:+.2f}) "
            f"| {r['ttft_p50_ms']:.2f} ({r['ttft_p50_err_pct']:+.2f}) "
            f"| {r['ttft_mean_ms']:.2f} ({r['ttft_mean_err_pct']:+.2f}) "
            f"| {r['itl_p50_ms']:.3f} / {r['itl_p99_ms']:.3f} |"
        )
    table = "\n".join(lines)
    print(
        f"emulator --tpot-ms {args.tpot_ms:g} --ttft-ms {args.ttft_ms:g} --cost-model "
        f"{args.cost_model}, {args.tokens} output tokens and {chat_prompt_tokens} prompt tokens "
        f"per request, K={args.tokens_per_chunk}\n{table}"
    )
    within = all(
        abs(r["tpot_p50_err_pct"]) <= 1 and abs(r["tpot_mean_err_pct"]) <= 1 and r["fail"] == 0
        for r in rows
    )
    verdict = (
        "TPOT within +-1% at every level:"
        if not model.enabled
        else ("TPOT within +-1% of the MODEL's mean-load prediction at every level:")
    )
    print(verdict, "yes" if within else "NO")

    if args.write:
        now = dt.datetime.now(dt.timezone.utc)
        given = list(argv if argv is not None else sys.argv[1:])
        if "--note" in given:  # the note is prose for the .md, not part of the method
            i = given.index("--note")
            del given[i : i + 2]
        command = shlex.join(["python", "bench/emulator_accuracy.py", *given])
        record = {
            "what": "emulator timing accuracy, measured from outside with glmserve.streaming",
            "device": "this 2-core CI-class machine",
            "date_utc": now.isoformat(timespec="seconds"),
            "command": command,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "config": vars(args),
            "tpot_within_1pct": within,
            "rows": rows,
            "levels": levels,
        }
        suffix = "" if not model.enabled else f"-costmodel-{args.cost_model}"
        stem = RESULTS / f"emulator-accuracy-{now:%Y-%m-%d}{suffix}"
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
        md = [
            f"# Emulator timing accuracy, {now:%Y-%m-%d}",
            "",
            f"- Device: this 2-core CI-class machine ({os.cpu_count()} CPUs), Python "
            f"{platform.python_version()}; emulator and client in separate processes.",
            f"- Command: `{record['command']}`",
            f"- Emulator: `--tpot-ms {args.tpot_ms:g} --ttft-ms {args.ttft_ms:g} "
            f"--tokens-per-chunk {args.tokens_per_chunk} --cost-model {args.cost_model}`; "
            f"{args.tokens} output tokens and {chat_prompt_tokens} prompt tokens per request "
            "(chat, stream, ignore_eos, continuous usage stats).",
            "- Target TPOT: --tpot-ms; with a cost MODEL, --tpot-ms plus the model's step cost "
            "at the mean active tokens (streams x (prompt + output/2)): a prediction, so the "
            "error column then checks the model's arithmetic end to end, not a hardware fact.",
            "- Measured from outside with glmserve.streaming.StreamTimer: TPOT = (t_last - "
            "t_first)/(N-1) per request; p50/mean across requests; error vs the configured value.",
            f"- Machine load (1/5/15 min loadavg) before: {load_before}; after: {load_after}; "
            "the note below says what else ran.",
            "",
            table,
            "",
            f"{verdict} {'yes' if within else 'NO'}.",
        ]
        if args.note:
            md += ["", args.note]
        stem.with_suffix(".md").write_text("\n".join(md) + "\n")
        print(f"wrote {stem}.json and {stem}.md")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
