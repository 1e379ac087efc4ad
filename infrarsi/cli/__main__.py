"""``python -m infrarsi.cli``: the same ``main()`` as the console script."""

import sys

from infrarsi.cli import main

sys.exit(main())
