import sys

from glmserve.preflight.verify import main

sys.exit(main())
