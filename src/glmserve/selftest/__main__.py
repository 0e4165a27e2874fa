import sys

from glmserve.selftest.runner import main

sys.exit(main())
