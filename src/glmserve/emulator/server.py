"""Running the app under uvicorn: on a socket we bind ourselves, so port 0 works and the real
port is known before anyone connects."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable

import uvicorn

from glmserve.emulator.app import create_app
from glmserve.emulator.config import EmulatorConfig
from glmserve.sglang_api import SGLANG_VERSION

READY_PREFIX = "glmserve-emulator: listening on "


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class EmulatorServer(uvicorn.Server):
    """uvicorn.Server that calls `on_ready()` once it accepts connections."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()


def make_server(
    config: EmulatorConfig,
    log_level: str = "warning",
    on_ready: Callable[[], None] | None = None,
) -> EmulatorServer:
    app = create_app(config)
    uv_config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        # uvloop + httptools when installed (the tools image has both): the emulator must keep
        # 256 streams on time on 2 cores.
        loop="auto",
        http="auto",
        lifespan="on",
        backlog=4096,
        timeout_keep_alive=30,
        # Open streams would otherwise hold a SIGTERM (compose stop, test teardown) until they
        # finish; after this grace they are cancelled and count as aborted.
        timeout_graceful_shutdown=3,
    )
    return EmulatorServer(uv_config, on_ready)


def write_build_info(config: EmulatorConfig) -> None:
    if not config.build_info_file:
        return
    from glmserve.buildinfo import write_build_info as write

    write(
        config.build_info_file,
        {
            "sglang_version": SGLANG_VERSION,
            # The emulator applies no patch. Its 'patched' cost model reports the series as
            # "emulated" so the demo dashboard reads "FP8 KV, patched" without claiming a real
            # series or lock; every other model reports none, which the FP8-unpatched alert flags.
            "patch_series": "emulated" if config.fp8_gather == "on" else "",
            "patch_lock_sha256": "",
            "fp8_gather": config.fp8_gather,
            # What the emulated deployment asked of MTP, as the launcher records it.
            "speculative_algorithm": "EAGLE" if config.speculative else "",
            "speculative_num_draft_tokens": (
                str(config.spec_num_draft_tokens) if config.speculative else ""
            ),
            "source": "emulator",
        },
    )


def run(config: EmulatorConfig, log_level: str = "warning") -> int:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as exc:
        print(f"glmserve-emulator: cannot bind {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    try:
        write_build_info(config)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or exc
        print(
            f"glmserve-emulator: cannot write --build-info-file {config.build_info_file}: {reason}",
            file=sys.stderr,
        )
        return 1

    url = url_of(sock)
    server = make_server(config, log_level, on_ready=lambda: print(READY_PREFIX + url, flush=True))
    server.run(sockets=[sock])  # uvloop when installed, SIGTERM/SIGINT -> graceful shutdown
    return 0
