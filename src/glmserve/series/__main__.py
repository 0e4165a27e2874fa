import sys

from glmserve.series.cli import main

sys.exit(main())
