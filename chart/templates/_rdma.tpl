{{/*
What each rdma.mode needs besides its network wiring (mpijob.yaml): who the pods run as, the
capability that lets NCCL register memory, the HCA selection and the device count.

Memory registration (ibv_reg_mr) needs CAP_IPC_LOCK or a RLIMIT_MEMLOCK above what NCCL pins;
without either NCCL fails with `ibv_reg_mr failed` / `ibv_create_qp failed`. An added capability
is effective only for root (Kubernetes gives a non-root process no ambient capabilities), so the
RDMA modes run launcher and workers as root with IPC_LOCK added, as OCI's RDMA MPIJobs do
(oracle-quickstart/oci-hpc-oke manifests/nccl-tests/kueue/*.yaml: sshAuthMountPath /root/.ssh,
capabilities.add IPC_LOCK). rdma.runAsRoot false keeps the non-root user and relies on the
runtime's memlock limit; the pre-flight checks that limit on every rank either way.
*/}}

{{/* "true" when the pods run as root: an RDMA mode with rdma.runAsRoot. */}}
{{- define "shardbench.rdmaRoot" -}}
{{- if and (ne .Values.rdma.mode "none") .Values.rdma.runAsRoot }}true{{ end }}
{{- end }}

{{/* The user mpirun logs in as, and its home (where the operator mounts the job's ssh keys). */}}
{{- define "shardbench.sshHome" -}}
{{- if include "shardbench.rdmaRoot" . }}/root{{ else }}{{ printf "/home/%s" .Values.ssh.user }}{{ end }}
{{- end }}

{{/*
The device plugin resource a worker requests in shared-device and sriov mode: rdma.resourceName,
else the mode's entry of rdma.resources (sriov's VFs are another resource than the shared device).
*/}}
{{- define "shardbench.rdmaResource" -}}
{{- $name := .Values.rdma.resourceName | default (get (.Values.rdma.resources | default dict) .Values.rdma.mode) }}
{{- if not $name }}
{{- fail (printf "rdma.mode %s needs the device plugin resource to request: set rdma.resources.%s (or rdma.resourceName)" .Values.rdma.mode .Values.rdma.mode) }}
{{- end }}
{{- $name }}
{{- end }}

{{/*
Devices (shared-device) or VFs (sriov) per worker: rdma.count, else for sriov one VF per Multus
network attachment of rdma.networks (OCI: 16 x rdma-vf on BM.GPU.H100.8), else 1.
*/}}
{{- define "shardbench.rdmaCount" -}}
{{- if .Values.rdma.count }}
{{- int .Values.rdma.count }}
{{- else if and (eq .Values.rdma.mode "sriov") .Values.rdma.networks }}
{{- len (splitList "," .Values.rdma.networks) }}
{{- else }}1{{ end }}
{{- end }}

{{/*
NCCL_* of every rank (JSON object): nccl:, plus NCCL_IB_HCA for the mode from rdma.hca when
nccl: does not set it. The host's NICs are named exactly in host-network and shared-device mode
("=mlx5_0,..."; a bare prefix would take the front-end NIC too); inside an SR-IOV pod the only
mlx5 devices are its VFs, whose names match no host NIC, so OCI selects them by prefix ("mlx5").
*/}}
{{- define "shardbench.ncclEnv" -}}
{{- $env := deepCopy (.Values.nccl | default dict) }}
{{- $hca := get (.Values.rdma.hca | default dict) .Values.rdma.mode }}
{{- if and $hca (not (hasKey $env "NCCL_IB_HCA")) }}
{{- $_ := set $env "NCCL_IB_HCA" $hca }}
{{- end }}
{{- toJson $env }}
{{- end }}

{{/* Capabilities a worker container adds: IPC_LOCK in the RDMA modes that run as root. */}}
{{- define "shardbench.addedCapabilities" -}}
{{- if include "shardbench.rdmaRoot" . }}["IPC_LOCK"]{{ else }}[]{{ end }}
{{- end }}

{{/* The securityContext of the MPIJob's pods: root in the RDMA modes, else the image's user. */}}
{{- define "shardbench.jobPodSecurityContext" -}}
{{- if include "shardbench.rdmaRoot" . }}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
fsGroup: 0
seccompProfile:
  type: RuntimeDefault
{{- else }}
{{- include "shardbench.podSecurityContext" . }}
{{- end }}
{{- end }}

{{/* checkov skips of the MPIJob's pods in root mode ("CKV_ID=reason", JSON list); .worker adds IPC_LOCK's. */}}
{{- define "shardbench.rootSkips" -}}
{{- $why := "rdma.mode: NCCL's RDMA memory registration needs IPC_LOCK, which only root can use (no ambient capabilities); OCI runs its RDMA MPIJobs as root" }}
{{- $s := list (printf "CKV_K8S_23=%s" $why) (printf "CKV_K8S_40=%s" $why) }}
{{- if .worker }}{{ $s = concat $s (list (printf "CKV_K8S_37=%s; root's sshd needs the default set to switch users, NET_RAW is dropped" $why) (printf "CKV_K8S_25=%s" $why)) }}{{ end }}
{{- if not (include "shardbench.rdmaRoot" .root) }}{{ $s = list }}{{ end }}
{{- toJson $s }}
{{- end }}
