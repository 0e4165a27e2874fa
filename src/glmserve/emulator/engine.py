"""Scheduling and timing: who runs, who waits, and when each token is due.

Timing is driven by ABSOLUTE deadlines. A request admitted at t_a has its first token due at
t_a + ttft. Token k >= 1 is due at t_1 + k * step, where t_1 is when the first token actually
left and step is --tpot-ms (plus the cost model's term, if on). The stream sleeps until a
deadline and re-checks the clock, so a late wake-up delays one event but never shifts the ones
after it: sleep error does not accumulate, which is what keeps the measured TPOT on --tpot-ms at
high concurrency. Anchoring on the first token's real departure puts start-up lateness (a burst
of arrivals on a busy CPU) into TTFT instead of shortening the measured TPOT.

With --tokens-per-chunk K the first output carries one token (the prefill's) and later outputs
carry K tokens; an output is sent when its LAST token is due, so the k-th token still lands at
the same deadline it would have with K=1 and TPOT = (t_last - t_first)/(N-1) is unchanged.

MTP (--speculative-accept-length A) is the same with a number of tokens per decode step that
varies as SGLang's accepted drafts do: each step (one verify pass) delivers 1..D tokens, A on
average (EmulatorConfig.step_tokens), in one output. --tpot-ms stays the time per output token,
so a step that accepts n tokens takes n x TPOT: the emulator models what MTP looks like to a
client and to the metrics (multi-token chunks, acceptance), not what it costs.

Queueing mirrors the real scheduler's FCFS admission: a request runs when fewer than
--max-concurrency requests are running and the pool can hold its prompt plus its output
(a reservation; the real scheduler estimates with new_token_ratio and retracts when wrong,
which the emulator does not model). Queue time counts towards TTFT, as on the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from glmserve.emulator.config import EmulatorConfig
from glmserve.emulator.metrics import MetricsState

IDLE_LOG_INTERVAL_S = 30.0  # the real scheduler's idle metrics refresh


@dataclass
class GenRequest:
    """One generation. `output_tokens` and `finish` are decided up front (deterministic)."""

    prompt_tokens: int
    output_tokens: int
    finish: str  # "length" | "stop"
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    arrival: float = 0.0
    admitted: float | None = None
    generated: int = 0
    last_output: float = 0.0
    done: bool = False
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (emulator.prefix)
    # MTP: verify passes so far, and how many steps accepted 0, 1, 2 ... drafts (SGLang's
    # Req.spec_verify_ct and spec_correct_drafts_histogram).
    spec_verify_ct: int = 0
    spec_correct_drafts_histogram: list[int] = field(default_factory=list)

    @property
    def reservation(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(slots=True)
class OutputBatch:
    """One output of the engine: `new_tokens` tokens, `completion_tokens` cumulative."""

    new_tokens: int
    completion_tokens: int
    finished: bool
    t: float


class Engine:
    """Owns the running set, the FCFS queue and the metrics state."""

    def __init__(
        self,
        config: EmulatorConfig,
        metrics: MetricsState,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.running: dict[str, GenRequest] = {}
        self.waiting: deque[tuple[GenRequest, asyncio.Future[None]]] = deque()
        self.reserved_tokens = 0  # sum of running reservations (admission control)
        self.used_tokens = 0  # sum of running prompt + generated (KV actually in use)
        self.started_at = clock()
        self._tokens_since_log = 0
        self._last_log = self.started_at
        self.last_gen_throughput = 0.0
        # MTP over the current decode-log interval: tokens accepted and request-steps taken
        # (the scheduler's spec_num_accept_tokens / spec_num_forward_ct).
        self._spec_accepted = 0
        self._spec_steps = 0
        self._spec_total_accepted = 0
        self._spec_total_steps = 0
        self._stats_task: asyncio.Task[None] | None = None
        self._emit_constants()
        self._log_stats(gen_throughput=0.0)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the periodic stats logger (needs a running loop)."""
        if self._stats_task is None:
            self._stats_task = asyncio.get_running_loop().create_task(self._stats_loop())

    async def stop(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stats_task
            self._stats_task = None

    # ---- admission ---------------------------------------------------------------------------
    def _can_admit(self, req: GenRequest) -> bool:
        if len(self.running) >= self.config.max_concurrency:
            return False
        if not self.running:
            return True  # a lone request always runs (the context check bounds its size)
        return self.reserved_tokens + req.reservation <= self.config.max_total_tokens

    def _start(self, req: GenRequest) -> None:
        now = self.clock()
        req.admitted = now
        self.running[req.rid] = req
        self.reserved_tokens += req.reservation
        self.used_tokens += req.prompt_tokens
        self.metrics.queue_time.observe(now - req.arrival)
        self.metrics.realtime_tokens["prefill_compute"] += req.prompt_tokens
        # The real scheduler logs stats after each prefill batch (gen_throughput unchanged).
        self._log_stats(gen_throughput=self.last_gen_throughput)

    async def admit(self, req: GenRequest) -> None:
        """Wait (FCFS) until the request may run. Cancel-safe: a cancelled waiter leaves."""
        req.arrival = req.arrival or self.clock()
        if not self.waiting and self._can_admit(req):
            self._start(req)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (req, fut)
        self.waiting.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if entry in self.waiting:
                self.waiting.remove(entry)
            elif req.rid in self.running:
                self.release(req, aborted=True)
            raise

    def _admit_waiting(self) -> None:
        while self.waiting:
            req, fut = self.waiting[0]
            if fut.done():  # cancelled while queued
                self.waiting.popleft()
                continue
            if not self._can_admit(req):
                return
            self.waiting.popleft()
            self._start(req)
            fut.set_result(None)

    def release(self, req: GenRequest, aborted: bool = False) -> None:
        if self.running.pop(req.rid, None) is None:
            return
        self.reserved_tokens -= req.reservation
        self.used_tokens -= req.prompt_tokens + req.generated
        if aborted and not req.done:
            self.metrics.observe_one_aborted_request()
        self._admit_waiting()

    # ---- timing ------------------------------------------------------------------------------
    def step_s(self) -> float:
        """Time of one decode step for the current load."""
        extra = self.config.cost_model.extra_step_s(self.used_tokens)
        return self.config.tpot_s + extra

    async def _sleep_until(self, deadline: float) -> None:
        # Re-check after waking: loop timers have ~1 ms granularity and may fire early.
        while True:
            delay = deadline - self.clock()
            if delay <= 0:
                return
            await asyncio.sleep(delay)

    async def generate(self, req: GenRequest) -> AsyncIterator[OutputBatch]:
        """Admit, then yield output batches at their deadlines. Always releases the slot."""
        await self.admit(req)
        try:
            assert req.admitted is not None
            due = req.admitted + self.config.ttft_s
            await self._sleep_until(due)
            first = min(1, req.output_tokens)
            out = self._emit(req, first)
            # Later tokens are timed from when the first one actually left: a late first token
            # (a burst of arrivals on a busy CPU) shows up in TTFT, not as a shorter TPOT.
            due = max(due, out.t)
            yield out
            constant = not self.config.cost_model.enabled
            tpot = self.config.tpot_s
            step = 0
            while req.generated < req.output_tokens:
                batch = min(self.config.step_tokens(step), req.output_tokens - req.generated)
                step += 1
                if constant:
                    due += tpot * batch
                else:
                    for _ in range(batch):  # the step time follows the load token by token
                        due += self.step_s()
                await self._sleep_until(due)
                yield self._emit(req, batch)
        finally:
            self.release(req, aborted=not req.done)

    def _emit(self, req: GenRequest, n: int) -> OutputBatch:
        now = self.clock()
        first = req.generated == 0 and req.last_output == 0.0
        req.generated += n
        self.used_tokens += n
        self._tokens_since_log += n
        self.metrics.realtime_tokens["decode"] += n
        if first:
            self.metrics.observe_time_to_first_token(now - req.arrival)
        else:
            self.metrics.observe_inter_token_latency(now - req.last_output, n)
            if self.config.speculative:  # one verify pass: n - 1 drafts accepted + the bonus
                req.spec_verify_ct += 1
                hist = req.spec_correct_drafts_histogram
                hist.extend([0] * (n - len(hist)))
                hist[n - 1] += 1
                self._spec_accepted += n
                self._spec_steps += 1
                self._spec_total_accepted += n
                self._spec_total_steps += 1
        req.last_output = now
        finished = req.generated >= req.output_tokens
        if finished:
            req.done = True
            self.metrics.observe_one_finished_request(
                req.prompt_tokens, req.generated, now - req.arrival
            )
        return OutputBatch(n, req.generated, finished, now)

    # ---- stats (the scheduler's log_stats) ---------------------------------------------------
    def _emit_constants(self) -> None:
        g = self.metrics.gauges
        c = self.config
        g["max_total_num_tokens"] = c.max_total_tokens
        g["page_size"] = 1
        g["num_pages"] = c.max_total_tokens
        g["context_len"] = c.context_length
        g["engine_startup_time"] = c.startup_delay_s
        g["engine_load_weights_time"] = c.startup_delay_s
        g["startup_available_gpu_memory_gb"] = 0.0
        g["fwd_occupancy"] = math.nan  # no device timer: the real default is NaN

    def _log_stats(self, gen_throughput: float) -> None:
        g = self.metrics.gauges
        pool = self.config.max_total_tokens
        g["num_running_reqs"] = len(self.running)
        g["num_queue_reqs"] = sum(1 for _, f in self.waiting if not f.done())
        g["gen_throughput"] = gen_throughput
        g["decode_sum_seq_lens"] = self.used_tokens
        g["token_usage"] = g["full_token_usage"] = self.used_tokens / pool
        g["num_used_tokens"] = g["kv_used_tokens"] = self.used_tokens
        g["kv_available_tokens"] = pool - self.used_tokens
        if self.running:
            g["is_cuda_graph"] = 1.0

    def log_decode_stats(self) -> None:
        now = self.clock()
        gap = now - self._last_log
        self.last_gen_throughput = self._tokens_since_log / gap if gap > 0 else 0.0
        self._tokens_since_log = 0
        self._last_log = now
        self._log_spec_stats()
        self._log_stats(self.last_gen_throughput)

    def _log_spec_stats(self) -> None:
        """The decode log's speculative gauges (scheduler_metrics_mixin.log_decode_stats):
        accept length = accepted tokens / request-steps over the interval, accept rate =
        accepted drafts / proposed drafts; 0 without speculative decoding; kept as they were
        over an interval without a verify pass (the real scheduler logs only while decoding)."""
        if not self.config.speculative or not self._spec_steps:
            return
        g = self.metrics.gauges
        steps, accepted = self._spec_steps, self._spec_accepted
        g["spec_accept_length"] = accepted / steps
        g["spec_accept_rate"] = (accepted - steps) / (
            steps * (self.config.spec_num_draft_tokens - 1)
        )
        self._spec_accepted = self._spec_steps = 0

    def spec_internal_state(self) -> dict[str, float]:
        """/server_info's internal_states entry: avg_spec_accept_length over the server's
        life (scheduler.get_internal_state), once a verify pass has run."""
        if not self._spec_total_steps:
            return {}
        return {"avg_spec_accept_length": self._spec_total_accepted / self._spec_total_steps}

    async def _stats_loop(self) -> None:
        while True:
            if self.running:
                # decode_log_interval decode steps at the current step time
                await asyncio.sleep(self.config.decode_log_interval * self.step_s())
                if self.running:
                    # The decode steps of that interval, each one forward pass of the whole
                    # running batch: replayed in a CUDA graph only up to --cuda-graph-max-bs.
                    self.metrics.increment_decode_cuda_graph_passes(
                        self.config.decode_log_interval,
                        in_graph=len(self.running) <= self.config.graph_max_bs,
                    )
                if self.running or self._tokens_since_log:
                    self.log_decode_stats()
            else:
                wait = self._last_log + IDLE_LOG_INTERVAL_S - self.clock()
                # Poll: new work should start the decode cadence within one step.
                await asyncio.sleep(min(max(wait, 0.0), self.step_s() * 5))
                if not self.running and self.clock() - self._last_log >= IDLE_LOG_INTERVAL_S:
                    self._tokens_since_log = 0
                    self._last_log = self.clock()
                    self.last_gen_throughput = 0.0
                    self._log_stats(0.0)
