import sys

from glmserve.dashboard.grafana import main

sys.exit(main())
