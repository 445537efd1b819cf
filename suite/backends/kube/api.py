"""The Kubernetes API as the cluster backend uses it: a client from a kubeconfig, and plain reads.

Every read returns the API's JSON as dicts (`_preload_content=False`): the backend and its pure
helpers (diagnosis.py) work on the same shapes `kubectl get -o json` shows. Selectors are sent and
applied again here, because a server may answer with more than it was asked for.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import yaml

MPIJOB = ("kubeflow.org", "v2beta1", "mpijobs")
LOG_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/log"


def default_kubeconfig() -> str | None:
    """The kubeconfig kubectl would use: $KUBECONFIG's first file, else ~/.kube/config."""
    env = os.environ.get("KUBECONFIG")
    if env:
        first = env.split(os.pathsep)[0]
        return first if Path(first).is_file() else None
    path = Path.home() / ".kube" / "config"
    return str(path) if path.is_file() else None


def load_client(kubeconfig: str | None, context: str | None):
    """(ApiClient, the context's namespace or None); raises RuntimeError with a one-line reason."""
    from kubernetes import client, config

    path = kubeconfig or default_kubeconfig()
    if path is None:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return client.ApiClient(), None
        raise RuntimeError("no kubeconfig: set KUBECONFIG or create ~/.kube/config")
    try:
        api = config.new_client_from_config(config_file=path, context=context)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"kubeconfig {path} unusable: {short(exc)}") from None
    return api, context_namespace(path, context)


def context_namespace(path: str, context: str | None) -> str:
    try:
        cfg = yaml.safe_load(Path(path).read_text()) or {}
        name = context or cfg.get("current-context")
        for ctx in cfg.get("contexts") or []:
            if ctx.get("name") == name:
                return (ctx.get("context") or {}).get("namespace") or "default"
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    return "default"


def serves(api, resource: tuple[str, str, str]) -> bool:
    """Whether the cluster serves (group, version, plural): its operator's CRD is installed."""
    from kubernetes import client

    group, version, plural = resource
    try:
        found = client.CustomObjectsApi(api).get_api_resources(group, version, _request_timeout=5)
    except Exception:  # noqa: BLE001 - 404: the group is not served
        return False
    return plural in [r.name for r in (found.resources or [])]


def labelled(items: list[dict], selector: dict[str, str]) -> list[dict]:
    return [i for i in items if all(((i.get("metadata") or {}).get("labels") or {}).get(k) == v
                                    for k, v in selector.items())]


def _selector(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector.items())


def list_pods(api, namespace: str, selector: dict[str, str]) -> list[dict]:
    from kubernetes import client

    resp = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=_selector(selector),
                                                     _preload_content=False, _request_timeout=30)
    return labelled(_json(resp).get("items") or [], selector)


def list_mpijobs(api, namespace: str, selector: dict[str, str]) -> list[dict]:
    from kubernetes import client

    group, version, plural = MPIJOB
    resp = client.CustomObjectsApi(api).list_namespaced_custom_object(
        group, version, namespace, plural, label_selector=_selector(selector),
        _preload_content=False, _request_timeout=30)
    return labelled(_json(resp).get("items") or [], selector)


def list_events(api, namespace: str, names: list[str]) -> list[dict]:
    """Events about any of `names` (one request per name: a field selector takes one value)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    found: list[dict] = []
    for name in names:
        resp = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}",
                                          _preload_content=False, _request_timeout=30)
        found += [e for e in _json(resp).get("items") or [] if (e.get("involvedObject") or {}).get("name") == name]
    return found


def get_pod(api, namespace: str, name: str) -> dict | None:
    """The pod, or None when it no longer exists."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        resp = client.CoreV1Api(api).read_namespaced_pod(name, namespace, _preload_content=False,
                                                         _request_timeout=30)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return _json(resp)


def delete_pod(api, namespace: str, name: str) -> bool:
    """Delete a pod at once (grace period 0: its processes die as on a lost node); False when it
    did not exist."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0,  # type: ignore[attr-defined]
                                                    _preload_content=False, _request_timeout=30).release_conn()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def log_tail(api, namespace: str, name: str, lines: int = 5) -> list[str]:
    """The last lines of a pod's log (what a crashed container said last), or [] when there is none."""
    from kubernetes import client

    try:
        resp = client.CoreV1Api(api).read_namespaced_pod_log(name, namespace, tail_lines=lines,
                                                             _preload_content=False, _request_timeout=30)
        text = resp.data.decode("utf-8", errors="replace")  # type: ignore[attr-defined]
        resp.release_conn()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a missing log only makes the reason shorter
        return []
    return [line for line in text.splitlines() if line.strip()]


def open_log(api, namespace: str, name: str, since_time: str | None, read_timeout_s: float):
    """A follow=true, timestamped stream of a pod's log from `since_time` (RFC 3339), as a urllib3
    response; None when the pod is gone. sinceTime is not a parameter of the generated client's
    read_namespaced_pod_log, so the request is built here (the API server takes it as a query)."""
    query = [("follow", "true"), ("timestamps", "true")]
    if since_time:
        query.append(("sinceTime", since_time))
    method, url, headers, body, post = api.param_serialize(
        "GET", LOG_PATH, path_params={"namespace": namespace, "name": name}, query_params=query,
        header_params={"Accept": "*/*"}, auth_settings=["BearerToken"])
    resp = api.call_api(method, url, headers, body, post, _request_timeout=(30, read_timeout_s)).response
    if resp.status == 404:
        resp.release_conn()
        return None
    if resp.status >= 400:
        text = resp.data.decode("utf-8", errors="replace")[:300]
        resp.release_conn()
        raise RuntimeError(f"HTTP {resp.status} reading the log of {name}: {text}")
    return resp


def close_stream(resp) -> None:
    """End a streaming response that another thread is reading. urllib3's close() waits for that
    read (up to its timeout), so the socket is shut down first: the blocked read returns at once."""
    if resp is None:
        return
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        resp.close()
    except OSError:
        pass


def _json(resp) -> dict:
    try:
        return json.loads(resp.data or b"{}")
    finally:
        resp.release_conn()


def short(exc: BaseException, namespace: str | None = None) -> str:
    """An exception as one line of at most 300 characters (an API error: what and what to do,
    kube/errors.py, up to 600)."""
    from shardbench.suite.backends.kube.errors import describe

    api_error = describe(exc, namespace)
    if api_error:
        return api_error[:600]
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
