"""Load against a running server: `bench.py` is `numaserve bench`, open- and closed-loop load
from the client library, with its figures and whose server they are."""
