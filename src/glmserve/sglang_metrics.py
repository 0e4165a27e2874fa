"""Facts about the pinned SGLang's (0.5.12.post1) Prometheus metrics that more than one part
of glmserve relies on: the emulator reproduces them, the exporter aligns its own histograms
with them so client- and server-side quantiles compare bucket for bucket."""

# bucket_inter_token_latency default (TokenizerMetricsCollector), used when no --bucket-* flag
# is given; tests/emulator checks it against the wheel.
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
