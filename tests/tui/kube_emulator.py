"""A Kubernetes API *emulator* for the cluster-backend tests: kmock, not a real API server.

kmock (PyPI kmock==0.8) keeps objects in memory and answers list/watch/get/create/patch/delete
over HTTP on 127.0.0.1. It is an emulator: no controllers, no scheduler, no kubelet, no
admission, no real MPI Operator. Helm and the kubernetes client talk to it over HTTP as they
would to a cluster; the tests then play the MPI Operator's part (launcher pod, job conditions,
pod log) through the same API.

What helm 3 needs that kmock 0.8 does not do by itself, added here as small, explicit shims:
- `/api/v1` discovery answers groupVersion "/v1" (helm then finds no v1 kinds): re-served as "v1".
- `/version`: kmock says v1.26, below the chart's kubeVersion; served as v1.31.
- `/openapi/v3` and `/openapi/v2`: helm validates manifests against the server's OpenAPI; the
  emulator serves an empty document, so nothing is schema-checked (tests/chart does that).
- label selectors on list (helm finds its release Secrets by `owner=helm,name=<release>`; the
  backend finds the job's pods by label): filtered here.
- PUT (helm's update of its release Secret) is served as a merge PATCH of the same object.
- protobuf bodies: helm's release storage writes its Secrets as Kubernetes protobuf, which kmock
  cannot parse; `_secret_from_protobuf` decodes just those fields into the JSON object kmock keeps.
- server-side apply (helm 4 installs with it): an apply PATCH of an object that does not exist yet
  is served as a create (POST to its collection), of one that exists as a merge PATCH. There are
  no field managers or conflicts here: each install applies every object once.
Not supported by kmock and so avoided: `--create-namespace` (kmock cannot parse /namespaces
paths).

The tests play what the cluster's controllers would, through the same objects: the MPI Operator
(job conditions, pods with its labels, its Warning events), the kubelet (`PodLog`: a container's
log with RFC 3339 nano timestamps, `follow`, `sinceTime` and `timestamps` answered as the kubelet
does; the pod's phase when the container exits) and the garbage collector (`collect_garbage`:
pods of a deleted MPIJob go). `PodLog.drop_connections()` closes open log streams mid-response,
as a load balancer's idle timeout does.

HELM_DRIVER=memory is not used for these runs: in the helm CLI that driver swaps in a printing
fake kube client (helm.go loadReleasesInMemory), so helm would send nothing but discovery to the
emulator and a later `helm uninstall` process would not know the release. The default Secret
driver keeps the release in the emulator, as on a real cluster.
"""
from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import kmock
import yaml
from kmock import KubernetesEmulator

PROTOBUF = "application/vnd.kubernetes.protobuf"
APPLY_PATCH = "application/apply-patch+yaml"
NAMESPACE = "bench"


# --- protobuf: just enough to read a v1 Secret wrapped in runtime.Unknown --------------------

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(buf: bytes):
    """(field number, value) pairs of one protobuf message (varint and length-delimited only)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"protobuf wire type {wire} is not used by a Secret")
        yield number, value


def _map_entry(buf: bytes) -> tuple[str, bytes]:
    entry = dict(_fields(buf))
    return entry.get(1, b"").decode(), entry.get(2, b"")


def _secret_from_protobuf(body: bytes) -> dict:
    """k8s.io/api/core/v1 Secret (ObjectMeta name=1 namespace=3 labels=11; data=2; type=3)."""
    if body[:4] != b"k8s\x00":
        raise ValueError("not a Kubernetes protobuf body")
    raw = dict(_fields(body[4:]))[2]  # runtime.Unknown.raw
    meta: dict = {"labels": {}}
    secret: dict = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {}}
    for number, value in _fields(raw):
        if number == 1:
            for mnum, mval in _fields(value):
                if mnum == 1:
                    meta["name"] = mval.decode()
                elif mnum == 3:
                    meta["namespace"] = mval.decode()
                elif mnum == 11:
                    key, val = _map_entry(mval)
                    meta["labels"][key] = val.decode()
        elif number == 2:
            key, val = _map_entry(value)
            secret["data"][key] = base64.b64encode(val).decode()
        elif number == 3:
            secret["type"] = value.decode()
    return secret


# --- the emulator ------------------------------------------------------------------------------

class Emulator(KubernetesEmulator):
    """kmock's KubernetesEmulator plus the shims listed in the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.applied: list[str] = []  # paths of server-side apply requests, as sent
        self.pod_logs: dict[tuple[str, str], "PodLog"] = {}  # the current container's log per pod

    async def __call__(self, raw_request):
        if raw_request.headers.get("Content-Type", "").startswith(APPLY_PATCH):
            raw_request = await self._apply_as_create_or_merge(raw_request)
        if raw_request.method == "PUT":
            # kmock 0.8 maps no action to PUT (helm's release update); a merge-PATCH of the same
            # object has the same result here (helm rewrites the same keys), so serve it as one.
            raw_request = raw_request.clone(method="PATCH")
        if raw_request.headers.get("Content-Type", "").startswith(PROTOBUF):
            # Clone before reading: aiohttp refuses to clone a request whose body was read.
            clone = raw_request.clone(method=raw_request.method,
                                      headers={**raw_request.headers, "Content-Type": "application/json"})
            body = await raw_request.read()
            clone._read_bytes = json.dumps(_secret_from_protobuf(body)).encode()
            raw_request = clone
        return await super().__call__(raw_request)

    async def _apply_as_create_or_merge(self, raw_request):
        path = raw_request.path.rstrip("/")
        self.applied.append(path)
        collection, name = path.rsplit("/", 1)
        plural = collection.rsplit("/", 1)[1]
        parts = path.split("/")
        namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts else None
        exists = any(res.plural == plural and ns == namespace and key == name and not obj.deleted
                     for (res, ns, key), obj in self.objects.items())
        # Clone before reading: aiohttp refuses to clone a request whose body was read.
        if exists:
            clone = raw_request.clone(headers={**raw_request.headers,
                                               "Content-Type": "application/merge-patch+json"})
        else:
            clone = raw_request.clone(method="POST", rel_url=collection,
                                      headers={**raw_request.headers, "Content-Type": "application/json"})
        body = json.dumps(yaml.safe_load(await raw_request.read())).encode()  # YAML or JSON
        clone._read_bytes = body
        return clone


def _selector(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def install_shims(emu: Emulator, with_mpi_operator: bool = True) -> None:
    emu.resources.load_bundled()
    if with_mpi_operator:
        emu.resources["kubeflow.org/v2beta1/mpijobs"] = kmock.ResourceInfo(
            kind="MPIJob", singular="mpijob", namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"})
    # kmock reports v1.26; the chart declares kubeVersion >=1.28 (MPI Operator v0.8 needs it).
    # The Python client asks for /version/ (trailing slash), which kmock does not route.
    version = {"major": "1", "minor": "31", "gitVersion": "v1.31.0-kmock", "gitCommit": "0" * 40,
               "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
               "compiler": "gc", "platform": "linux/amd64"}
    emu["get /version"] << version
    emu["get /version/"] << version
    emu["get /openapi/v3"] << {"paths": {}}
    emu["get /openapi/v2"] << b""

    async def core_v1(request):
        doc = await emu._serve_version(request)
        return {**doc, "groupVersion": "v1"}

    emu["get /api/v1"] << core_v1

    def selected(plural: str, kind: str):
        def answer(request):
            wanted = _selector(request.params.get("labelSelector", ""))
            items = []
            for (res, ns, _name), obj in emu.objects.items():
                if res.plural != plural or obj.deleted or request.namespace not in (None, ns):
                    continue
                labels = (obj.raw.get("metadata") or {}).get("labels") or {}
                if all(labels.get(k) == v for k, v in wanted.items()):
                    items.append(obj.raw)
            return {"apiVersion": "v1", "kind": f"{kind}List", "metadata": {"resourceVersion": "1"}, "items": items}
        return answer

    for plural, kind in (("secrets", "Secret"), ("pods", "Pod")):
        emu[kmock.action.LIST, kmock.resource(f"v1/{plural}")] << selected(plural, kind)


def write_kubeconfig(path: Path, url: str, namespace: str = NAMESPACE) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: kmock\n  cluster:\n    server: {url}\n"
        f"contexts:\n- name: kmock\n  context: {{cluster: kmock, user: tester, namespace: {namespace}}}\n"
        "current-context: kmock\n"
        "users:\n- name: tester\n  user: {token: emulator}\n")
    return path


# --- the MPI Operator's part, played through the API -------------------------------------------

def mpijobs(emu: Emulator, namespace: str = NAMESPACE) -> dict[str, dict]:
    return {name: obj.raw for (res, ns, name), obj in emu.objects.items()
            if res.plural == "mpijobs" and ns == namespace and not obj.deleted}


async def wait_for_mpijob(emu: Emulator, timeout: float = 60.0, namespace: str = NAMESPACE) -> dict:
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    while loop.time() < until:
        jobs = mpijobs(emu, namespace)
        if jobs:
            return next(iter(jobs.values()))
        await asyncio.sleep(0.1)
    raise AssertionError("helm created no MPIJob in the emulator")


async def set_conditions(emu: Emulator, job: str, *types: str, message: str = "",
                         namespace: str = NAMESPACE) -> None:
    """PATCH the job's status through the API, as the operator does (so watchers see MODIFIED)."""
    conditions = [{"type": t, "status": "True", "reason": f"MPIJob{t}", "message": message or t}
                  for t in types]
    url = f"/apis/kubeflow.org/v2beta1/namespaces/{namespace}/mpijobs/{job}"
    async with emu.patch(url, json={"status": {"conditions": conditions}},
                         headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status == 200, await resp.text()


def add_pod(emu: Emulator, job: str, role: str, phase: str, waiting: str | None = None,
            terminated: dict | None = None, namespace: str = NAMESPACE, release: str | None = None,
            name: str | None = None) -> str:
    """A pod of `job` as the operator names and labels it; `terminated`: its container's
    terminated state (exitCode, reason, message), as the kubelet reports a crashed container.
    `name`: another pod of the same role (worker 1, the pod of a retried launcher)."""
    name = name or (f"{job}-{role}" if role == "launcher" else f"{job}-{role}-0")
    status: dict = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": role, "ready": False,
                                        "state": {"waiting": {"reason": waiting, "message": f"{waiting} for image"}}}]
    if terminated:
        status["containerStatuses"] = [{"name": role, "ready": False, "state": {"terminated": terminated}}]
    labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/job-role": role,
              # the chart's pod template labels: the release is the job name less "-shardbench"
              "app.kubernetes.io/instance": release or job.removesuffix("-shardbench")}
    emu.objects["v1/pods", namespace, name] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "status": status,
    }
    return name


def set_pod_status(emu: Emulator, pod: str, status: dict, namespace: str = NAMESPACE) -> None:
    raw = dict(emu.objects["v1/pods", namespace, pod].raw)
    emu.objects["v1/pods", namespace, pod] = {**raw, "status": status}


def add_event(emu: Emulator, name: str, reason: str, message: str, kind: str = "Pod",
              namespace: str = NAMESPACE, age_s: float = 0.0) -> None:
    """A Warning event about object `name` (what `kubectl describe` lists under Events), last
    seen `age_s` seconds ago (an earlier attempt's event is minutes old)."""
    seen = datetime.now(timezone.utc) - timedelta(seconds=age_s)
    emu.objects["v1/events", namespace, f"{name}.{reason.lower()}"] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name}.{reason.lower()}", "namespace": namespace},
        "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
        "type": "Warning", "reason": reason, "message": message,
        "lastTimestamp": seen.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


async def collect_garbage(emu: Emulator, namespace: str = NAMESPACE) -> None:
    """Kubernetes' garbage collector for the job's pods (their owner is the MPIJob, or its
    launcher Job): when an MPIJob is deleted, its pods go too. Runs until cancelled."""
    while True:
        gone = {name for (res, ns, name), obj in emu.objects.items()
                if res.plural == "mpijobs" and ns == namespace and obj.deleted}
        for (res, ns, name), obj in list(emu.objects.items()):
            labels = ((obj.raw.get("metadata") or {}).get("labels") or {}) if not obj.deleted else {}
            if res.plural == "pods" and labels.get("training.kubeflow.org/job-name") in gone:
                obj.delete()
        await asyncio.sleep(0.05)


def _rfc3339_nano(t: datetime) -> str:
    """As the kubelet writes log timestamps (Go's RFC3339Nano: trailing zeros trimmed)."""
    nanos = f"{t.microsecond * 1000:09d}".rstrip("0")
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{nanos}" if nanos else "") + "Z"


class PodLog:
    """One container's log as the kubelet serves it at /api/v1/namespaces/<ns>/pods/<pod>/log.

    Lines get the time they were written. A request gets the lines from `sinceTime` on (RFC 3339,
    second precision; lines of that second included, as the kubelet does), each prefixed with its
    timestamp when `timestamps=true`; with `follow=true` it stays open for new lines until the
    container ends. `drop_connections()` closes the open follow streams without ending them.
    """

    def __init__(self, emu: Emulator, pod: str, namespace: str = NAMESPACE):
        self.emu, self.pod, self.namespace = emu, pod, namespace
        self.lines: list[tuple[datetime, str]] = []
        self.ended = False
        self.requests: list[dict] = []  # query parameters of every request, in order
        self._changed = asyncio.Event()
        self._open: set = set()
        key = (namespace, pod)
        if key not in emu.pod_logs:  # one route per pod; a pod created again gets a new log
            emu[f"get /api/v1/namespaces/{namespace}/pods/{pod}/log"] << (
                lambda request: emu.pod_logs[key]._serve(request))
        emu.pod_logs[key] = self

    def write(self, text: str) -> None:
        self.lines.append((datetime.now(timezone.utc), text))
        self._poke()

    def end(self) -> None:
        self.ended = True
        self._poke()

    def drop_connections(self) -> int:
        """Close every open follow stream mid-response (a load balancer's idle timeout)."""
        dropped = list(self._open)
        for transport in dropped:
            transport.close()
        self._open.clear()
        self._poke()
        return len(dropped)

    async def play(self, lines: list[str], delay_s: float = 0.05, exit_code: int = 0,
                   drop_at: int | None = None, silence_s: float = 0.0) -> None:
        """The container's run: a line every `delay_s`; at line `drop_at` a silence of
        `silence_s` during which the connections are dropped; then it exits with `exit_code`
        and the pod's phase says so."""
        for i, line in enumerate(lines):
            if i == drop_at:
                await asyncio.sleep(silence_s / 2)
                self.drop_connections()
                await asyncio.sleep(silence_s / 2)
            self.write(line)
            await asyncio.sleep(delay_s)
        self.end()
        if any(res.plural == "pods" and (ns, name) == (self.namespace, self.pod) and not obj.deleted
               for (res, ns, name), obj in self.emu.objects.items()):
            done = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
            set_pod_status(self.emu, self.pod, {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": [{"name": "launcher", "ready": False, "state": {"terminated": done}}]},
                self.namespace)

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _serve(self, request):
        params = dict(request.params)
        self.requests.append(params)
        return self._stream(request, params)

    async def _stream(self, request, params: dict):
        since = params.get("sinceTime")
        since_t = datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None
        stamps, follow = params.get("timestamps") == "true", params.get("follow") == "true"
        transport = request._raw_request.transport
        self._open.add(transport)
        try:
            yield b""  # kmock sends the headers with the first chunk; an empty log is still a 200
            sent = 0
            while True:
                for t, text in self.lines[sent:]:
                    if since_t is None or t >= since_t:
                        yield ((_rfc3339_nano(t) + " ") if stamps else "").encode() + text.encode() + b"\n"
                sent = len(self.lines)
                if self.ended or not follow or transport.is_closing():
                    return
                await self._changed.wait()
        finally:
            self._open.discard(transport)


def serve_log(emu: Emulator, pod: str, lines: list[str], delay_s: float = 0.05, exit_code: int = 0,
              namespace: str = NAMESPACE, **play) -> PodLog:
    """The pod's container runs now: its log is written a line at a time (a follow=true reader
    sees them arrive), then the container exits (see PodLog.play)."""
    log = PodLog(emu, pod, namespace)
    log.task = asyncio.get_running_loop().create_task(log.play(lines, delay_s, exit_code, **play))
    return log
