"""The monitor (role d3_metrics: Prometheus and Alertmanager from Debian on the lab router host, group d3-monitors; node
exporter on every host) after the session's converge: every planned instance and host is an UP target with the plan's
labels, promtool passes on the monitor's own files, and a drill - an instance stopped makes D3InstanceDown reach the
lab's webhook receiver (lab/webhook/receiver.py, a STAND-IN) within for: + two scrape intervals (+ one evaluation
interval and Alertmanager's group_wait), then resolve once it is back. The lab inventory's monitor values: scrape and
evaluation every 5 s, D3InstanceDown and D3ModelReplicasMissing after 10 s, group_wait 1 s
(lab/roles/lab_hosts/templates/hosts.yml.j2). status.yml's monitor lines (filter d3_status_monitor) are checked on the
live API's answers during the drill. A second site.yml run changes nothing on the monitor: checked on the run that
moves the benched host back to nightly (tests/lab/test_bench.py, its tags include metrics), not on a run of its own."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from labkit import ROOT, Run, on_host, wait_until
from routerkit import ROUTER, ROUTERS

pytestmark = pytest.mark.lab

MONITOR = ROUTER  # the lab puts d3-monitors on the router host
SCRAPE_S, FOR_S, EVAL_S, GROUP_WAIT_S, REPLICAS_FOR_S = 5, 30, 5, 1, 10
RECEIVER_PORT = 19099  # the lab inventory's d3_metrics_webhooks URL: http://10.0.2.2:19099/alerts


def prom_answer(path: str) -> Any:
    """Prometheus' HTTP API on the monitor (it listens on the monitor's loopback only): the whole answer."""
    text = on_host(MONITOR, f"python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "
                            f"'http://127.0.0.1:9090{path}'")  # fmt: skip
    return json.loads(text)


def prom(path: str) -> Any:
    return prom_answer(path)["data"]


def firing(alertname: str, **labels: str) -> list[dict[str, Any]] | None:
    """The alerts of that name and labels that Prometheus shows firing now (/api/v1/alerts)."""
    got = [a for a in prom("/api/v1/alerts")["alerts"] if a["state"] == "firing" and a["labels"].get("alertname") == alertname
           and all(a["labels"].get(k) == v for k, v in labels.items())]  # fmt: skip
    return got or None


def query(promql: str) -> list[dict[str, Any]]:
    return prom("/api/v1/query?query=" + urllib.parse.quote(promql))["result"]


def targets() -> list[dict[str, Any]]:
    return prom("/api/v1/targets?state=active")["activeTargets"]


@pytest.fixture(scope="module")
def planned(converge_run: Run, host_names: list[str]) -> list[dict[str, Any]]:
    """The monitor's targets as the converge published them (fact d3_metrics_targets). Prints what the role d3_metrics
    cost the converge (its tasks' wall time, every host, from ansible-runner's event times: the suite's cost record)."""
    spans: dict[str, list[float]] = {}
    for event in converge_run.events:
        data = event.get("event_data", {})
        if data.get("role") == "d3_metrics" and data.get("start") and data.get("end") and data.get("task_uuid"):
            times = [datetime.fromisoformat(data[k]).timestamp() for k in ("start", "end")]
            span = spans.setdefault(data["task_uuid"], times)
            spans[data["task_uuid"]] = [min(span[0], times[0]), max(span[1], times[1])]
    print(f"\nd3_metrics in the session converge: {sum(e - s for s, e in spans.values()):.1f} s over {len(spans)} tasks")
    return converge_run.published_fact(MONITOR, "d3_metrics_targets", "d3_metrics", "d3-monitors")


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The lab's webhook receiver for the whole module: the drills and the Watchdog (its own path) share one log."""
    out = tmp_path_factory.mktemp("webhook") / "alerts.jsonl"
    out.touch()
    proc = subprocess.Popen([sys.executable, str(ROOT / "lab/webhook/receiver.py"), "--port", str(RECEIVER_PORT), "--out", str(out)])
    try:
        yield out
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_every_planned_instance_router_and_host_is_an_up_target_with_the_plan_s_labels(
    planned: list[dict[str, Any]], host_names: list[str]
) -> None:
    instances = {(t["labels"]["host"], t["labels"]["name"]) for t in planned if t["job"] == "d3-vllm"}
    assert all(t["labels"]["instance"] == f"{t['labels']['host']}/{t['labels']['name']}" for t in planned if t["job"] == "d3-vllm")
    running = {(h, name) for h in host_names for name in on_host(h, "podman ps --format '{{.Names}}' "
                                                                     "--filter label=io.d3-fleet.instance").split()}  # fmt: skip
    assert instances == running, (instances, running)
    nodes = {t["labels"]["host"] for t in planned if t["job"] == "d3-node"}
    assert nodes == set(host_names) | set(ROUTERS)
    assert {t["labels"]["host"] for t in planned if t["job"] == "d3-router"} == set(ROUTERS)

    def all_up() -> list[dict[str, Any]] | None:
        active = targets()
        ours = [t for t in active if t["labels"]["job"] != "d3-router"]  # the router's exporter: the next test
        return active if len(active) == len(planned) and {t["health"] for t in ours} == {"up"} else None

    try:
        active = wait_until("every target UP", all_up, timeout=4 * SCRAPE_S, poll=1)
    except AssertionError:
        raise AssertionError([(t["labels"], t["health"], t["lastError"]) for t in targets() if t["health"] != "up"]) from None
    want = sorted(json.dumps({**t["labels"], "job": t["job"]}, sort_keys=True) for t in planned)
    got = sorted(json.dumps(t["labels"], sort_keys=True) for t in active)  # the router's target too, UP or not
    assert got == want
    # the labels reach the series: vLLM's own, carrying the plan's model, variant and GPUs
    # name!="": a series another configuration scraped just before this session's converge (the shared lab's other
    # trees) may still answer the instant query; this configuration's all carry the name
    series = query('vllm:kv_cache_usage_perc{job="d3-vllm", name!=""}')
    assert {(s["metric"]["host"], s["metric"]["name"]) for s in series} == instances
    assert all(s["metric"]["model"] == s["metric"]["model_name"] for s in series)  # one meaning: the served name, as vLLM's
    assert all(s["metric"]["variant"] and s["metric"]["gpus"] for s in series)
    # the GPU textfile: every L4 host reports its GPUs from the NVIDIA stand-in's nvidia-smi
    gpus = query('d3_gpu_memory_total_bytes{job="d3-node"}')
    assert {s["metric"]["host"] for s in gpus} == set(host_names), gpus


def test_the_router_s_exporter_is_an_up_target(planned: list[dict[str, Any]]) -> None:
    router = [t for t in targets() if t["labels"]["job"] == "d3-router"]
    assert sorted((t["labels"]["host"], t["health"]) for t in router) == [(r, "up") for r in sorted(ROUTERS)], router
    # each router at its own address (the lab's are all 127.0.0.1 to Ansible: at that address the monitor scraped
    # itself twice, once as each router)
    assert len({t["scrapeUrl"] for t in router}) == len(ROUTERS), [t["scrapeUrl"] for t in router]


def test_promtool_passes_on_the_monitor_s_own_files(planned: list[dict[str, Any]]) -> None:
    out = on_host(MONITOR, "promtool check config /etc/prometheus/prometheus.yml 2>&1; "
                           "amtool check-config /etc/prometheus/alertmanager.yml 2>&1")
    assert "SUCCESS" in out and "FAILED" not in out, out
    rules = prom("/api/v1/rules")["groups"][0]["rules"]
    assert {r["name"] for r in rules} >= {"D3InstanceDown", "D3ModelReplicasMissing", "D3RolloutStale"}


def test_an_instance_stopped_fires_instance_down_at_the_webhook_then_resolves(
    planned: list[dict[str, Any]], receiver: Path
) -> None:
    victim = next(t["labels"] for t in planned if t["job"] == "d3-vllm")
    host, unit = victim["host"], victim["name"]

    def alerts(status: str, after: float = 0.0, since: str = "") -> list[dict[str, Any]] | None:
        """The victim's D3InstanceDown notifications of that status the receiver got after ``after`` (wall time), of
        alerts that started at ``since`` or later (UTC, Alertmanager's startsAt). Alertmanager retries a notification
        the receiver of an earlier session missed, so an earlier episode's may arrive too: ``since`` leaves them out."""
        records = [json.loads(line) for line in receiver.read_text().splitlines()]
        got = [a for r in records if r["received"] >= after for a in r["body"]["alerts"]
               if a["labels"].get("alertname") == "D3InstanceDown" and a["labels"].get("name") == unit
               and a["labels"].get("host") == host and a["status"] == status and a["startsAt"][:19] >= since]  # fmt: skip
        return got or None

    stopped, since = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1))
    on_host(host, f"systemctl stop {unit}.service")
    try:
        fired = wait_until("D3InstanceDown at the webhook", lambda: alerts("firing", since=since), timeout=90, poll=0.5)
        took = time.monotonic() - stopped
        assert fired[0]["annotations"]["runbook_url"].endswith("#d3instancedown")
        assert took <= FOR_S + 2 * SCRAPE_S + EVAL_S + GROUP_WAIT_S, f"{took:.1f} s"
        print(f"D3InstanceDown reached the webhook {took:.1f} s after the stop")
        # what status.yml prints from the same API (role d3_metrics status.yml -> filter d3_status_monitor)
        from d3_status import status_monitor  # tests/conftest.py puts the collection's filters on sys.path

        lines = status_monitor(prom_answer("/api/v1/targets?state=active"), prom_answer("/api/v1/alerts"), MONITOR)
        assert any(f"FIRING D3InstanceDown (critical) host {host} instance {host}/{unit} " in line for line in lines), lines
        row = next(line for line in lines if line.startswith(f"{host}  ") and f"  {host}/{unit}  " in line)
        assert "  down  " in row and row.rstrip().endswith(("refused", "by peer")), row  # the scrape's error, as Prometheus says it
    finally:
        started, started_at = time.monotonic(), time.time()
        on_host(host, f"systemctl start {unit}.service")  # returns once the unit is started (the instance may be up)
    # resolved only after the start: a notification before it would be a resolve while the instance was still down
    episode = fired[0]["startsAt"]
    resolved = wait_until("D3InstanceDown resolved at the webhook", lambda: alerts("resolved", since=since), timeout=120, poll=0.5)
    assert [a["startsAt"] for a in resolved] == [episode] * len(resolved), resolved
    assert alerts("resolved", since=since) == alerts("resolved", after=started_at, since=since)
    print(f"resolved {time.monotonic() - started:.1f} s after the start command")
    wait_until("the instance UP again", lambda: query(f'up{{job="d3-vllm",host="{host}",name="{unit}"}} == 1'), timeout=30, poll=1)


def test_a_load_through_the_router_moves_running_and_waiting(planned: list[dict[str, Any]], converge_run: Run) -> None:
    """Concurrent decisions through one frontend: the simulator's vllm:num_requests_running / _waiting (vLLM's names,
    tests/contracts/metrics/names.yml) rise above 0 in a PromQL query over the load's window."""
    from concurrent.futures import ThreadPoolExecutor

    from routerkit import ask, machine_url, router_models

    models = {m["served_name"]: m for m in router_models(converge_run)}
    served, model = next(iter(sorted(models.items())))
    url = machine_url(model["port"])
    assert not query(f'max_over_time(vllm:num_requests_running{{model="{served}"}}[{2 * SCRAPE_S}s]) > 0')
    start = time.time()
    stop = threading.Event()
    answers: list[dict[str, Any]] = []

    def client() -> None:  # decisions back to back until the monitor has seen the load (a scrape must fall in it)
        while not stop.is_set():
            answers.append(ask(url, served))

    def moved() -> list[dict[str, Any]] | None:
        window = f"{int(time.time() - start) + 1}s"
        return query(f'max_over_time(vllm:num_requests_running{{model="{served}"}}[{window}]) > 0') or None

    with ThreadPoolExecutor(max_workers=16) as pool:
        clients = [pool.submit(client) for _ in range(16)]
        try:
            seen = wait_until("vllm:num_requests_running above 0 during the load", moved, timeout=3 * SCRAPE_S, poll=1)
        finally:
            stop.set()
        for c in clients:
            c.result()
    assert answers and all(a["model"] == served for a in answers)
    waiting = query(f'max_over_time(vllm:num_requests_waiting{{model="{served}"}}[{int(time.time() - start) + 1}s])')
    print(f"{len(answers)} decisions; running up to {seen[0]['value'][1]}, waiting up to {[w['value'][1] for w in waiting]}")


def test_a_router_server_drained_past_its_window_fires_the_replica_alert_for_that_router_only(
    planned: list[dict[str, Any]],
) -> None:
    """One of d3-lite's three servers drained on one router only (an operator's `set server ... state drain`) for longer
    than d3_metrics_replicas_for: that router's UP servers fall below the replicas that answer and
    D3ModelReplicasMissing fires for that router (label host), not for the other, which still sends to all three. The
    rule counts per router (issue 32: two routers' series are never added, so one replica drained on one router is not
    hidden by the other's UP series)."""
    from routerkit import MODEL, REPLICAS, server_states, set_state

    backend = f"be_{MODEL}"
    assert len(ROUTERS) >= 2, ROUTERS  # the lab's pair: the quiet router is the point
    drained_on, quiet = ROUTERS[-1], ROUTERS[:-1]
    hosts = {t["labels"]["host"] for t in planned if t["job"] == "d3-vllm" and t["labels"]["model"] == MODEL}
    assert REPLICAS[0] in hosts, hosts
    server = next(s for s in server_states(backend, drained_on) if s.startswith(f"{REPLICAS[0]}-"))
    assert firing("D3ModelReplicasMissing", model=MODEL) is None
    drained = time.monotonic()
    set_state(backend, server, "drain", drained_on)
    try:
        got = wait_until("D3ModelReplicasMissing firing", lambda: firing("D3ModelReplicasMissing", model=MODEL),
                         timeout=REPLICAS_FOR_S + 3 * SCRAPE_S + 2 * EVAL_S, poll=1)  # fmt: skip
        took = time.monotonic() - drained
        assert took >= REPLICAS_FOR_S, f"fired {took:.1f} s after the drain, before its for: of {REPLICAS_FOR_S} s"
        assert [a["labels"]["host"] for a in got] == [drained_on], got
        # the other router's count has had as long (same for:, same evaluations) and one more evaluation: still quiet
        time.sleep(EVAL_S + 1)
        assert [a["labels"]["host"] for a in firing("D3ModelReplicasMissing", model=MODEL) or []] == [drained_on]
        assert not any(query(f'ALERTS{{alertname="D3ModelReplicasMissing",model="{MODEL}",host="{r}"}}') for r in quiet)
        print(f"D3ModelReplicasMissing fired for {drained_on} only, {took:.1f} s after the drain")
    finally:
        set_state(backend, server, "ready", drained_on)
    # given back (the alert stops on the next evaluations: not waited for)
    assert server_states(backend, drained_on)[server] == "UP"


def notifications(receiver: Path, since: float) -> list[dict[str, Any]]:
    """Every webhook POST the receiver got at or after ``since`` (wall time) on the alerts path (not the Watchdog's)."""
    records = [json.loads(line) for line in receiver.read_text().splitlines()]
    return [r for r in records if r["received"] >= since and r["path"] == "/alerts" and r["body"]]


def groups_firing(receiver: Path, since: float, started: str) -> dict[str, dict[str, Any]]:
    """groupKey -> {labels: the group's labels (alertname, host), names: the alert names, received: the first one's
    time} of the firing notifications
    since ``since`` whose alerts started at ``started`` or later (an earlier episode's retried notification is left
    out)."""
    out: dict[str, dict[str, Any]] = {}
    for record in notifications(receiver, since):
        body = record["body"]
        names = [a["labels"]["alertname"] for a in body["alerts"] if a["status"] == "firing" and a["startsAt"][:19] >= started]
        if names:
            group = out.setdefault(body["groupKey"], {"labels": body["groupLabels"], "names": [], "received": record["received"]})
            group["names"].extend(names)
    return out


STALL_S, GPU_FOR_S, TEXTFILE_S, HOST_DOWN_S = 20, 10, 10, 10  # the lab inventory's d3_metrics_* values


def test_three_faults_at_once_each_page_one_group_within_its_bound_then_resolve(
    planned: list[dict[str, Any]], host_names: list[str], receiver: Path
) -> None:
    """Three faults on three hosts at once (one wait instead of three: issue 32's drills ride together), each must give
    exactly one notification group at the webhook, for its own host, within its bound, and no other group may show;
    each resolves once undone. Grouping is by alertname and host and every inhibition is within a host, so faults on
    different hosts cannot hide or merge each other's pages.
    - a wedged engine: the simulator's STAND-IN wedge switch (D3_SIM_WEDGE_FILE, /tmp/d3-sim-wedge in the container)
      holds three requests on one instance without finishing any while /health still answers: D3EngineStalled within
      the stall window + three scrapes, an evaluation and group_wait;
    - nvidia-smi failing: the lab NVIDIA stand-in's gpu-lost switch (/run/lab-nvidia/gpu-lost: every query fails, exit
      15): D3GpuQueryFailed (its GPU count alert inhibited) within a textfile interval + d3_metrics_gpu_for + two
      scrapes, an evaluation and group_wait;
    - a router host stopped (podman stop; one that is not the monitor): D3HostDown (its D3RouterDown and target alerts
      inhibited) within d3_metrics_host_down_for + two scrapes, an evaluation and group_wait; started again
      (routerkit.restart_router: its VRRP link is made again) it resolves."""
    import labkit
    import routerkit
    from drillkit import ports

    victim = next(t["labels"] for t in planned if t["job"] == "d3-vllm")
    wedged, name = victim["host"], victim["name"]
    port = ports(wedged)[name]
    body = json.dumps({"model": victim["model"], "state": "x", "questions": {"q": {"type": "noul", "instructions": "ok?"}}})
    ask = f"curl -s -o /dev/null -m 150 http://127.0.0.1:{port}/v1/systemone -H 'Content-Type: application/json' -d '{body}'"
    if "WEDGE" not in on_host(wedged, f"podman exec {name} cat /opt/d3-sim/vllm_sim.py"):
        pytest.fail(f"{wedged}/{name} runs a simulator image without the wedge switch (lab/simulator): the lab registry's "
                    "images predate it; make lab (its images) from this tree, then converge")  # fmt: skip
    gpu_host = host_names[-1]
    if "GPU_LOST" not in on_host(gpu_host, "cat /usr/bin/nvidia-smi"):
        pytest.fail(f"{gpu_host}'s stand-in nvidia-smi predates the gpu-lost switch (lab/nvidia): re-create the lab "
                    "(make lab-down && make lab)")  # fmt: skip
    groups = labkit.lab_inventory()["all"]["children"]
    monitors = set(groups.get("d3-monitors", {}).get("hosts") or {})
    spare = [r for r in ROUTERS if r not in monitors]
    assert spare, f"the lab has no router that is not the monitor ({ROUTERS}): make lab (the router pair)"
    router = spare[0]
    assert len({wedged, gpu_host, router}) == 3, (wedged, gpu_host, router)

    def router_back() -> None:
        routerkit.restart_router(router)  # podman start, its VRRP link made again (a stop takes it), keepalived up
        wait_until(f"{router}'s node exporter up", lambda: query(f'up{{job="d3-node",host="{router}"}} == 1'), timeout=120, poll=1)

    drills = [
        {"what": f"wedged engine {wedged}/{name}", "alert": "D3EngineStalled", "host": wedged,
         "bound": STALL_S + 3 * SCRAPE_S + EVAL_S + GROUP_WAIT_S,
         "fault": lambda: on_host(wedged, f"podman exec {name} touch /tmp/d3-sim-wedge && for i in 1 2 3; do (setsid {ask} &) ; done"),
         "undo": lambda: on_host(wedged, f"podman exec {name} rm -f /tmp/d3-sim-wedge")},
        {"what": f"nvidia-smi failing on {gpu_host}", "alert": "D3GpuQueryFailed", "host": gpu_host,
         "bound": TEXTFILE_S + GPU_FOR_S + 2 * SCRAPE_S + EVAL_S + GROUP_WAIT_S,
         "fault": lambda: on_host(gpu_host, "touch /run/lab-nvidia/gpu-lost"),
         "undo": lambda: on_host(gpu_host, "rm -f /run/lab-nvidia/gpu-lost")},
        {"what": f"router host {router} stopped", "alert": "D3HostDown", "host": router,
         "bound": HOST_DOWN_S + 2 * SCRAPE_S + EVAL_S + GROUP_WAIT_S,
         "fault": lambda: labkit.podman("stop", "-t", "5", router, check=True), "undo": router_back},
    ]  # fmt: skip
    since, started = time.time(), time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1))
    done: list[dict[str, Any]] = []
    try:
        for drill in drills:
            drill["at"] = time.time()
            done.append(drill)
            drill["fault"]()

        def all_fired() -> bool | None:
            every = groups_firing(receiver, since, started)
            for drill in drills:
                own = [k for k, g in every.items() if g["labels"].get("host") == drill["host"] and drill["alert"] in g["names"]]
                if own and "fired_s" not in drill:  # the receiver's clock: the time the notification arrived
                    drill["fired_s"], drill["groups"] = round(min(every[k]["received"] for k in own) - drill["at"], 1), own
            return all("fired_s" in d for d in drills) or None

        try:
            wait_until("each fault's alert at the webhook", all_fired, timeout=max(d["bound"] for d in drills) + 60, poll=0.5)
        except AssertionError:
            missing = [d["what"] for d in drills if "fired_s" not in d]
            raise AssertionError(f"no page for {missing}; groups seen: {groups_firing(receiver, since, started)}") from None
        time.sleep(2 * EVAL_S + GROUP_WAIT_S)  # room for a second group to show (there must be none)
        every = groups_firing(receiver, since, started)
        for drill in drills:
            mine = {k: g for k, g in every.items() if g["labels"].get("host") == drill["host"]}
            assert list(mine) == drill["groups"] and set(mine[drill["groups"][0]]["names"]) == {drill["alert"]}, \
                f"{drill['what']}: notification groups for {drill['host']}: {mine}"  # fmt: skip
            assert drill["fired_s"] <= drill["bound"], f"{drill['what']}: {drill['alert']} reached the webhook " \
                f"{drill['fired_s']} s after the fault, bound {drill['bound']} s"  # fmt: skip
        assert set(every) == {d["groups"][0] for d in drills}, f"groups beside the three faults' own: {every}"
    finally:
        for drill in done:
            drill["undone"] = time.time()
            drill["undo"]()

    def resolved() -> bool | None:
        answered = notifications(receiver, since)
        for drill in drills:
            back = [r["received"] for r in answered if r["body"]["status"] == "resolved" and r["body"]["groupKey"] in drill["groups"]]
            if back and "resolved_s" not in drill:  # a resolve before the undo would be negative: checked below
                drill["resolved_s"] = round(min(back) - drill["undone"], 1)
        return all("resolved_s" in d for d in drills) or None

    wait_until("each fault's group resolved at the webhook", resolved, timeout=120, poll=0.5)
    assert all(d["resolved_s"] >= 0 for d in drills), drills  # resolved only once the fault was undone
    for drill in drills:
        print(f"{drill['what']}: one notification group ({drill['alert']}) {drill['fired_s']} s after the fault (bound "
              f"{drill['bound']} s), resolved {drill['resolved_s']} s after the fix")  # fmt: skip
    assert on_host(wedged, f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 http://127.0.0.1:{port}/health") == "200"
    wait_until("every router UP again", lambda: len(query('up{job="d3-router"} == 1')) == len(ROUTERS) or None, timeout=60, poll=1)


def test_the_watchdog_reaches_its_own_receiver_on_schedule(receiver: Path) -> None:
    """The always-firing Watchdog goes to its own receiver (the lab's /watchdog path) every d3_metrics_watchdog_interval
    (10 s; a gap of one or two intervals), and never to the alerts receiver."""
    interval = 10

    def posts() -> list[dict[str, Any]]:
        return [json.loads(line) for line in receiver.read_text().splitlines() if '"/watchdog"' in line]

    # read from the log the drills above filled (they ran minutes): no wait of its own unless this test runs alone
    got = wait_until("three Watchdog posts", lambda: (lambda p: p if len(p) >= 3 else None)(posts()), timeout=5 * interval, poll=0.5)
    gaps = [b["received"] - a["received"] for a, b in itertools.pairwise(got)]
    assert all(a["labels"]["alertname"] == "Watchdog" for r in got for a in r["body"]["alerts"])
    # Alertmanager re-sends a group once repeat_interval has passed, checked every group_interval (both 10 s here): a
    # check a moment early waits for the next one, so a gap is one or two intervals
    assert all(interval - 2 <= g <= 2 * interval + 2 for g in gaps), gaps
    assert not [r for r in notifications(receiver, 0) if any(a["labels"]["alertname"] == "Watchdog" for a in r["body"]["alerts"])]
    print(f"Watchdog every {[round(g, 1) for g in gaps]} s at its own receiver")
