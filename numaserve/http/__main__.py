"""`python -m numaserve.http --spec JSON`: how the supervisor starts an HTTP front."""

import sys

from numaserve.http.front import main

sys.exit(main())
