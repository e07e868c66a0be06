"""A request's own choice to cut a text over the model's limit or refuse it (`truncate`), over
the server's model.truncate, as TEI's requests choose. Over real sockets: tests/test_http.py."""

import pytest

from numaserve.requests import RequestError, parse_request


def test_truncate_is_any_requests_choice_and_passes_on_with_it():
    for op in ("embed", "classify"):
        request = parse_request({"id": 1, "op": op, "texts": ["a"], "truncate": False}, 8)
        assert request.truncate is False
        assert request.to_body()["truncate"] is False
    assert parse_request({"id": 1, "op": "embed", "texts": ["a"]}, 8).truncate is None


def test_truncate_that_is_not_a_boolean_is_refused():
    with pytest.raises(RequestError, match="truncate must be true or false"):
        parse_request({"id": 1, "op": "embed", "texts": ["a"], "truncate": "no"}, 8)
