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
  no field managers or conflicts here: each test applies every object once.
Not supported by kmock and so avoided: `--create-namespace` (kmock cannot parse /namespaces
paths).

HELM_DRIVER=memory is not used for these runs: in the helm CLI that driver swaps in a printing
fake kube client (helm.go loadReleasesInMemory), so helm would send nothing but discovery to the
emulator and a later `helm uninstall` process would not know the release. The default Secret
driver keeps the release in the emulator, as on a real cluster.
"""
from __future__ import annotations

import asyncio
import base64
import json
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
            namespace: str = NAMESPACE) -> str:
    name = f"{job}-{role}" if role == "launcher" else f"{job}-{role}-0"
    status: dict = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": "main", "ready": False,
                                        "state": {"waiting": {"reason": waiting, "message": f"{waiting} for image"}}}]
    emu.objects["v1/pods", namespace, name] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"training.kubeflow.org/job-name": job, "training.kubeflow.org/job-role": role}},
        "status": status,
    }
    return name


def add_event(emu: Emulator, pod: str, reason: str, message: str, namespace: str = NAMESPACE) -> None:
    emu.objects["v1/events", namespace, f"{pod}.{reason.lower()}"] = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{pod}.{reason.lower()}", "namespace": namespace},
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
        "type": "Warning", "reason": reason, "message": message, "lastTimestamp": "2026-01-01T00:00:00Z",
    }


def serve_log(emu: Emulator, pod: str, lines: list[str], delay_s: float = 0.05,
              namespace: str = NAMESPACE) -> None:
    """The pod's log, streamed a line at a time (a follow=true reader sees them arrive)."""
    chunks = []
    for line in lines:
        chunks += [(line + "\n").encode(), lambda: asyncio.sleep(delay_s)]
    emu[f"get /api/v1/namespaces/{namespace}/pods/{pod}/log"] << tuple(chunks)
