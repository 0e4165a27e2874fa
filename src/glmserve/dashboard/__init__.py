"""The TPOT dashboard, from code: the generator of monitoring/grafana/dashboards/tpot.json and a
preview of its panels without Grafana. Build-time and operator tools; nothing here runs in a
service.

    python -m glmserve.dashboard --output|--check monitoring/grafana/dashboards/tpot.json  (grafana.py)
    python -m glmserve.dashboard.preview --prometheus URL [--output F.png | --links]

They read the exporter's definitions (the TPOT SLO) rather than retyping them, so the dashboard,
the alerts and the sidecar agree; the sidecar never imports this package.
"""
