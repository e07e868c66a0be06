"""The supervisor and its HTTP fronts (server.http), on a fake OS and clock (tests/harness/
fake_system.py: no process is started; the fake kernel records spawns and signals)."""

from __future__ import annotations

import signal

from tests.harness.fake_system import Rig, spec_of
from tests.test_supervisor_states import THREE_MODELS, TWO_MODELS

HTTP = "127.0.0.1:8080"


def test_an_http_front_starts_with_the_shards_and_is_ready_once_a_shard_answers(tmp_path):
    rig = Rig(tmp_path, http=HTTP)
    rig.start()

    (front,) = rig.sup.roster.http
    assert front.name == "http-0" and front.state.value == "ready"
    spec = spec_of(front.argv)
    assert spec["address"] == HTTP
    assert spec["models"][0]["shards"] == [spec_of(rig.sup.roster.routers[0].argv)["local"]]
    assert front.cpus == rig.sup.roster.routers[0].cpus  # pinned with its node's shard


def test_no_http_front_runs_where_server_http_is_empty(tmp_path):
    rig = Rig(tmp_path, http="")
    rig.start()
    assert rig.sup.roster.http == [] and not any(
        n.startswith("http") for n in rig.os.running.values()
    )


def test_a_stop_drains_the_http_fronts_before_the_router_shards(tmp_path):
    rig = Rig(tmp_path, http=HTTP)
    rig.start()
    front = rig.os.pid_of("http-0")

    rig.step(signal.SIGTERM)
    assert rig.os.signals_to("http-0") == [signal.SIGTERM]
    assert rig.os.signals_to("router") == []  # still serving what the front holds
    rig.step(seconds=0.5)
    assert rig.os.signals_to("router") == []
    rig.os.exit(front, 0)
    rig.step()
    assert rig.os.signals_to("router") == [signal.SIGTERM]


def test_sighup_reaches_the_http_fronts_so_they_read_the_keys_again(tmp_path):
    rig = Rig(tmp_path, http=HTTP)
    rig.start()
    rig.step(signal.SIGHUP)
    assert signal.SIGHUP in rig.os.signals_to("http-0")


def test_a_killed_http_front_is_restarted_with_the_same_spec(tmp_path):
    rig = Rig(tmp_path, http=HTTP)
    rig.start()
    old = rig.os.pid_of("http-0")
    argv = rig.sup.roster.http[0].argv
    rig.os.exit(old, -signal.SIGKILL)
    rig.step()
    assert rig.sup.roster.http[0].state.value == "backoff"
    rig.run_for(2.0)

    new = rig.os.pid_of("http-0")
    assert new not in (None, old)
    assert rig.os.argv[new] == argv
    assert rig.sup.roster.http[0].state.value == "ready"


def test_a_reload_that_adds_a_model_starts_new_fronts_for_it_and_drains_the_old(tmp_path):
    rig = Rig(tmp_path, config_text=TWO_MODELS.replace('http: ""', f'http: "{HTTP}"'))
    rig.start()
    old = rig.os.pid_of("http-0")
    rig.config_path.write_text(THREE_MODELS.replace('http: ""', f'http: "{HTTP}"'))

    rig.step(signal.SIGHUP)

    (front,) = rig.sup.roster.http
    assert front.pid != old  # a new one, beside the old on the same port
    assert [m["name"] for m in spec_of(front.argv)["models"]] == ["a", "b", "c"]
    assert rig.os.signals_to("http-0")[-1] == signal.SIGTERM  # the old one drains
    assert rig.os.pid_of("http-0") is not None
