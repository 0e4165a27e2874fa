"""A misbehaving SSE server for the suite's failure tests (stdlib asyncio, 127.0.0.1 only).

Requests cycle through BEHAVIOURS, one per request, so one short Locust run meets every
failure mode next to well-formed streams. Run as `python sse_server.py PORT_FILE [MODE...]`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys

BEHAVIOURS = ("ok", "http_status", "broken_stream", "malformed_sse", "stream_error", "timeout")
TOKENS = 8
TPOT_S = 0.01


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")


def _delta(content: str, done: int) -> dict:
    return {
        "choices": [{"index": 0, "delta": {"content": content}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": done},
    }


async def _handle(reader, writer, modes) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length")),
            0,
        )  # fmt: skip
        await reader.readexactly(length)
        mode = next(modes)
        if mode == "http_status":
            body = b'{"error": "overloaded"}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))  # fmt: skip
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")  # fmt: skip
        writer.write(_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        await writer.drain()
        for i in range(1, TOKENS + 1):
            await asyncio.sleep(TPOT_S)
            if mode == "broken_stream" and i == 3:
                return  # close without the terminating chunk
            if mode == "malformed_sse" and i == 3:
                writer.write(_chunk(b"data: {not json\n\n"))
                break
            if mode == "stream_error" and i == 3:
                writer.write(_event({"error": {"message": "boom", "code": 500}}))
                break
            if mode == "timeout" and i == 3:
                await asyncio.sleep(30)
            writer.write(_event(_delta("x", i)))
            await writer.drain()
        else:
            usage = {"prompt_tokens": 5, "completion_tokens": TOKENS}
            writer.write(_event({"choices": [], "usage": usage}))
            writer.write(_chunk(b"data: [DONE]\n\n"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main(port_file: str, modes: list[str]) -> None:
    cycle = itertools.cycle(modes or BEHAVIOURS)
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, cycle), "127.0.0.1", 0, reuse_address=True
    )
    port = server.sockets[0].getsockname()[1]
    with open(port_file, "w") as fh:
        fh.write(str(port))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
