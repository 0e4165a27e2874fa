import sys

from glmserve.smoke.cli import main

sys.exit(main())
