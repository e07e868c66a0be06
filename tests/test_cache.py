from numaserve.router.cache import ResultCache


def test_a_stored_result_is_a_hit():
    cache = ResultCache(10)
    cache.put(("m", "embed", (1, 2)), b"v")
    assert cache.get(("m", "embed", (1, 2))) == b"v"
    assert (cache.hits, cache.misses) == (1, 0)


def test_an_unknown_key_is_a_miss():
    cache = ResultCache(10)
    assert cache.get(("m", "embed", (1,))) is None
    assert cache.stats()["misses"] == 1


def test_the_least_recently_used_entry_is_evicted():
    cache = ResultCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")  # now b is the oldest
    cache.put("c", 3)
    assert cache.get("b") is None
    assert cache.get("a") == 1 and cache.get("c") == 3


def test_size_never_exceeds_capacity():
    cache = ResultCache(100)
    for i in range(1000):
        cache.put(i, i)
    assert len(cache.entries) == 100


def test_capacity_zero_turns_it_off():
    cache = ResultCache(0)
    cache.put("a", 1)
    assert cache.get("a") is None


def test_hit_rate_is_reported():
    cache = ResultCache(10)
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    assert cache.stats() == {"entries": 1, "capacity": 10, "hits": 1, "misses": 1, "hit_rate": 0.5}
