"""Start the real router (smg, the Shepherd Model Gateway) as a subprocess on 127.0.0.1, for tests
and benches.

    from glmserve.testing.router import router_process
    with router_process([emu.url for emu in emulators], policy="round_robin") as router:
        router.url, router.metrics_url, router.healthy_workers()

The router is the pinned release itself, started with the same argv the compose stack uses
(glmserve.fleet.router.router_argv). Outbound proxies point at a closed loopback port: the
router fetches a tokenizer from the Hugging Face Hub when a worker reports a model path that
does not exist locally, and a test must never reach past 127.0.0.1 (workers should report a
local path; this only makes a slip fail at once instead of leaving the host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from glmserve.fleet.router import RouterConfig, router_argv
from glmserve.serverproc import free_port

NO_EGRESS = {
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    "HF_HUB_OFFLINE": "1",
}


def get_json(url: str, timeout_s: float = 2.0, api_key: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as r:
        return json.loads(r.read())


def served_model(worker: str) -> str | None:
    """The model id a worker serves (GET /v1/models), which the router routes by."""
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
        return str(get_json(worker.rstrip("/") + "/v1/models")["data"][0]["id"])
    return None


@dataclasses.dataclass
class RunningRouter:
    url: str
    metrics_url: str
    config: RouterConfig
    workers: list[str]
    proc: subprocess.Popen[bytes]
    log_file: Any

    @property
    def pid(self) -> int:
        return self.proc.pid

    def readiness(self) -> dict[str, Any]:
        """GET /readiness: {"status", "healthy_workers", "total_workers"}; 503 while none is up."""
        try:
            return get_json(self.url + "/readiness")
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read() or b"{}")

    def healthy_workers(self) -> set[str]:
        """Worker URLs the router currently counts as healthy (GET /workers)."""
        body = get_json(self.url + "/workers", api_key=self.config.api_key)
        return {w["url"] for w in body.get("workers", []) if w.get("is_healthy")}

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
            return r.read().decode()

    def log(self) -> str:
        self.log_file.flush()
        self.log_file.seek(0)
        return self.log_file.read().decode(errors="replace")

    def wait_healthy(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"router exited with {self.proc.returncode}: {self.log()[-2000:]}"
                )
            with contextlib.suppress(OSError, ValueError):
                last = self.readiness()
                if last.get("healthy_workers", 0) >= count:
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"router not ready with {count} healthy workers in {timeout_s:g} s: {last}"
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int | None:
        """Signal the router (by PID) and wait; SIGKILL if it outlives `timeout_s`."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def close(self) -> None:
        self.stop()
        self.log_file.close()


def start_router(
    workers: Sequence[str],
    *,
    port: int | None = None,
    metrics_port: int | None = None,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    wait_for: int | None = None,
    timeout_s: float = 30.0,
    **overrides: Any,
) -> RunningRouter:
    """Start the router on 127.0.0.1 (free ports unless given) and wait until `wait_for`
    workers (default: all) are healthy. `overrides` are RouterConfig fields; served_model
    defaults to what the first worker serves, so clients may send the model "default"."""
    if "served_model" not in overrides and workers:
        overrides["served_model"] = served_model(workers[0])
    config = RouterConfig(
        host="127.0.0.1",
        port=port or free_port(),
        metrics_host="127.0.0.1",
        metrics_port=metrics_port or free_port(),
        log_level=overrides.pop("log_level", "info"),
        **overrides,
    )
    argv = router_argv(config, list(workers), python)
    log_file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by RunningRouter.close)
    proc = subprocess.Popen(
        argv,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, **NO_EGRESS, **(env or {})},
    )
    router = RunningRouter(
        url=f"http://127.0.0.1:{config.port}",
        metrics_url=f"http://127.0.0.1:{config.metrics_port}/metrics",
        config=config,
        workers=list(workers),
        proc=proc,
        log_file=log_file,
    )
    try:
        router.wait_healthy(len(workers) if wait_for is None else wait_for, timeout_s)
    except BaseException:
        router.close()
        raise
    return router


@contextlib.contextmanager
def router_process(workers: Sequence[str], **kwargs: Any) -> Iterator[RunningRouter]:
    router = start_router(workers, **kwargs)
    try:
        yield router
    finally:
        router.close()


__all__ = ["NO_EGRESS", "RunningRouter", "router_process", "served_model", "start_router"]
