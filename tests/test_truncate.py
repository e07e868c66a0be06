"""A request's own choice to cut a text over the model's limit or refuse it (`truncate`), over
the server's model.truncate, as TEI's requests choose. Over real sockets: tests/test_http.py."""

import pytest

from numaserve.tasks.requests import RequestError, parse_request


def test_truncate_is_any_requests_choice_and_passes_on_with_it():
    for op in ("embed", "classify"):
        request = parse_request({"id": 1, "op": op, "texts": ["a"], "truncate": False}, 8)
        assert request.truncate is False
        assert request.to_body()["truncate"] is False
    assert parse_request({"id": 1, "op": "embed", "texts": ["a"]}, 8).truncate is None


def test_truncate_that_is_not_a_boolean_is_refused():
    with pytest.raises(RequestError, match="truncate must be true or false"):
        parse_request({"id": 1, "op": "embed", "texts": ["a"], "truncate": "no"}, 8)


def test_truncation_direction_is_any_requests_choice_and_passes_on_with_it():
    for direction in ("left", "right"):
        body = {"id": 1, "op": "ner", "texts": ["a"], "truncation_direction": direction}
        request = parse_request(body, 8)
        assert request.to_body()["truncation_direction"] == direction
        assert request.cuts_left is (direction == "left")
    assert parse_request({"id": 1, "op": "embed", "texts": ["a"]}, 8).cuts_left is False


@pytest.mark.parametrize("direction", ["Left", "start", 1, True])
def test_a_truncation_direction_other_than_right_or_left_is_refused(direction):
    body = {"id": 1, "op": "embed", "texts": ["a"], "truncation_direction": direction}
    with pytest.raises(RequestError, match=r"truncation_direction must be right .* or left"):
        parse_request(body, 8)
