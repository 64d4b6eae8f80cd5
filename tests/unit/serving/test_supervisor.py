"""The supervisor's logic without a server: a fake Triton API, process table and clock.

What a real tritonserver does with it is in tests/integration/test_self_healing.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from facefuse.serving import supervisor as sv
from facefuse.serving.supervisor import (
    SettingError,
    Stub,
    Supervisor,
    SupervisorSettings,
)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeTriton:
    """Models with Python stubs; unload removes a model's stubs, load starts new ones."""

    def __init__(self, models: dict[str, int], probe_models=()):
        self.counts = models
        self.next_pid = 100
        self.stubs: list[Stub] = []
        self.loaded = set(models)
        self.calls: list[tuple[str, str]] = []
        self.load_status = 200
        self.replace_status: int | None = None  # None: as load_status (a broken model fails both)
        self.probe_answer: dict[str, tuple[int | None, str]] = {}
        for model in models:
            self._start(model)

    def _start(self, model: str) -> None:
        for i in range(self.counts[model]):
            self.next_pid += 1
            self.stubs.append(Stub(self.next_pid, model, f"{model}_0_{i}", "S"))

    # TritonApi
    def server_ready(self):
        return True

    def server_live(self):
        return True

    def index(self):
        return {m: ("READY" if m in self.loaded else "UNAVAILABLE") for m in self.counts}

    def config(self, model):
        return {
            "backend": "python",
            "max_batch_size": 0,
            "instance_group": [{"count": self.counts[model], "kind": "KIND_CPU"}],
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
        }

    def unload(self, model, timeout_s):
        self.calls.append(("unload", model))
        self.loaded.discard(model)
        self.stubs = [s for s in self.stubs if s.model != model]
        return 200, ""

    def load(self, model, timeout_s):
        self.calls.append(("load", model))
        if self.load_status != 200:
            return self.load_status, "failed to load"
        self.loaded.add(model)
        self._start(model)
        return 200, ""

    def replace(self, model, timeout_s):
        """A load with a changed config: new stubs start, then the old ones end."""
        self.calls.append(("replace", model))
        status = self.load_status if self.replace_status is None else self.replace_status
        if status != 200:
            return status, "failed to load"
        old = [s for s in self.stubs if s.model == model]
        self._start(model)
        self.stubs = [s for s in self.stubs if s not in old]
        return 200, ""

    def model_ready(self, model):
        return model in self.loaded

    def probe(self, model, body, timeout_s):
        self.calls.append(("probe", model))
        return self.probe_answer.get(model, (400, "X: bad shape"))

    # process table
    def list_stubs(self):
        return list(self.stubs)

    def kill(self, pid):
        self.calls.append(("kill", str(pid)))
        self.stubs = [s for s in self.stubs if s.pid != pid]

    def die(self, model: str, index: int = 0, state: str | None = None) -> Stub:
        victim = [s for s in self.stubs if s.model == model][index]
        self.stubs.remove(victim)
        if state is not None:  # stopped or zombie: still listed, in that state
            self.stubs.append(Stub(victim.pid, victim.model, victim.instance, state))
        return victim


def make(models=None, **settings):
    triton = FakeTriton(models or {"unet": 1, "facefusion": 4, "vae_decoder": 1})
    clock = Clock()
    lines: list[str] = []
    sup = Supervisor(
        triton,
        server_pid=1,
        settings=SupervisorSettings(**settings),
        log=lines.append,
        stubs=triton.list_stubs,
        kill=triton.kill,
        clock=clock,
        sleep=clock.sleep,
        server_alive=lambda: True,
    )
    sup.discover()
    return sup, triton, clock, lines


def events(lines, name):
    return [x for x in lines if f"event={name} " in x or x.endswith(f"event={name}")]


def test_a_dead_process_is_reloaded_and_counted():
    sup, triton, _clock, lines = make()
    sup.tick()
    assert sup.readiness() == (True, "ok") and not triton.calls
    triton.die("unet")
    sup.tick()
    assert [c for c in triton.calls if c[0] != "probe"] == [("replace", "unet")]
    assert sup.readiness() == (True, "ok") and sup.liveness() == (True, "ok")
    assert len(events(lines, "failure")) == 1 and "kind=exited" in events(lines, "failure")[0]
    assert len(events(lines, "recovered")) == 1
    m = sup.metrics
    assert m.get(sv.M_FAILURES, model="unet", kind="exited") == 1
    assert m.get(sv.M_RELOADS, model="unet", outcome="ok") == 1
    assert m.get(sv.M_MODEL_UP, model="unet") == 1
    text = m.render()
    assert 'facefuse_supervisor_recovery_seconds_count{model="unet"} 1' in text
    assert "# TYPE facefuse_supervisor_recovery_seconds histogram" in text
    # every event is one line
    assert all("\n" not in x and x.startswith("facefuse-supervisor: event=") for x in lines)


def test_one_dead_instance_of_several_is_found_and_readiness_fails_while_out():
    sup, triton, _clock, _lines = make()
    triton.die("facefusion", index=2)
    seen = []
    original = triton.replace

    def replace(model, timeout_s):  # readiness as a load balancer sees it during the reload
        seen.append(sup.readiness())
        return original(model, timeout_s)

    triton.replace = replace
    sup.tick()
    assert seen[0][0] is False and "facefusion down: exited: 1 of 4" in seen[0][1]
    assert len([s for s in triton.stubs if s.model == "facefusion"]) == 4
    assert sup.readiness()[0] is True


def test_a_stopped_process_is_killed_before_the_reload():
    sup, triton, _clock, lines = make()
    victim = triton.die("unet", state="T")
    sup.tick()  # seen stopped once: could be a passing state
    assert not [c for c in triton.calls if c[0] in ("unload", "kill")]
    sup.tick()
    calls = [c for c in triton.calls if c[0] != "probe"]
    assert calls[:2] == [("kill", str(victim.pid)), ("replace", "unet")]
    assert "kind=stopped" in events(lines, "failure")[0]


def test_a_zombie_counts_as_dead():
    sup, triton, _clock, _lines = make()
    triton.die("vae_decoder", state="Z")
    sup.tick()
    assert ("replace", "vae_decoder") in triton.calls


def test_unanswered_health_calls_mean_hung_and_entry_models_get_none():
    sup, triton, clock, lines = make(probe_failures=2)
    sup.run_probes()
    probed = {m for kind, m in triton.calls if kind == "probe"}
    assert probed == {"unet", "vae_decoder"}  # not the pipelines clients call
    triton.probe_answer["unet"] = (None, "TimeoutError: timed out")
    sup.run_probes()  # not due yet
    assert sup.models["unet"].probe_misses == 0
    for _ in range(2):
        clock.now += sup.settings.probe_interval_s
        sup.run_probes()
    assert sup.models["unet"].probe_misses == 2
    triton.calls.clear()
    sup.tick()
    assert [c[0] for c in triton.calls if c[0] != "probe"][:1] == ["kill"]
    assert "kind=hung" in events(lines, "failure")[0]
    assert len(events(lines, "health_call_failed")) == 2
    # Triton's "not healthy" answer counts too; a 400 is a live process
    assert sv.unhealthy_answer(500, "Stub process 'unet_0_0' is not healthy.")
    assert not sv.unhealthy_answer(400, "sample: rank must be 4")
    assert not sv.unhealthy_answer(200, "")


def test_a_model_that_keeps_dying_is_given_up_after_max_reloads_and_nothing_spins():
    sup, triton, clock, lines = make(max_reloads=2, reload_window_s=600)
    for _ in range(2):
        triton.die("unet")
        sup.tick()
        clock.now += 5
    assert len(events(lines, "recovered")) == 2
    triton.die("unet")
    sup.tick()
    assert len(events(lines, "gave_up")) == 1
    loads = triton.calls.count(("replace", "unet"))
    for _ in range(20):  # later passes neither reload nor log again
        clock.now += 1
        sup.tick()
    assert triton.calls.count(("replace", "unet")) == loads == 2
    assert len(events(lines, "gave_up")) == 1
    ready, why = sup.readiness()
    live, why_live = sup.liveness()
    assert not ready and "unet failed: 2 reloads within 600 s" in why
    assert not live and why_live.startswith("gave up on unet")
    assert sup.metrics.get(sv.M_GAVE_UP, model="unet") == 1
    assert sup.metrics.get(sv.M_LIVE) == 0 and sup.metrics.get(sv.M_READY) == 0


def test_reloads_outside_the_window_do_not_count():
    sup, triton, clock, lines = make(max_reloads=2, reload_window_s=60)
    for _ in range(5):
        triton.die("unet")
        sup.tick()
        clock.now += 61
    assert len(events(lines, "recovered")) == 5 and not events(lines, "gave_up")


def test_a_failed_load_is_retried_with_backoff_then_given_up():
    sup, triton, clock, lines = make(max_reloads=3)
    triton.load_status = 400
    triton.die("unet")
    sup.tick()
    assert len(events(lines, "reload_failed")) == 1
    sup.tick()  # within the backoff: no new attempt
    assert triton.calls.count(("load", "unet")) == 1
    live, _ = sup.liveness()
    assert live  # still within the recovery budget
    for _ in range(30):
        clock.now += 5
        sup.tick()
    assert triton.calls.count(("load", "unet")) == 3
    assert len(events(lines, "gave_up")) == 1
    assert sup.metrics.get(sv.M_RELOADS, model="unet", outcome="failed") == 3


def test_liveness_fails_when_a_model_stays_down_past_the_budget():
    sup, triton, clock, _lines = make(recovery_budget_s=30, max_reloads=10)
    triton.load_status = 500
    triton.die("unet")
    sup.tick()
    assert sup.liveness()[0]
    clock.now += 31
    live, why = sup.liveness()
    assert not live and "not recovered within 30 s: unet" in why


def test_server_exit_fails_both_probes_and_ends_the_loop():
    sup, _triton, _clock, _lines = make()
    sup.server_alive = lambda: False
    assert sup.run(threading.Event()) == 1
    assert sup.readiness() == (False, "tritonserver exited")
    assert sup.liveness() == (False, "tritonserver exited")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"poll_interval_s": "0"}, "poll_interval_s (--supervisor-poll-interval-s / "
         "FACEFUSE_SUPERVISOR_POLL_INTERVAL_S) must be a number in [0.1, 60], got 0.0"),
        ({"probe_interval_s": "nan"}, "probe_interval_s"),
        ({"probe_failures": "1.5"}, "probe_failures (--supervisor-probe-failures / "
         "FACEFUSE_SUPERVISOR_PROBE_FAILURES) must be an integer, got '1.5'"),
        ({"max_reloads": "0"}, "max_reloads"),
        ({"reload_timeout_s": "1e9"}, "reload_timeout_s"),
        ({"recovery_budget_s": "-1"}, "recovery_budget_s"),
        ({"probe_timeout_s": "100", "recovery_budget_s": "50"},
         "probe_timeout_s (--supervisor-probe-timeout-s / FACEFUSE_SUPERVISOR_PROBE_TIMEOUT_S) "
         "must not exceed recovery_budget_s (50)"),
        ({"exit_on_give_up": "maybe"}, "exit_on_give_up"),
        ({"poll_intervall_s": "1"}, "unknown supervisor setting(s): poll_intervall_s"),
    ],
)  # fmt: skip
def test_a_setting_out_of_range_is_refused_with_its_name(values, message):
    with pytest.raises(SettingError) as error:
        SupervisorSettings.from_strings(values)
    assert message in str(error.value)


def test_settings_from_the_environment():
    env = {"FACEFUSE_SUPERVISOR_MAX_RELOADS": "5", "FACEFUSE_SUPERVISOR_EXIT_ON_GIVE_UP": "0"}
    settings = SupervisorSettings.from_env(env, exit_on_give_up="1")
    assert settings.max_reloads == 5 and settings.exit_on_give_up is False
    assert SupervisorSettings.from_env({}, exit_on_give_up="1").exit_on_give_up is True


def test_stub_command_line_names_model_and_instance():
    argv = [
        "/sp/backends/python/triton_python_backend_stub",
        "/repo/unet_deep/1/model.py",
        "triton_python_backend_shm_region_x",
        "1048576",
        "1048576",
        "4531",
        "/sp/backends/python",
        "336",
        "unet_deep_0_0",
        "DEFAULT",
    ]
    assert sv.parse_stub_cmdline(argv) == ("unet_deep", "unet_deep_0_0")
    assert sv.parse_stub_cmdline(["/usr/bin/python", "x.py"]) is None
    assert sv.parse_stub_cmdline([argv[0]]) is None


def test_read_stubs_finds_a_stub_child_in_proc(tmp_path):
    """A child whose command line looks like a stub's (argv[0] named like the stub binary)."""
    script = tmp_path / "repo" / "toy" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("import time\ntime.sleep(60)\n")
    child = subprocess.Popen(
        ["/x/triton_python_backend_stub", str(script), "toy_0_0"], executable=sys.executable
    )
    try:
        found = []
        for _ in range(50):
            found = [s for s in sv.read_stubs(os.getpid()) if s.pid == child.pid]
            if found:
                break
            threading.Event().wait(0.05)
        assert found and found[0].model == "toy" and found[0].instance == "toy_0_0"
        assert found[0].state in ("R", "S")
    finally:
        child.kill()
        child.wait()


def test_probe_body_is_the_smallest_request_the_config_admits():
    config = {
        "max_batch_size": 8,
        "input": [
            {"name": "sample", "data_type": "TYPE_FP32", "dims": [-1, -1, -1]},
            {"name": "IMG", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "STEPS", "data_type": "TYPE_INT32", "dims": [1], "optional": True},
        ],
    }
    body = json.loads(sv.probe_body(config))
    assert body["inputs"] == [
        {"name": "sample", "shape": [1, 1, 1, 1], "datatype": "FP32", "data": [0]},
        {"name": "IMG", "shape": [1, 1], "datatype": "BYTES", "data": [""]},
    ]
    assert sv.probe_body({"input": [{"name": "x", "data_type": "TYPE_BF16", "dims": [1]}]}) is None
    assert sv.instance_count({"backend": "python", "instance_group": [{"count": 4}]}) == 4
    assert sv.instance_count({"backend": "onnxruntime"}) == 0


def test_health_endpoints_answer_with_the_reason():
    sup, triton, _clock, _lines = make()
    server = sv.HealthServer(sup, port=0).start()
    base = f"http://127.0.0.1:{server.port}"

    def get(path):
        try:
            with urllib.request.urlopen(base + path, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        sup.tick()
        assert get("/ready") == (200, "ok\n") and get("/live") == (200, "ok\n")
        triton.load_status = 500
        triton.die("unet")
        sup.tick()
        status, text = get("/ready")
        assert status == 503 and "unet down: reload failed: load answered 500" in text
        assert get("/live")[0] == 200  # within the budget
        metrics = get("/metrics")[1]
        assert 'facefuse_supervisor_model_up{model="unet"} 0' in metrics
        assert "facefuse_supervisor_ready 0" in metrics
        status = json.loads(get("/status")[1])
        assert status["models"]["unet"]["state"] == "down" and not status["ready"]
        assert get("/nope")[0] == 404
    finally:
        server.stop()


def test_serve_flags_cover_every_setting():
    import argparse
    from dataclasses import fields

    from facefuse.serving import commands

    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "--supervisor-max-reloads", "7", "--supervisor-probe-timeout-s", "3"]
    )
    settings = commands.supervisor_settings(args)
    assert settings.max_reloads == 7 and settings.probe_timeout_s == 3.0
    assert settings.poll_interval_s == SupervisorSettings().poll_interval_s
    for f in fields(SupervisorSettings):
        assert hasattr(args, f"supervisor_{f.name}")
    args = parser.parse_args(["serve", "--supervisor-max-reloads", "0"])
    with pytest.raises(SettingError, match="max_reloads"):
        commands.supervisor_settings(args)
    assert Path(sv.__file__).read_text().count("import psutil") == 0  # standard library only


def test_metric_names_match_the_list_the_alert_tests_read():
    from facefuse.core import metrics

    names = {sv.M_FAILURES, sv.M_RELOADS, sv.M_MODEL_UP, sv.M_GAVE_UP, sv.M_READY, sv.M_LIVE}
    histogram = {sv.M_RECOVERY + suffix for suffix in ("_bucket", "_sum", "_count")}
    assert names | histogram == set(metrics.SUPERVISOR_METRICS)
    sup, triton, _clock, _ = make()
    triton.die("unet")
    sup.tick()
    sup._publish()
    scraped = {
        line.split("{")[0].split(" ")[0]
        for line in sup.metrics.render().splitlines()
        if line and not line.startswith("#")
    }
    assert scraped == set(metrics.SUPERVISOR_METRICS)  # every name has a sample after a reload


def test_an_unload_that_never_finishes_does_not_block_the_reload():
    """Triton 2.51 can keep a model UNLOADING for ever when a request reached the dead
    instance during the unload; a load then starts new instances beside it."""
    sup, triton, _clock, lines = make()
    original = triton.unload

    def unload_stuck(model, timeout_s):
        status = original(model, timeout_s)
        triton.loaded.add(model)  # still listed...
        triton.index = lambda: {m: "UNLOADING" if m == model else "READY" for m in triton.counts}
        return status

    triton.unload = unload_stuck
    triton.replace_status = 400  # the replacing load refused: unload, then load
    triton.die("vae_decoder")
    sup.tick()
    assert ("load", "vae_decoder") in triton.calls
    assert len(events(lines, "replace_refused")) == 1
    assert len(events(lines, "unload_pending")) == 1 and len(events(lines, "recovered")) == 1


def test_no_reload_while_the_server_shuts_down():
    sup, triton, _clock, lines = make()
    triton.server_live = lambda: False
    triton.die("unet")
    sup.tick()
    assert not {("unload", "unet"), ("replace", "unet")} & set(triton.calls)
    assert not events(lines, "failure")


def test_exit_on_give_up_ends_the_loop_with_code_3():
    sup, triton, _, lines = make(max_reloads=1, exit_on_give_up=True, poll_interval_s=0.1)
    original = triton.replace

    def load_then_die(model, timeout_s):  # a model that dies right after each load
        answer = original(model, timeout_s)
        triton.pending_death = model
        return answer

    triton.replace = load_then_die
    listed = triton.list_stubs

    def stubs_after_death():
        if getattr(triton, "pending_death", None) and sup.models["unet"].state == "up":
            triton.die(triton.pending_death)
            triton.pending_death = None
        return listed()

    sup.stubs = stubs_after_death
    triton.die("unet")
    assert sup.run(threading.Event()) == 3
    assert len(events(lines, "gave_up")) == 1 and len(events(lines, "exit")) == 1


def test_a_model_an_operator_unloaded_is_left_alone():
    sup, triton, _clock, lines = make()
    triton.unload("vae_decoder", 10)  # through the admin API: its stubs end, it is not READY
    triton.calls.clear()
    sup.tick()
    assert not {("load", "vae_decoder"), ("replace", "vae_decoder")} & set(triton.calls)
    assert "vae_decoder" not in sup.models
    assert len(events(lines, "unwatched")) == 1 and sup.readiness() == (True, "ok")


def test_the_surviving_instances_serve_while_the_replacement_loads():
    """One of four instances died: the new copy is loaded beside the old one (no unload), so
    the three live instances keep answering until Triton swaps them."""
    sup, triton, _clock, lines = make()
    triton.die("facefusion", index=1)
    live_during = []
    original = triton.replace

    def replace(model, timeout_s):
        live_during.append(len([s for s in triton.stubs if s.model == model]))
        return original(model, timeout_s)

    triton.replace = replace
    sup.tick()
    calls = [c for c in triton.calls if c[0] != "probe"]
    assert calls == [("replace", "facefusion")] and live_during == [3]
    assert len(events(lines, "recovered")) == 1 and not events(lines, "replace_refused")


def test_a_refused_replacement_falls_back_to_unload_and_load():
    sup, triton, _clock, lines = make()
    triton.replace_status = 400
    triton.die("unet")
    sup.tick()
    calls = [c for c in triton.calls if c[0] != "probe"]
    assert calls == [("replace", "unet"), ("unload", "unet"), ("load", "unet")]
    refused = events(lines, "replace_refused")
    assert len(refused) == 1 and "status=400" in refused[0]
    assert len(events(lines, "recovered")) == 1 and sup.readiness() == (True, "ok")


def test_the_old_copy_left_beside_the_new_one_is_ended_after_its_grace():
    """Triton 2.51 never finishes unloading a copy that lost an instance: its live stubs stay
    beside the new copy. They do not hide a later death and are killed after the grace."""
    sup, triton, clock, lines = make()
    triton.die("facefusion", index=0)
    old = [s.pid for s in triton.stubs if s.model == "facefusion"]

    def replace_keeping_old(model, timeout_s):
        triton.calls.append(("replace", model))
        triton._start(model)
        return 200, ""

    triton.replace = replace_keeping_old
    sup.tick()
    assert len([s for s in triton.stubs if s.model == "facefusion"]) == 7
    assert set(sup.models["facefusion"].old_copy) == set(old)
    new_victim = triton.die("facefusion", index=3)  # one of the new copy's: still found
    assert new_victim.pid not in old
    assert "facefusion" in sup.find_failures()
    triton.stubs.append(new_victim)  # (undo: only the detection was under test)
    clock.now += sv.OLD_COPY_GRACE_S - 1
    sup.tick()
    assert not events(lines, "old_copy_ended")
    clock.now += 1
    sup.tick()
    ended = events(lines, "old_copy_ended")
    assert len(ended) == 3 and all(("kill", str(pid)) in triton.calls for pid in old)
    assert len([s for s in triton.stubs if s.model == "facefusion"]) == 4
    assert sup.models["facefusion"].old_copy == {} and sup.readiness() == (True, "ok")


def test_the_replacing_load_sends_the_models_own_config_with_the_generation_bumped():
    api = sv.TritonApi("127.0.0.1:1", admin_key="k")
    served = {
        "name": "unet",
        "parameters": {"precision": {"string_value": "int8"}},
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    }
    sent = []

    def call(method, path, body=None, timeout_s=None):
        if method == "GET":
            return 200, json.dumps(served).encode()
        sent.append((path, json.loads(body)))
        return 200, b""

    api._call = call
    for _ in range(2):
        assert api.replace("unet", 10) == (200, "")
        served = json.loads(sent[-1][1]["parameters"]["config"])  # what Triton now serves
    assert [path for path, _ in sent] == ["/v2/repository/models/unet/load"] * 2
    first, second = (json.loads(b["parameters"]["config"]) for _, b in sent)
    assert first["parameters"][sv.GENERATION_PARAMETER] == {"string_value": "1"}
    assert second["parameters"][sv.GENERATION_PARAMETER] == {"string_value": "2"}
    assert second["parameters"]["precision"] == {"string_value": "int8"}
    assert second["instance_group"] == served["instance_group"]
