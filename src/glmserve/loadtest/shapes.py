"""The Locust LoadTestShape: a thin adapter from Locust's tick() to a StagePlayer."""

from __future__ import annotations

from collections.abc import Callable

from locust import LoadTestShape

from glmserve.loadtest.options import LoadTestOptions
from glmserve.loadtest.stages import StagePlayer, plan_run


class DecodeShape(LoadTestShape):
    """single / concurrent / sweep / rate-sweep (and --rate, --repeats), chosen by the options;
    Locust calls tick() about once a second on the master (or the only process)."""

    # -u/--users is the stream count: read it instead of Locust warning that it is ignored.
    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self.player: StagePlayer | None = None
        self.on_reset: Callable[[], None] | None = None

    def configure(self, options: LoadTestOptions, run_time_s: float | None = None) -> StagePlayer:
        """`run_time_s`: Locust's -t/--run-time, which Locust itself applies only after a
        shape has finished (so never): the player ends the run there instead."""
        stages = plan_run(
            options.shape,
            options.streams,
            options.warmup_s,
            options.measure_s,
            rates=options.rates,
            senders=options.senders,
            sweep_count=options.sweep_count,
            repeats=options.repeats,
        )
        self.player = StagePlayer(stages, limit_s=run_time_s or None)
        return self.player

    def reset_time(self) -> None:
        # Locust calls this when a shape run starts (each start in the web UI, too).
        super().reset_time()
        if self.player is not None:
            self.player.reset()
        if self.on_reset is not None:
            self.on_reset()

    def tick(self) -> tuple[int, float] | None:
        if self.player is None:
            raise RuntimeError("DecodeShape.configure() was not called (plugin not registered?)")
        return self.player.tick(self.get_run_time())
