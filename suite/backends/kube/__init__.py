"""The cluster backend (backend `kubernetes`): one Helm release of chart/ per run, as an MPIJob.

backend.py   KubeBackend (settings, availability, release names, clients, one run) and RunLog
attempt.py   the life of one attempt (clear, install, wait, stream, collect); rayjob.py subclasses it
helm.py      the helm client (pyhelm3 over a real helm 3 or 4)
watch.py     the MPIJob watch and the launcher's resumable log stream
api.py       the Kubernetes API client from a kubeconfig, and the reads the backend makes
diagnosis.py pure: what job conditions, pod status and events say (why a run cannot start)
values.py    pure: release names and the chart values of a run
pod_faults.py the fault axis on the cluster: delete a rank's worker pod, note each launcher's steps
overrides.py pure: the image flags and the values each attempt adds (attempt id, RWX, ssh wait)
storage.py   the results volume's claim and events -> why the pods cannot start
rayjob.py    the RayJob attempt (backend ray with ray_cluster); rayjob_rules.py KubeRay's own checks
"""
from shardbench.suite.backends.kube.backend import KubeBackend

__all__ = ["KubeBackend"]
