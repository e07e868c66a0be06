"""Each task lives in one module of numaserve/tasks: the server's machinery names none."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from numaserve.tasks import NAMES, TASKS
from numaserve.tasks.requests import OWNERS, REQUEST_KEYS, parse_request

PACKAGE = Path(__file__).parents[1] / "numaserve"
# What runs a request: parsing, the router, the worker, the backends, the supervisor.
MACHINERY = [
    "wire/protocol.py",
    "tasks/requests.py",
    "processes/specs.py",
    "worker.py",
    "router",
    "backends",
    "host",
]


def _task_names_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in NAMES
    ]


@pytest.mark.parametrize("part", MACHINERY)
def test_the_machinery_names_no_task(part):
    root = PACKAGE / part
    assert root.exists(), root
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    assert [hit for path in files for hit in _task_names_in(path)] == []


def test_every_task_key_is_a_request_key():
    keys = {key for task in TASKS.values() for key in task.option_keys}
    assert keys <= set(REQUEST_KEYS)


def test_a_key_several_tasks_take_means_the_same_to_each():
    shared = [key for key, owners in OWNERS.items() if len(owners) > 1]
    # raw_scores: classify's and rerank's; max_chunks_per_doc: embed's and rerank's;
    # prompt_name: embed's and multivector's
    assert shared
    for key in shared:
        value = {"max_chunks_per_doc": 4, "prompt_name": "query"}.get(key, True)
        options = []
        for op in OWNERS[key]:
            body = {"id": 1, "op": op, "texts": ["a"], key: value}
            if "query" in TASKS[op].option_keys:
                body["query"] = "q"
            options.append(parse_request(body, max_texts=8).options[key])
        assert options == [value] * len(options), key


def test_a_task_fills_in_its_options_defaults():
    request = parse_request({"id": 1, "op": "ner", "texts": ["Ada in Paris"]}, max_texts=8)
    assert request.options == {"aggregation": "simple"}


def test_a_request_passed_on_says_what_its_client_sent():
    body = {"id": 7, "op": "rerank", "texts": ["d"], "query": "q", "model": "m"}
    assert parse_request(body, max_texts=8).to_body() == {**body, "texts": ["d"]}
