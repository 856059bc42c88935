"""The Runpod provisioner against a stand-in cloud (the real service cannot be reached from here).

`FileCloud` implements the PodApi surface with its state in a JSON file, so a provisioner in a
child process that is SIGKILLed leaves pods behind in it for the parent to reap. The real
adapter (`RunpodApi`) is exercised through the real `runpod` SDK against a local HTTP server
that answers the SDK's GraphQL calls.
"""

from __future__ import annotations

import atexit
import base64
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nestor.pool.cost import CostMatrix, MatrixEntry
from nestor.pool.podapi import GpuStock, Pod, PodApiError, PodSpec, RunpodApi, StockOutError
from nestor.pool.podledger import PodLedger
from nestor.pool.runpod import (
    PodType,
    Provisioner,
    RunpodConfig,
    bootstrap_args,
    cost_order,
    pool_demand,
    reap,
    worker_types,
)

A40 = PodType(worker_type="a40", gpu_type_id="NVIDIA A40", price_per_hr=0.40)
L40S = PodType(worker_type="l40s", gpu_type_id="NVIDIA L40S", price_per_hr=0.80)
H100 = PodType(worker_type="h100", gpu_type_id="NVIDIA H100 PCIe", price_per_hr=2.40)


class FileCloud:
    """A pod cloud whose state lives in one JSON file (flock-guarded): stock per GPU type,
    pods by id, and a log of calls."""

    def __init__(self, path: Path, stock: dict[str, int] | None = None):
        self.path = Path(path)
        if stock is not None:
            self._save({"stock": stock, "pods": {}, "next": 0, "calls": []})

    def _load(self) -> dict:
        return json.loads(self.path.read_text())

    def _save(self, state: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)

    def _edit(self, fn):
        with open(str(self.path) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._load()
            out = fn(state)
            self._save(state)
            return out

    # --- PodApi ---
    def create(self, spec: PodSpec) -> Pod:
        def go(s):
            s["calls"].append(["create", spec.gpu_type_id])
            if s["stock"].get(spec.gpu_type_id, 0) <= 0:
                raise StockOutError("There are no longer any instances available")
            s["stock"][spec.gpu_type_id] -= 1
            s["next"] += 1
            pid = f"pod{s['next']}"
            s["pods"][pid] = {"name": spec.name, "gpu": spec.gpu_type_id, "status": "RUNNING",
                              "env": spec.env, "docker_args": spec.docker_args}
            return Pod(pid, spec.name, spec.gpu_type_id, "CREATED")
        return self._edit(go)

    def list(self) -> list[Pod]:
        return [Pod(k, v["name"], v["gpu"], v["status"], ready=v.get("ready", True))
                for k, v in self._load()["pods"].items()]

    def get(self, pod_id: str) -> Pod | None:
        return next((p for p in self.list() if p.id == pod_id), None)

    def terminate(self, pod_id: str) -> None:
        def go(s):
            s["calls"].append(["terminate", pod_id])
            pod = s["pods"].pop(pod_id, None)
            if pod:
                s["stock"][pod["gpu"]] = s["stock"].get(pod["gpu"], 0) + 1
        self._edit(go)

    def gpu_stock(self, gpu_type_ids: list[str]) -> dict[str, GpuStock]:
        stock = self._load()["stock"]
        return {g: GpuStock(g, available=stock.get(g, 0) > 0) for g in gpu_type_ids}

    # --- what the tests do to the cloud ---
    def kill(self, pod_id: str, status: str = "EXITED") -> None:
        def go(s):
            s["pods"][pod_id]["status"] = status
        self._edit(go)

    def stall_boot(self, pod_id: str) -> None:
        def go(s):
            s["pods"][pod_id]["ready"] = False
        self._edit(go)

    def set_stock(self, gpu: str, n: int) -> None:
        def go(s):
            s["stock"][gpu] = n
        self._edit(go)

    def pods(self) -> dict:
        return self._load()["pods"]


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def make(tmp_path, stock, *, demand=None, clock=None, **cfg):
    cloud = FileCloud(tmp_path / "cloud.json", stock)
    config = RunpodConfig(ray_address="10.0.0.1:6379", pod_types=[H100, L40S, A40], **cfg)
    prov = Provisioner(config, cloud, tmp_path / "run", demand=demand, clock=clock or Clock())
    return cloud, prov


def gpus(cloud: FileCloud) -> list[str]:
    return sorted(p["gpu"] for p in cloud.pods().values())


def test_fills_cheapest_first_and_falls_back_in_cost_order_on_stock_out(tmp_path):
    cloud, prov = make(tmp_path, {"NVIDIA A40": 2, "NVIDIA L40S": 1, "NVIDIA H100 PCIe": 9},
                       max_pods=4, max_cost_usd=100)
    prov.tick()
    assert gpus(cloud) == ["NVIDIA A40", "NVIDIA A40", "NVIDIA H100 PCIe", "NVIDIA L40S"]
    assert len(prov.live()) == 4
    # Every pod carries the bootstrap that joins Ray with its worker type's resource.
    for pod in cloud.pods().values():
        script = base64.b64decode(pod["env"]["NESTOR_BOOTSTRAP"]).decode()
        wtype = {"NVIDIA A40": "a40", "NVIDIA L40S": "l40s", "NVIDIA H100 PCIe": "h100"}[pod["gpu"]]
        assert f'"worker:{wtype}": 1' in script and "--address=10.0.0.1:6379" in script
        assert '"' not in pod["docker_args"] and "$NESTOR_BOOTSTRAP" in pod["docker_args"]


def test_stock_out_discovered_at_create_falls_back(tmp_path):
    """The stock view says A40 is there, but create finds it gone (a race): next type."""
    cloud, prov = make(tmp_path, {"NVIDIA A40": 1, "NVIDIA L40S": 5}, max_pods=1,
                       max_cost_usd=100)
    cloud.gpu_stock = lambda ids: {g: GpuStock(g, available=True) for g in ids}
    cloud.set_stock("NVIDIA A40", 0)
    prov.tick()
    assert gpus(cloud) == ["NVIDIA L40S"]
    assert ("stock-out" in {k for k, _ in prov.events})


def test_measured_matrix_overrides_hourly_price(tmp_path):
    """An H100 that finishes a job 10x faster is cheaper per job than an A40 at 1/6 the price."""
    cloud = FileCloud(tmp_path / "cloud.json", {"NVIDIA A40": 5, "NVIDIA H100 PCIe": 5})
    config = RunpodConfig(ray_address="h:1", pod_types=[A40, H100], max_pods=1)
    matrix = CostMatrix(entries=[
        MatrixEntry(worker_type="a40", base_model="qwen3-1.7b", seconds=600, dollars=0.0667),
        MatrixEntry(worker_type="h100", base_model="qwen3-1.7b", seconds=60, dollars=0.04)])
    prov = Provisioner(config, cloud, tmp_path / "run", clock=Clock(), matrix=matrix,
                       base_model="qwen3-1.7b")
    prov.tick()
    assert gpus(cloud) == ["NVIDIA H100 PCIe"]
    # For a model the matrix has not measured, price per hour decides.
    assert [t.worker_type for t in cost_order(config, matrix, "qwen3-0.6b")] == ["a40", "h100"]


def test_pool_worker_types_ask_for_what_the_pods_advertise():
    config = RunpodConfig(ray_address="h:1", pod_types=[A40, L40S], gpu_count=2)
    types = worker_types(config, {"NVIDIA L40S": 0.79})
    assert [(t.name, t.resources, t.num_gpus, t.price_per_hour) for t in types] == [
        ("a40", {"worker:a40": 2}, 2, 0.40), ("l40s", {"worker:l40s": 2}, 2, 0.79)]
    script = base64.b64decode(bootstrap_args(config, L40S)[1]["NESTOR_BOOTSTRAP"]).decode()
    assert '--resources=\'{"worker:l40s": 2}\'' in script and "--num-gpus=2" in script


def test_dead_pod_is_terminated_and_replaced(tmp_path):
    clock = Clock()
    cloud, prov = make(tmp_path, {"NVIDIA A40": 5}, max_pods=2, clock=clock)
    prov.tick()
    first = sorted(cloud.pods())
    clock.advance(120)
    cloud.kill(first[0])
    prov.tick()
    assert first[0] not in cloud.pods()          # the exited pod no longer bills
    assert len(cloud.pods()) == 2 and len(prov.live()) == 2
    reasons = {r.pod_id: r.end_reason for r in prov.ledger.rows()}
    assert reasons[first[0]] == "died"
    # A pod vanishing from the list counts as dead too (after the list grace period).
    vanished = sorted(cloud.pods())[-1]
    cloud._edit(lambda s: s["pods"].pop(vanished))
    clock.advance(120)
    prov.tick()
    assert len(cloud.pods()) == 2 and vanished not in cloud.pods()


def test_pod_that_never_boots_is_replaced(tmp_path):
    clock = Clock()
    cloud, prov = make(tmp_path, {"NVIDIA A40": 5}, max_pods=1, clock=clock, boot_timeout_s=600)
    prov.tick()
    (stuck,) = cloud.pods()
    cloud.stall_boot(stuck)
    clock.advance(300)
    prov.tick()
    assert list(cloud.pods()) == [stuck]          # still within its boot time
    clock.advance(400)
    prov.tick()
    assert stuck not in cloud.pods() and len(cloud.pods()) == 1
    assert {r.pod_id: r.end_reason for r in prov.ledger.rows()}[stuck] == "boot-timeout"


def test_scales_down_after_idle_timeout_most_expensive_first(tmp_path):
    clock, want = Clock(), [3]
    cloud, prov = make(tmp_path, {"NVIDIA A40": 2, "NVIDIA L40S": 2}, max_pods=4, clock=clock,
                       demand=lambda: want[0], idle_timeout_s=300)
    prov.tick()
    assert gpus(cloud) == ["NVIDIA A40", "NVIDIA A40", "NVIDIA L40S"]
    want[0] = 1
    prov.tick()
    clock.advance(200)
    prov.tick()
    assert len(cloud.pods()) == 3                 # not idle long enough yet
    clock.advance(200)
    prov.tick()
    assert gpus(cloud) == ["NVIDIA A40"]


def test_demand_follows_the_pool(tmp_path):
    class Pool:  # the two things pool_demand reads from a ScheduledPool
        def __init__(self):
            self.busy, self._pending = 0, []

        def workers(self):
            return [{"busy": i < self.busy} for i in range(4)]

    pool, clock = Pool(), Clock()
    cloud, prov = make(tmp_path, {"NVIDIA A40": 9}, max_pods=6, clock=clock,
                       demand=pool_demand(pool), idle_timeout_s=60)
    pool.busy, pool._pending = 3, ["job"] * 2
    prov.tick()
    assert len(cloud.pods()) == 5
    pool.busy, pool._pending = 1, []
    prov.tick()
    clock.advance(61)
    prov.tick()
    assert len(cloud.pods()) == 1


def test_spend_cap_refuses_new_pods_and_terminates_when_reached(tmp_path):
    clock = Clock()
    # $1.05 cap, 10-minute horizon: an A40 at $0.40/h projects $0.067; the 16th is refused.
    cloud, prov = make(tmp_path, {"NVIDIA A40": 99}, max_pods=20, clock=clock, max_cost_usd=1.05,
                       cap_horizon_s=600, poll_s=60)
    prov.tick()
    assert len(cloud.pods()) == 15
    assert any(k == "refused" for k, _ in prov.events)
    clock.advance(3600 * 1.0 / 6.0 - 120)         # 15 × $0.40/h ≈ $1/10 min
    prov.tick()
    assert len(cloud.pods()) == 15 and not prov.capped
    clock.advance(120)                            # $1.00 spent; the next minute would pass it
    prov.tick()
    assert prov.capped and cloud.pods() == {}
    assert prov.spent_usd() <= 1.05
    prov.tick()
    assert cloud.pods() == {}                     # no new pods after the cap


def test_shutdown_terminates_everything_and_is_idempotent(tmp_path):
    cloud, prov = make(tmp_path, {"NVIDIA A40": 3}, max_pods=3)
    with prov:
        prov.tick()
        assert len(cloud.pods()) == 3
    assert cloud.pods() == {}
    prov.shutdown()
    assert all(not r.open for r in prov.ledger.rows())


def test_terminate_failure_keeps_the_row_for_a_retry(tmp_path):
    cloud, prov = make(tmp_path, {"NVIDIA A40": 1}, max_pods=1)
    prov.tick()
    real = cloud.terminate
    cloud.terminate = lambda pid: (_ for _ in ()).throw(PodApiError("network down"))
    prov.shutdown()
    assert len(prov.ledger.rows(open_only=True)) == 1   # still owed a terminate
    cloud.terminate = real
    owed = list(cloud.pods())
    assert reap(prov.ledger, cloud) == owed
    assert cloud.pods() == {} and prov.ledger.rows(open_only=True) == []


CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from test_runpod import FileCloud, A40
from nestor.pool.runpod import Provisioner, RunpodConfig
cloud = FileCloud({cloud!r})
prov = Provisioner(RunpodConfig(ray_address="h:1", pod_types=[A40], max_pods=3), cloud, {run!r})
prov.start()
prov.tick()
# A pod created behind the ledger's back (killed between create and insert) is found by name.
from nestor.pool.podapi import PodSpec
cloud.create(PodSpec(name=prov.ledger.name_prefix() + "orphan", gpu_type_id="NVIDIA A40", image="x"))
print("ready", flush=True)
time.sleep(60)
"""


def _child(tmp_path, run: Path) -> subprocess.Popen:
    code = CHILD.format(tests=str(Path(__file__).parent), cloud=str(tmp_path / "cloud.json"),
                        run=str(run))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_reap_after_sigkill(tmp_path):
    cloud = FileCloud(tmp_path / "cloud.json", {"NVIDIA A40": 9})
    cloud.create(PodSpec(name="someone-elses-pod", gpu_type_id="NVIDIA A40", image="x"))
    run = tmp_path / "run"
    proc = _child(tmp_path, run)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(cloud.pods()) == 5                 # 3 + the orphan + the stranger: all billing
    reaped = reap(PodLedger(run), cloud)
    assert len(reaped) == 4
    assert [p["name"] for p in cloud.pods().values()] == ["someone-elses-pod"]
    assert PodLedger(run).rows(open_only=True) == []


def test_next_start_reconciles_a_crashed_session(tmp_path):
    cloud = FileCloud(tmp_path / "cloud.json", {"NVIDIA A40": 9})
    run = tmp_path / "run"
    proc = _child(tmp_path, run)
    proc.kill()
    proc.wait()
    config = RunpodConfig(ray_address="h:1", pod_types=[A40], max_pods=2)
    prov = Provisioner(config, cloud, run)
    reaped = prov.start(handlers=False)
    assert len(reaped) == 4
    prov.tick()
    assert sorted(cloud.pods()) == sorted(r.pod_id for r in prov.live()) and len(prov.live()) == 2
    prov.shutdown()
    assert cloud.pods() == {}


def test_sigint_terminates_pods(tmp_path):
    cloud = FileCloud(tmp_path / "cloud.json", {"NVIDIA A40": 9})
    code = CHILD.format(tests=str(Path(__file__).parent), cloud=str(tmp_path / "cloud.json"),
                        run=str(tmp_path / "run")).replace("time.sleep(60)",
                                                            "prov.run()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    # Its own 3 pods are gone; only the orphan (never in its ledger) is left, for reap.
    assert [p["name"].endswith("orphan") for p in cloud.pods().values()] == [True]


def test_a_signal_inside_a_cloud_call_terminates_after_it_unwinds(tmp_path):
    """Ctrl-C landing inside a cloud call (one that holds a lock, as an HTTP client's pool or
    FileCloud's flock does) must not call the cloud again from the handler: that deadlocked
    (seen as a 30-s hang of test_sigint_terminates_pods in CI). The pods still all go."""
    cloud = FileCloud(tmp_path / "cloud.json", {"NVIDIA A40": 9})
    busy, reentered, sent, armed = threading.Lock(), [], [], threading.Event()

    class OneCallAtATime:
        def __getattr__(self, name):
            def call(*args, **kwargs):
                if not busy.acquire(timeout=2):  # held by the call the signal interrupted
                    reentered.append(name)
                    raise PodApiError(f"{name} re-entered a call in flight")
                try:
                    out = getattr(cloud, name)(*args, **kwargs)
                    if name == "list" and armed.is_set() and not sent:  # Ctrl-C mid-call
                        sent.append(True)
                        os.kill(os.getpid(), signal.SIGINT)
                        time.sleep(0.1)  # the handler runs here, inside the call
                    return out
                finally:
                    busy.release()
            return call

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    prov = Provisioner(RunpodConfig(ray_address="h:1", pod_types=[A40], max_pods=3),
                       OneCallAtATime(), tmp_path / "run")
    try:
        prov.start()
        prov.tick()  # three pods
        armed.set()
        with pytest.raises(KeyboardInterrupt):
            prov.run()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        atexit.unregister(prov.shutdown)
    assert sent and reentered == []
    assert cloud.pods() == {}
    assert {r.end_reason for r in PodLedger(tmp_path / "run").rows()} == {"sigint"}


# --- the real adapter, through the real SDK, against a local GraphQL stand-in -----------------

class _GraphQL(BaseHTTPRequestHandler):
    pods: dict = {}

    def log_message(self, *a):
        pass

    def do_POST(self):
        query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["query"]
        assert self.headers["Authorization"] == "Bearer test-key"
        if "podFindAndDeployOnDemand" in query:
            gpu = re.search(r'gpuTypeId: "([^"]+)"', query).group(1)
            if gpu == "NVIDIA L40S":
                body = {"errors": [{"message": "There are no longer any instances available "
                                               "with the requested specifications."}]}
            else:
                name = re.search(r'name: "([^"]+)"', query).group(1)
                self.pods["p1"] = {"id": "p1", "name": name, "desiredStatus": "RUNNING",
                                   "costPerHr": 0.44, "machine": {"gpuDisplayName": "A40"},
                                   "runtime": {"ports": []}}
                body = {"data": {"podFindAndDeployOnDemand": {"id": "p1"}}}
        elif "podTerminate" in query:
            self.pods.pop(re.search(r'podId: "([^"]+)"', query).group(1), None)
            body = {"data": {"podTerminate": None}}
        elif "stockStatus" in query:
            gpu = re.search(r'id: "([^"]+)"', query).group(1)
            level = None if gpu == "NVIDIA L40S" else "High"
            body = {"data": {"gpuTypes": [{"id": gpu, "securePrice": 0.5, "lowestPrice": {
                "uninterruptablePrice": 0.44, "stockStatus": level}}]}}
        elif "gpuTypes" in query:  # create_pod() first checks that the GPU type exists
            gpu = re.search(r'id: "([^"]+)"', query).group(1)
            body = {"data": {"gpuTypes": [{"id": gpu}]}}
        elif "myPods" in query:
            body = {"data": {"myself": {"pods": list(self.pods.values())}}}
        else:
            body = {"errors": [{"message": "unexpected query"}]}
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def graphql(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GraphQL)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", f"http://127.0.0.1:{server.server_port}")
    _GraphQL.pods = {}
    yield
    server.shutdown()


def test_runpod_adapter_speaks_the_sdk(graphql):
    api = RunpodApi(api_key="test-key")
    stock = api.gpu_stock(["NVIDIA A40", "NVIDIA L40S"])
    assert stock["NVIDIA A40"].available and stock["NVIDIA A40"].price_per_hr == 0.44
    assert not stock["NVIDIA L40S"].available
    docker_args, env = bootstrap_args(RunpodConfig(ray_address="h:1"), A40)
    with pytest.raises(StockOutError):
        api.create(PodSpec(name="nestor-x-1", gpu_type_id="NVIDIA L40S", image="img",
                           docker_args=docker_args, env=env))
    pod = api.create(PodSpec(name="nestor-x-1", gpu_type_id="NVIDIA A40", image="img",
                             docker_args=docker_args, env=env))
    assert [(p.id, p.name, p.alive, p.ready) for p in api.list()] == [
        ("p1", "nestor-x-1", True, True)]
    api.terminate(pod.id)
    assert api.list() == []
    with pytest.raises(PodApiError, match="quote"):
        api.create(PodSpec(name='bad"name', gpu_type_id="NVIDIA A40", image="img"))


def test_runpod_adapter_without_key_is_a_clear_error(monkeypatch):
    import runpod

    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.setattr(runpod, "api_key", None)
    with pytest.raises(PodApiError, match="RUNPOD_API_KEY"):
        RunpodApi()


# --- the CLI ------------------------------------------------------------------------------------

def test_cli_list_and_reap_through_the_sdk(graphql, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nestor.cli import app

    monkeypatch.setenv("RUNPOD_API_KEY", "test-key")
    run = tmp_path / "run"
    config = RunpodConfig(ray_address="h:1", pod_types=[A40], max_pods=1)
    prov = Provisioner(config, RunpodApi(), run)
    prov.tick()                                    # creates p1 on the stand-in server
    assert list(_GraphQL.pods) == ["p1"]
    prov.ledger.close()                            # the process "dies" without shutdown

    runner = CliRunner()
    out = runner.invoke(app, ["pods", "list", str(run), "--json"])
    assert out.exit_code == 0, out.output
    listed = json.loads(out.stdout)
    assert listed["open"] == 1 and listed["pods"][0]["pod_id"] == "p1"
    out = runner.invoke(app, ["pods", "reap", str(run), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"reaped": ["p1"]} and _GraphQL.pods == {}
    out = runner.invoke(app, ["pods", "list", str(run), "--json"])
    assert json.loads(out.stdout)["pods"][0]["end_reason"] == "reaped"
    out = runner.invoke(app, ["pods", "list", str(tmp_path / "nowhere")])
    assert out.exit_code == 2 and "no pods.sqlite" in out.output


def test_cli_up_terminates_its_pods_on_ctrl_c(graphql, tmp_path):
    (tmp_path / "cluster.toml").write_text(
        '[runpod]\nray_address = "10.0.0.1:6379"\nmax_pods = 1\npoll_s = 0.5\n'
        '[[runpod.pod_types]]\nworker_type = "a40"\ngpu_type_id = "NVIDIA A40"\n'
        'price_per_hr = 0.4\n')
    env = {**os.environ, "RUNPOD_API_KEY": "test-key"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from nestor.cli import app; app()", "pods", "up",
         str(tmp_path / "cluster.toml"), "--run-dir", str(tmp_path / "run"), "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _GraphQL.pods and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert list(_GraphQL.pods) == ["p1"], proc.stderr.read() if proc.poll() is not None else ""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert _GraphQL.pods == {}
    assert json.loads(out)["events"][-1] == ["terminated-sigint", "p1"]
    rows = PodLedger(tmp_path / "run").rows()
    assert [(r.pod_id, r.end_reason) for r in rows] == [("p1", "sigint")]


def test_the_configs_in_docs_cluster_md_are_valid():
    import tomllib

    from nestor.inner.prime_rl import PrimeRLConfig
    from nestor.pool.config import PoolConfig

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    blocks = [tomllib.loads("\n".join(line[3:] if line.startswith("   ") else line
                                      for line in b.split("```")[0].splitlines()))
              for b in doc.split("```toml\n")[1:]]
    runpod_cfg = next(b for b in blocks if "runpod" in b)["runpod"]
    config = RunpodConfig.model_validate(runpod_cfg)
    assert config.max_pods == 16 and [t.worker_type for t in config.pod_types] == ["a40", "l40s"]
    pool_doc = next(b for b in blocks if "pool" in b)
    pool = PoolConfig.model_validate(pool_doc["pool"])
    PrimeRLConfig.model_validate(pool_doc["prime_rl"])
    # The documented pool asks for exactly what the documented pods advertise.
    assert {t.name: t.resources for t in pool.worker_types} == {
        t.name: t.resources for t in worker_types(config)}
