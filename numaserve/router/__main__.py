"""`python -m numaserve.router --spec JSON`: how the supervisor starts the router."""

import sys

from numaserve.router.loop import main

sys.exit(main())
