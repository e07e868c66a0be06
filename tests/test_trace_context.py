"""The caller's trace as a request carries it (W3C Trace Context in the protocol's keys), and
when a process traces at all: pure, with no server (tests/test_tracing.py runs the real one)."""

from __future__ import annotations

from numaserve.config.schema import TracingConfig
from numaserve.processes.tracing import environment, wanted
from numaserve.tasks.requests import parse_request

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def embed(**keys):
    return parse_request({"id": 1, "op": "embed", "texts": ["a"], **keys}, 64)


def test_a_requests_w3c_trace_is_kept_and_passed_on():
    request = embed(traceparent=PARENT, tracestate="vendor=1")
    assert request.trace == (PARENT, "vendor=1")
    body = request.to_body()
    assert (body["traceparent"], body["tracestate"]) == (PARENT, "vendor=1")


def test_a_traceparent_not_in_w3c_form_is_left_out_not_refused():
    for bad in ("00-xyz", PARENT.upper(), "00-" + "0" * 32 + "-00f067aa0ba902b7-01", 7):
        assert embed(traceparent=bad).trace is None


def test_a_tracestate_too_long_is_left_out_and_the_parent_kept():
    assert embed(traceparent=PARENT, tracestate="k=" + "v" * 600).trace == (PARENT, "")


def test_tracing_is_off_unless_an_endpoint_is_named():
    assert not wanted({})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    named = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not wanted(named | {"OTEL_SDK_DISABLED": "true"})
    assert not wanted(named | {"OTEL_TRACES_EXPORTER": "none"})


def test_server_tracing_sets_the_otel_variables_it_names_and_no_others():
    config = TracingConfig(endpoint="http://collector:4318", sampler_arg="0.01")
    assert environment(config) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    }
    assert environment(TracingConfig()) == {}
