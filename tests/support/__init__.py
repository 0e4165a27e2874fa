"""What the test suites share: import as `from support.<module> import ...` (pytest puts tests/
on sys.path for the root conftest). One module per concern:

    net              free_port
    sse              SGLang-shaped SSE bodies and checkers, the one fault-injecting SSE server
    exporter         exporter doubles: httpx mock, step clock, /metrics scraping
    launch           launcher constants and GPU doubles
    locust_run       headless Locust runs of loadtest/decode.py in a subprocess
    livestack        emulator + exporter + real Prometheus on loopback (also the preview script)
    stack            Docker/compose helpers for tests/stack
    sglang_reference the metric definitions of an SGLang wheel (regenerates tests/emulator/data)
"""
