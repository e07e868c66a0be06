"""The supervisor and its fronts (server.http, server.grpc), on a fake OS and clock (tests/harness/
fake_system.py: no process is started; the fake kernel records spawns and signals)."""

from __future__ import annotations

import signal

from numaserve.config.ports import Ports
from tests.harness.fake_system import Rig, spec_of
from tests.test_supervisor_states import THREE_MODELS, TWO_MODELS

HTTP = "127.0.0.1:8080"


def test_an_http_front_starts_with_the_shards_and_is_ready_once_a_shard_answers(tmp_path):
    rig = Rig(tmp_path, http=HTTP)
    rig.start()

    (front,) = rig.sup.roster.fronts
    assert front.name == "front-0" and front.state.value == "ready"
    spec = spec_of(front.argv)
    assert spec["server"]["http"] == HTTP
    assert spec["models"][0]["shards"] == [spec_of(rig.sup.roster.routers[0].argv)["local"]]
    assert front.binding == rig.sup.roster.routers[0].binding  # pinned with its node's shard


def test_a_front_is_ready_only_once_its_process_listens_and_the_server_serves_only_then(
    tmp_path,
):
    rig = Rig(tmp_path, http=HTTP)
    rig.os.cannot_listen.add("front-0")  # it has not written its stats file (fronts.py)
    rig.start()
    (front,) = rig.sup.roster.fronts
    assert front.state.value == "starting"
    assert "READY" not in rig.notifier.kinds()  # systemd hears READY=1 once it listens
    rig.os.cannot_listen.clear()
    rig.os.exit(front.pid, 1)  # could not listen: it exits, and its restart does listen
    rig.step()
    rig.step(seconds=1.0)  # its backoff over: restarted
    rig.step(seconds=0.1)
    assert front.state.value == "ready"


def test_a_front_serves_grpc_alone_where_server_http_is_empty(tmp_path):
    rig = Rig(tmp_path, http="", ports=Ports(grpc=18081))
    rig.start()
    (front,) = rig.sup.roster.fronts
    assert front.name == "front-0" and front.state.value == "ready"
    assert (front.spec.server.http, front.spec.server.grpc) == ("", "127.0.0.1:18081")
    assert front.spec.where() == "grpc://127.0.0.1:18081"


def test_one_front_process_serves_both_apis_where_both_are_on(tmp_path):
    rig = Rig(tmp_path, http=HTTP, ports=Ports(grpc=18081))
    rig.start()
    (front,) = rig.sup.roster.fronts
    assert front.spec.where() == f"http://{HTTP} and grpc://127.0.0.1:18081"


def test_no_front_runs_where_server_http_and_grpc_are_empty(tmp_path):
    rig = Rig(tmp_path, http="")
    rig.start()
    assert rig.sup.roster.fronts == [] and not any(
        n.startswith("front") for n in rig.os.running.values()
    )


def test_a_stop_drains_the_http_fronts_before_the_router_shards(tmp_path):
    rig = Rig(tmp_path, http=HTTP)
    rig.start()
    front = rig.os.pid_of("front-0")

    rig.step(signal.SIGTERM)
    assert rig.os.signals_to("front-0") == [signal.SIGTERM]
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
    assert signal.SIGHUP in rig.os.signals_to("front-0")


def test_a_killed_http_front_is_restarted_with_the_same_spec(tmp_path):
    rig = Rig(tmp_path, http=HTTP)
    rig.start()
    old = rig.os.pid_of("front-0")
    argv = rig.sup.roster.fronts[0].argv
    rig.os.exit(old, -signal.SIGKILL)
    rig.step()
    assert rig.sup.roster.fronts[0].state.value == "backoff"
    rig.run_for(2.0)

    new = rig.os.pid_of("front-0")
    assert new not in (None, old)
    assert rig.os.argv[new] == argv
    assert rig.sup.roster.fronts[0].state.value == "ready"


def test_a_reload_that_adds_a_model_starts_new_fronts_for_it_and_drains_the_old(tmp_path):
    rig = Rig(tmp_path, config_text=TWO_MODELS.replace('http: ""', f'http: "{HTTP}"'))
    rig.start()
    old = rig.os.pid_of("front-0")
    rig.config_path.write_text(THREE_MODELS.replace('http: ""', f'http: "{HTTP}"'))

    rig.step(signal.SIGHUP)

    (front,) = rig.sup.roster.fronts
    assert front.pid != old  # a new one, beside the old on the same port
    assert [m["name"] for m in spec_of(front.argv)["models"]] == ["a", "b", "c"]
    assert rig.os.signals_to("front-0")[-1] == signal.SIGTERM  # the old one drains
    assert rig.os.pid_of("front-0") is not None
