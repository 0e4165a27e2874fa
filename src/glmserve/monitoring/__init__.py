"""Build-time generators for the top-level `monitoring/` assets; nothing here runs in a service.

- `dashboard`: writes (and `--check`s) monitoring/grafana/dashboards/tpot.json from code;
- `preview`: draws the README's matplotlib preview of that dashboard's panels from a real
  Prometheus.

They read the exporter's definitions (the TPOT SLO) rather than retyping them, so the dashboard,
the alerts and the sidecar agree; the sidecar never imports this package.
"""
