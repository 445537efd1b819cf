"""Kubernetes API errors as one line that says what is missing and what to do. The client's own
text starts with "(403)" and buries the reason in a JSON body: a 403 names the verb, resource and
namespace the kubeconfig's user may not use (from the API's message), a 404 which namespace or
resource is missing."""
from __future__ import annotations

import json

FATAL = (401, 403, 404)
"""Statuses a retry cannot fix: the run fails at once with the reason, not at its start timeout."""


def status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and status >= 400 else None


def _message(exc: BaseException) -> str:
    try:
        body = json.loads(getattr(exc, "body", None) or "{}")
        text = body.get("message") if isinstance(body, dict) else None
    except (TypeError, ValueError):
        text = None
    return " ".join(str(text or getattr(exc, "reason", None) or "").split())


def describe(exc: BaseException, namespace: str | None = None) -> str | None:
    """One line for an API error (None when `exc` is not one)."""
    status = status_of(exc)
    if status is None:
        return None
    where = f" in namespace {namespace}" if namespace else ""
    head = f"HTTP {status} {getattr(exc, 'reason', '') or ''}".rstrip()
    message = _message(exc)
    if status == 401:
        hint = "the kubeconfig's credentials were refused (an expired token?): log in again"
    elif status == 403:
        hint = (f"the kubeconfig's user lacks this permission{where}: have a Role granting it bound to the user "
                f"(`kubectl auth can-i --list{' -n ' + namespace if namespace else ''}` shows what it may do)")
    elif status == 404:
        hint = (f"not found: check that namespace {namespace} exists (`kubectl get namespace {namespace}`) "
                "and that the MPI Operator's CRD is installed" if namespace else
                "not found: check the namespace and that the MPI Operator's CRD is installed")
    else:
        hint = "the API server refused the request"
    return f"{head}: {message}: {hint}" if message else f"{head}: {hint}"
