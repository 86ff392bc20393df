"""``python -m dmlbench`` = the ``dmlbench`` console script."""

import sys

from dmlbench.cli import main

sys.exit(main())
