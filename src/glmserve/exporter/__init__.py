"""Sidecar exporter: what SGLang's own /metrics lacks.

- a canary that times one fixed-length stream per interval (request-level TPOT/TTFT quantiles,
  which SGLang does not export), through glmserve.streaming;
- target health (`glmserve_target_up`) and one info series joining /server_info with the
  build-info file (KV dtype, backend, TP, pool size, patch series).

Prometheus scrapes SGLang's /metrics directly; nothing here re-exports `sglang:` series.
"""
