"""Whether an existing Helm release is this run's: the backend upgrades and uninstalls only
releases of the shardbench chart made for the same run id. A release of another chart that
happens to have the name (or one another tool made) is refused, never upgraded into shardbench
and then deleted.

Helm keeps each release revision in a Secret labelled owner=helm, name=<release>, version=<n>;
its `release` data is base64 (the Secret's own) of base64 of gzip of the release JSON (chart
metadata, the values it was installed with)."""
from __future__ import annotations

import base64
import gzip
import json

from shardbench.suite.backends.kube import api as kapi

CHART = "shardbench"


def decode_release(secret: dict) -> dict | None:
    try:
        raw = base64.b64decode(base64.b64decode((secret.get("data") or {})["release"]))
        return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (KeyError, ValueError, OSError, TypeError):
        return None


def latest_release(api, namespace: str, name: str) -> dict | None:
    """The newest stored revision of release `name` as Helm's JSON, {} when one exists but
    cannot be read, None when there is none."""
    from kubernetes import client

    resp = client.CoreV1Api(api).list_namespaced_secret(namespace, label_selector=f"owner=helm,name={name}",
                                                        _preload_content=False, _request_timeout=30)
    items = kapi.labelled(kapi._json(resp).get("items") or [], {"owner": "helm", "name": name})
    if not items:
        return None
    newest = max(items, key=lambda s: int(((s.get("metadata") or {}).get("labels") or {}).get("version") or 0))
    return decode_release(newest) or {}


def not_ours(api, namespace: str, name: str, run_id: str) -> str | None:
    """Why release `name` must not be touched for `run_id`, or None (absent, or this run's)."""
    found = latest_release(api, namespace, name)
    if found is None:
        return None
    chart = ((found.get("chart") or {}).get("metadata") or {}).get("name") or "an unreadable chart"
    owner = ((found.get("config") or {}).get("run") or {}).get("id")
    if chart == CHART and owner == run_id:
        return None
    whose = f"chart {chart}" + (f", run {owner}" if chart == CHART else "")
    return (f"helm release {name} in namespace {namespace} already exists and is not this run's ({whose}): "
            f"shardbench neither upgrades nor uninstalls it; remove it (helm uninstall {name} -n {namespace}) "
            "or run in another namespace")
