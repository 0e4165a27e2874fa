"""The Locust decode suite (``locust -f loadtest/decode.py``): users, shapes, options, report.

Stream timing is not defined here: every number comes from ``glmserve.streaming`` so the
Locust report and the exporter's canary measure the same quantities (docs/metrics.md).
"""
