"""`python -m numaserve.http --spec JSON`: how the supervisor starts an HTTP front."""

import sys

from numaserve.http.server import main

sys.exit(main())
