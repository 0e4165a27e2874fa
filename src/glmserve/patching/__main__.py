import sys

from glmserve.patching.cli import main

sys.exit(main())
