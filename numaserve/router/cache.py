"""The router's response cache: an LRU of results keyed by (model, task, token ids).

Keyed on token ids, not text, so texts that tokenize alike share an entry. A hit is answered
by the router and never reaches a worker.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class ResultCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: OrderedDict[Hashable, object] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable):
        """The cached result, counted as a hit, or None, counted as a miss."""
        value = self.entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: Hashable, value) -> None:
        if self.capacity <= 0:
            return
        self.entries[key] = value
        self.entries.move_to_end(key)
        if len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def stats(self) -> dict:
        looked_up = self.hits + self.misses
        return {
            "entries": len(self.entries),
            "capacity": self.capacity,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hits / looked_up, 4) if looked_up else 0.0,
        }
