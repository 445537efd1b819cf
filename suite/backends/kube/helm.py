"""The helm client: install and uninstall one release of chart/ through pyhelm3 and a real helm.

pyhelm3 0.5.8 traps avoided here: `disable_validation=True` splits its flag into characters (so
OpenAPI validation stays on), `repo_update` fails on helm 4 (a local chart needs no repo), and
its values merge concatenates lists (so the values are merged by values.py and passed as one dict).
pyhelm3's client is async; the backend runs in a worker thread, so each call gets its own loop.
"""
from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
NOT_FOUND = "helm not found on PATH or in .tools/bin (run `make tools`)"


def find_helm(explicit: str | None = None) -> str | None:
    """helm to use: the explicit path, $SHARDBENCH_HELM, PATH, then the repo's .tools/bin."""
    for candidate in (explicit, os.environ.get("SHARDBENCH_HELM")):
        if candidate:
            return candidate if Path(candidate).is_file() else shutil.which(candidate)
    found = shutil.which("helm")
    tools = REPO_ROOT / ".tools" / "bin" / "helm"
    return found or (str(tools) if tools.exists() else None)


class Helm:
    """One helm executable bound to one kubeconfig and context."""

    def __init__(self, executable: str, kubeconfig: str | None, context: str | None,
                 server_side: str | None = None):
        self.executable, self.kubeconfig, self.context = executable, kubeconfig, context
        self.server_side = server_side
        """helm 4 --server-side (None: helm's default); ignored by helm 3."""

    def _client(self):
        from pyhelm3 import Client

        return Client(executable=self.executable, kubeconfig=self.kubeconfig, kubecontext=self.context)

    def install(self, chart: Path, release: str, values: dict[str, Any], namespace: str) -> list[dict]:
        """`helm upgrade --install` without waiting; returns the rendered resources."""
        async def go():
            client = self._client()
            loaded = await client.get_chart(chart)
            revision = await client.install_or_upgrade_release(
                release, loaded, values, namespace=namespace, create_namespace=False,
                server_side=self.server_side, wait=False)
            return list(revision.resources_ or [])

        return asyncio.run(go())

    def template(self, chart: Path, release: str, values: dict[str, Any], namespace: str) -> list[dict]:
        """`helm template`: the resources an install would make, without a cluster."""
        async def go():
            client = self._client()
            loaded = await client.get_chart(chart)
            return list(await client.template_resources(loaded, release, values, namespace=namespace))

        return asyncio.run(go())

    def uninstall(self, release: str, namespace: str) -> None:
        """`helm uninstall` without waiting (pyhelm3 treats a release that is not there as gone)."""
        async def go():
            await self._client().uninstall_release(release, namespace=namespace, wait=False)

        asyncio.run(go())
