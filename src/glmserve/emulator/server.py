"""Running the app under uvicorn: on a socket we bind ourselves, so port 0 works and the real
port is known before anyone connects."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable

import uvicorn

from glmserve.emulator.app import create_app
from glmserve.emulator.config import SGLANG_VERSION, EmulatorConfig

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


def make_server(config: EmulatorConfig, log_level: str = "warning") -> uvicorn.Server:
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
    return uvicorn.Server(uv_config)


async def serve(
    config: EmulatorConfig,
    sock: socket.socket,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "warning",
) -> uvicorn.Server:
    """Serve until the server is told to exit; `on_ready(url)` once it accepts connections."""
    server = make_server(config, log_level)

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        if on_ready is not None:
            on_ready(url_of(sock))

    task = asyncio.ensure_future(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        task.cancel()
    return server


def write_build_info(config: EmulatorConfig) -> None:
    if not config.build_info_file:
        return
    from glmserve.buildinfo import write_build_info as write

    write(
        config.build_info_file,
        {
            "sglang_version": SGLANG_VERSION,
            # The emulator applies no patch: the series and lock stay empty, fp8_gather says
            # which cost model it runs.
            "patch_series": "",
            "patch_lock_sha256": "",
            "fp8_gather": config.fp8_gather,
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
    write_build_info(config)

    def ready(url: str) -> None:
        print(READY_PREFIX + url, flush=True)

    from uvicorn._compat import asyncio_run

    # The same loop factory uvicorn.run would pick (uvloop when installed).
    factory = uvicorn.Config(app=None, loop="auto").get_loop_factory()
    asyncio_run(serve(config, sock, ready, log_level), loop_factory=factory)
    return 0
