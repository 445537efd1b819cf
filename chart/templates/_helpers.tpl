{{/*
Names. The MPIJob's name is also the headless Service the operator creates and the prefix of the
worker host names (<job>-worker-<i>), which must stay DNS labels of 63 characters at most: so the
full name is cut to 50, leaving room for "-worker-NNN" and "-launcher".
*/}}
{{- define "shardbench.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" }}
{{- end }}

{{- define "shardbench.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else if contains (include "shardbench.name" .) .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "shardbench.name" .) | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "shardbench.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shardbench.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* World size: ranks of the whole run. */}}
{{- define "shardbench.worldSize" -}}
{{- mul (int .Values.workers) (int .Values.gpusPerWorker) }}
{{- end }}

{{/* Data-parallel ranks: world size / (run.tp x run.pp) (a tensor-parallel group and the stages of
a pipeline share their rows). */}}
{{- define "shardbench.dpDegree" -}}
{{- div (int (include "shardbench.worldSize" .)) (mul (max 1 (int (default 1 .Values.run.tp))) (max 1 (int (default 1 .Values.run.pp)))) }}
{{- end }}

{{/*
Grad-accum steps: run.gradAccum, or derived from run.globalBatch. A global batch that the
micro-batch x data-parallel ranks does not divide cannot be run with the same tokens per step, so
it fails here (JSON Schema cannot compare two values).
*/}}
{{- define "shardbench.gradAccum" -}}
{{- $gb := .Values.run.globalBatch }}
{{- if $gb }}
{{- $per := mul (int .Values.run.microBatch) (int (include "shardbench.dpDegree" .)) }}
{{- if or (lt (int $gb) $per) (ne (mod (int $gb) $per) 0) }}
{{- $tp := int (default 1 .Values.run.tp) }}
{{- $pp := int (default 1 .Values.run.pp) }}
{{- if gt $pp 1 }}
{{- fail (printf "run.globalBatch %d is not a multiple of run.microBatch %d x data-parallel ranks %d (world size %d / (run.tp %d x run.pp %d)) = %d" (int $gb) (int .Values.run.microBatch) (int (include "shardbench.dpDegree" .)) (int (include "shardbench.worldSize" .)) $tp $pp $per) }}
{{- end }}
{{- if gt $tp 1 }}
{{- fail (printf "run.globalBatch %d is not a multiple of run.microBatch %d x data-parallel ranks %d (world size %d / run.tp %d) = %d" (int $gb) (int .Values.run.microBatch) (int (include "shardbench.dpDegree" .)) (int (include "shardbench.worldSize" .)) $tp $per) }}
{{- end }}
{{- fail (printf "run.globalBatch %d is not a multiple of run.microBatch %d x world size %d (workers %d x gpusPerWorker %d) = %d" (int $gb) (int .Values.run.microBatch) (int (include "shardbench.worldSize" .)) (int .Values.workers) (int .Values.gpusPerWorker) $per) }}
{{- end }}
{{- div (int $gb) $per }}
{{- else }}
{{- int .Values.run.gradAccum }}
{{- end }}
{{- end }}

{{/*
The name of this run's outputs (labels, the results directory): run.id when given (the suite
passes its run ids), else the release name. Without run.id the trainer names the run itself,
with the configuration hash only it computes (trainer.contract.run_id), so no --run-id is passed.
*/}}
{{- define "shardbench.runName" -}}
{{- .Values.run.id | default .Release.Name }}
{{- end }}

{{/* Rank 0's host: worker 0, by the name the operator writes into the hostfile. */}}
{{- define "shardbench.masterAddr" -}}
{{- $job := include "shardbench.fullname" . }}
{{- printf "%s-worker-0.%s.%s.svc" $job $job .Release.Namespace }}
{{- end }}

{{/*
The layout's degrees (trainer/rules.py says the same in the trainer and the matrix): a TP group is
run.tp consecutive ranks and must stay inside one worker (its collectives run per layer on the
intra-node link), so run.tp divides gpusPerWorker; tp x dpReplicate divides the world size. The
schema rejects what it can say alone (ZeRO with tp > 1, dpReplicate > 1 without fsdp).
*/}}
{{- define "shardbench.validateLayout" -}}
{{- $tp := int (default 1 .Values.run.tp) }}
{{- $rep := int (default 1 .Values.run.dpReplicate) }}
{{- $world := int (include "shardbench.worldSize" .) }}
{{- if and (gt $tp 1) (ne (mod (int .Values.gpusPerWorker) $tp) 0) }}
{{- fail (printf "run.tp %d does not divide gpusPerWorker %d: a tensor-parallel group must stay inside one worker; pick a run.tp that divides gpusPerWorker" $tp (int .Values.gpusPerWorker)) }}
{{- end }}
{{- $pp := int (default 1 .Values.run.pp) }}
{{- if and (gt $pp 1) (ne (mod $world (mul $pp (mul $tp $rep))) 0) }}
{{- fail (printf "world size %d (workers %d x gpusPerWorker %d) is not divisible by run.pp %d x run.tp %d x run.dpReplicate %d = %d: pick degrees whose product divides the world size" $world (int .Values.workers) (int .Values.gpusPerWorker) $pp $tp $rep (mul $pp (mul $tp $rep))) }}
{{- end }}
{{- if ne (mod $world (mul $tp $rep)) 0 }}
{{- fail (printf "world size %d (workers %d x gpusPerWorker %d) is not divisible by run.tp %d x run.dpReplicate %d = %d: pick degrees whose product divides the world size" $world (int .Values.workers) (int .Values.gpusPerWorker) $tp $rep (mul $tp $rep)) }}
{{- end }}
{{- /* where state lives (trainer/rules.py _state_errors): the products the schema cannot compare */}}
{{- $dp := int (include "shardbench.dpDegree" .) }}
{{- $hpz := int (default 1 .Values.run.zeroHpzPartitionSize) }}
{{- if and (gt $hpz 1) (ne (mod $dp $hpz) 0) }}
{{- fail (printf "run.zeroHpzPartitionSize %d does not divide the %d data-parallel ranks: use a divisor of them (the GPUs of one worker)" $hpz $dp) }}
{{- end }}
{{- $engine := (get (include "shardbench.contract" . | fromJson).strategies .Values.run.strategy).engine }}
{{- if and (eq $engine "fsdp") (ne (toString (default "none" .Values.run.offload)) "none") (eq $dp 1) }}
{{- fail (printf "run.offload %s with fsdp needs more than one data-parallel rank (world size %d): alone FSDP runs the plain model, which stays on the device; use run.offload none or more ranks" (toString .Values.run.offload) $world) }}
{{- end }}
{{- end }}

{{/* Cross-field checks the JSON schema cannot express; each fails with one line. */}}
{{- define "shardbench.validate" -}}
{{- $preset := get (include "shardbench.contract" . | fromJson).presets .Values.run.model }}
{{- if and $preset (gt (int .Values.run.seqLen) (int $preset.blockSize)) }}
{{- fail (printf "run.seqLen %d is above model %s's block size %d: lower run.seqLen (the trainer would exit 2)" (int .Values.run.seqLen) .Values.run.model (int $preset.blockSize)) }}
{{- end }}
{{- if ge (int .Values.run.warmupSteps) (int .Values.run.steps) }}
{{- fail (printf "run.warmupSteps %d must be below run.steps %d: nothing would be measured" (int .Values.run.warmupSteps) (int .Values.run.steps)) }}
{{- end }}
{{- $gpn := int .Values.shape.gpusPerNode }}
{{- if and .Values.gpuResource (gt $gpn 0) (gt (int .Values.gpusPerWorker) $gpn) }}
{{- fail (printf "gpusPerWorker %d is more than shape %s has per node (%d)" (int .Values.gpusPerWorker) .Values.shape.name $gpn) }}
{{- end }}
{{- if and .Values.gpuResource (eq .Values.run.device "cpu") }}
{{- fail "run.device cpu with gpuResource set would hold GPUs and not use them: set gpuResource \"\" or run.device cuda" }}
{{- end }}
{{- if and (not .Values.gpuResource) (eq .Values.run.device "cuda") }}
{{- fail "run.device cuda needs GPUs: set gpuResource (e.g. nvidia.com/gpu)" }}
{{- end }}
{{- if and .Values.checkpoint.enabled (not .Values.persistence.enabled) }}
{{- fail "checkpoint.enabled needs persistence.enabled: checkpoints live on the results volume" }}
{{- end }}
{{- if and .Values.ray.enabled (ne .Values.rdma.mode "none") }}
{{- fail (printf "ray.enabled with rdma.mode %s: the RayJob's pods get no RDMA devices (only the MPIJob is wired for RDMA), so NCCL would fall back to TCP sockets between nodes: set rdma.mode=none to run the RayJob over sockets knowingly, or use the MPIJob" .Values.rdma.mode) }}
{{- end }}
{{- if and (eq .Values.rdma.mode "sriov") (not .Values.rdma.networks) }}
{{- fail "rdma.mode sriov needs rdma.networks: the Multus network(s) of the VFs, e.g. rdma-vf,rdma-vf (k8s.v1.cni.cncf.io/networks)" }}
{{- end }}
{{- include "shardbench.validateLayout" . }}
{{- $_ := include "shardbench.gradAccum" . }}
{{- include "shardbench.validateStorage" . }}
{{- include "shardbench.validateNumbers" . }}
{{- end }}

{{/*
Arguments after `python -m shardbench.trainer`, in the order suite/matrix/expand.py RunSpec.trainer_args()
writes them (tests/chart/test_launch_command.py checks they agree). One JSON list. The first-class
run values and their flags come from files/contract.json `runFlags` (generated from the trainer's
RunConfig fields marked chart=True), e.g. run.microBatch -> --micro-batch.
*/}}
{{- define "shardbench.trainerArgs" -}}
{{- $r := .Values.run }}
{{- $a := list }}
{{- range (include "shardbench.contract" . | fromJson).runFlags }}
{{- $v := get $r .value }}
{{- if not (hasKey $r .value) }}
{{- /* not in values.yaml: the trainer's own default */}}
{{- else if eq .value "gradAccum" }}
{{- $a = concat $a (list .flag (include "shardbench.gradAccum" $)) }}
{{- else if eq .type "boolean" }}
{{- $a = append $a (ternary .flag .noFlag (eq (toString $v) "true")) }}
{{- else if kindIs "invalid" $v }}
{{- else if eq .type "integer" }}
{{- $a = concat $a (list .flag (toString (int64 $v))) }}
{{- else }}
{{- $a = concat $a (list .flag (toString $v)) }}
{{- end }}
{{- end }}
{{- with $r.id }}{{ $a = concat $a (list "--run-id" .) }}{{ end }}
{{- with .Values.shape.name }}{{ $a = concat $a (list "--shape" .) }}{{ end }}
{{- with .Values.shape.peakTflopsBf16 }}{{ $a = concat $a (list "--peak-tflops" (toString .)) }}{{ end }}
{{- with .Values.shape.usdPerGpuHour }}{{ $a = concat $a (list "--usd-per-gpu-hour" (toString .)) }}{{ end }}
{{- if .Values.persistence.enabled }}
{{- $a = concat $a (list "--output-dir" (printf "%s/%s" .Values.persistence.mountPath (include "shardbench.runName" .))) }}
{{- end }}
{{- if .Values.checkpoint.enabled }}
{{- /* --resume auto is the trainer's default: a retried launcher continues from here. */}}
{{- $a = concat $a (list "--checkpoint-dir" (include "shardbench.checkpointDir" .) "--checkpoint-every" (toString (int .Values.checkpoint.every)) "--keep-checkpoints" (toString (int .Values.checkpoint.keep))) }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- /* Live metrics from rank 0 (trainer/exporter.py); the alert's throughput hook. */}}
{{- $a = concat $a (list "--metrics-port" (toString (int .Values.metrics.port)) "--metrics-hold-s" (toString .Values.metrics.holdSeconds)) }}
{{- with .Values.metrics.expectedTokensPerSecond }}{{ $a = concat $a (list "--expected-tokens-per-s" (toString .)) }}{{ end }}
{{- end }}
{{- $a = concat $a $r.extraArgs }}
{{- if and .Values.deepspeed.config (include "shardbench.isDeepSpeed" .) }}
{{- $a = concat $a (list "--deepspeed-config" "/etc/shardbench/deepspeed.json") }}
{{- end }}
{{- /* build_command tells the trainer which launcher started it, unless the args already do. */}}
{{- if not (has "--launcher" $a) }}
{{- $a = concat $a (list "--launcher" .Values.launcher) }}
{{- end }}
{{- toJson $a }}
{{- end }}

{{/* Arguments of files/preflight.py (mode preflight), one JSON list. */}}
{{- define "shardbench.preflightArgs" -}}
{{- $p := .Values.preflight }}
{{- $a := list }}
{{- if $p.sizesMiB }}
{{- $a = list "--sizes-mib" }}
{{- range $p.sizesMiB }}{{ $a = append $a (toString .) }}{{ end }}
{{- else }}
{{- $a = list "--min-size-mib" (toString $p.minSizeMiB) "--max-size-mib" (toString $p.maxSizeMiB) "--plateau-gain" (toString $p.plateauGain) }}
{{- end }}
{{- $a = concat $a (list "--rdma-mode" .Values.rdma.mode) }}
{{- $a = concat $a (list "--iters" (toString (int $p.iters)) "--warmup-iters" (toString (int $p.warmupIters)) "--device" (ternary "cuda" "cpu" (not (empty .Values.gpuResource))) "--min-fraction" (toString $p.minFraction)) }}
{{- with $p.expectedBusbwGBps }}{{ $a = concat $a (list "--expected-busbw-gbps" (toString .)) }}{{ end }}
{{- toJson $a }}
{{- end }}

{{/*
The trainer's facts (files/contract.json, written by scripts/gen_chart_contract.py from the
trainer's tables): which strategies run on DeepSpeed, preset block sizes, forwarded variables.
*/}}
{{- define "shardbench.contract" -}}
{{- .Files.Get "files/contract.json" }}
{{- end }}

{{/* "true" when run.strategy runs on DeepSpeed (zero1/2/3), else "". */}}
{{- define "shardbench.isDeepSpeed" -}}
{{- $c := include "shardbench.contract" . | fromJson }}
{{- if (get (get $c.strategies .Values.run.strategy | default dict) "deepspeed") }}true{{ end }}
{{- end }}

{{/*
Names every rank gets from the launcher's environment (mpirun -x NAME), after runEnvVars: the
container's (PATH, LD_LIBRARY_PATH, caches, image) and every nccl:/env: key, sorted
(trainer/launchers.py forwarded_env).
*/}}
{{- define "shardbench.forwardEnv" -}}
{{- $c := include "shardbench.contract" . | fromJson }}
{{- $names := concat $c.containerEnvVars (keys (include "shardbench.ncclEnv" . | fromJson)) (keys .Values.env) | uniq | sortAlpha }}
{{- $out := list }}
{{- range $names }}{{ if not (has . $c.runEnvVars) }}{{ $out = append $out . }}{{ end }}{{ end }}
{{- toJson $out }}
{{- end }}

{{/*
The launcher's argv: trainer/launchers.py build_command() for this run, flag for flag
(the mpirun flags and forwarded names come from contract.json; the DeepSpeed runner's flags and
the trailing --launcher are mirrored from there; tests/chart/test_launch_command.py fails when
the two drift apart). Both launchers pass every forwarded name as mpirun -x NAME.
*/}}
{{- define "shardbench.launchCommand" -}}
{{- $c := include "shardbench.contract" . | fromJson }}
{{- $base := $c.mpirunBaseFlags }}
{{- if .Values.numaBind }}
{{- /* ranks per NUMA domain, as trainer/launchers.py procs_per_numa: the last domain may hold fewer */}}
{{- $perNuma := div (sub (add (int .Values.gpusPerWorker) (int .Values.shape.numaNodes)) 1) (int .Values.shape.numaNodes) }}
{{- range $c.numaBoundFlags }}{{ $base = append $base (replace "ppr:0:" (printf "ppr:%d:" $perNuma) .) }}{{ end }}
{{- else }}
{{- $base = concat $base $c.unboundFlags }}
{{- end }}
{{- if .Values.tcpIfInclude }}
{{- $base = concat $base (list "--mca" "btl_tcp_if_include" .Values.tcpIfInclude) }}
{{- end }}
{{- $targs := include "shardbench.trainerArgs" . | fromJsonArray }}
{{- $forward := concat $c.runEnvVars (include "shardbench.forwardEnv" . | fromJsonArray) }}
{{- $cmd := list }}
{{- $program := list "-m" "shardbench.trainer" }}
{{- if eq .Values.mode "preflight" }}
{{- $program = list "/etc/shardbench/preflight.py" }}
{{- $targs = include "shardbench.preflightArgs" . | fromJsonArray }}
{{- end }}
{{- if or (eq .Values.launcher "mpirun") (eq .Values.mode "preflight") }}
{{- $cmd = concat (list "mpirun") $base (list "-np" (include "shardbench.worldSize" .) "--hostfile" "/etc/mpi/hostfile") }}
{{- range $forward }}
{{- $cmd = concat $cmd (list "-x" .) }}
{{- end }}
{{- $cmd = concat $cmd (list "python" "-u") $program $targs }}
{{- else }}
{{- /* The DeepSpeed runner starts one rank per hostfile slot: the operator's hostfile has
workers x slotsPerWorker of them, the world size. */}}
{{- $largs := concat $base (list "-x" (printf "MASTER_ADDR=%s" (include "shardbench.masterAddr" .)) "-x" (printf "MASTER_PORT=%d" (int .Values.masterPort))) }}
{{- range $forward }}
{{- if not (has . (list "MASTER_ADDR" "MASTER_PORT")) }}{{ $largs = concat $largs (list "-x" .) }}{{ end }}
{{- end }}
{{- $cmd = list "deepspeed" "--hostfile" "/etc/mpi/hostfile" "--launcher" "openmpi" "--force_multi" "--no_ssh_check" "--master_addr" (include "shardbench.masterAddr" .) "--master_port" (toString (int .Values.masterPort)) "--launcher_args" (join " " $largs) "--module" "shardbench.trainer" }}
{{- $cmd = concat $cmd $targs }}
{{- end }}
{{- toJson $cmd }}
{{- end }}

{{/* Labels. The shardbench.io/* ones carry the run's coordinates so runs can be selected by them. */}}
{{- define "shardbench.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardbench.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{- define "shardbench.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{ include "shardbench.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: shardbench
shardbench.io/strategy: {{ .Values.run.strategy | quote }}
shardbench.io/launcher: {{ .Values.launcher | quote }}
shardbench.io/world-size: {{ include "shardbench.worldSize" . | quote }}
shardbench.io/shape: {{ .Values.shape.name | quote }}
shardbench.io/seq-len: {{ int .Values.run.seqLen | quote }}
shardbench.io/run: {{ include "shardbench.runName" . | trunc 63 | trimSuffix "-" | quote }}
{{- end }}

{{/* The launcher's image: image.launcherTag, else the workers'. */}}
{{- define "shardbench.launcherImage" -}}
{{- if and .Values.image.launcherTag (not .Values.image.digest) }}
{{- printf "%s:%s" .Values.image.repository .Values.image.launcherTag }}
{{- else }}
{{- include "shardbench.image" . }}
{{- end }}
{{- end }}

{{- define "shardbench.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end }}
{{- end }}

{{/*
Environment of every rank. HOME-relative caches go to the emptyDirs so a read-only root works;
MASTER_* is the torch.distributed rendezvous on worker 0.
*/}}
{{- define "shardbench.env" -}}
- name: MASTER_ADDR
  value: {{ include "shardbench.masterAddr" . | quote }}
- name: MASTER_PORT
  value: {{ int .Values.masterPort | quote }}
- name: XDG_CACHE_HOME
  value: {{ printf "/home/%s/.cache" .Values.ssh.user | quote }}
- name: TRITON_CACHE_DIR
  value: {{ printf "/home/%s/.cache/triton" .Values.ssh.user | quote }}
- name: SHARDBENCH_IMAGE
  value: {{ include "shardbench.image" . | quote }}
{{- $nccl := include "shardbench.ncclEnv" . | fromJson }}
{{- range $k := keys $nccl | sortAlpha }}
- name: {{ $k | quote }}
  value: {{ get $nccl $k | toString | quote }}
{{- end }}
{{- range $k := keys .Values.env | sortAlpha }}
- name: {{ $k | quote }}
  value: {{ get $.Values.env $k | toString | quote }}
{{- end }}
{{- end }}

{{/*
Container securityContext: non-root, no privilege escalation, every capability dropped. Called
with (dict "root" $ "privileged" bool), plus "asRoot" and "worker" from the MPIJob: rdma.mode
host-network workers are privileged (the only way a container may open the host's
/dev/infiniband devices). The RDMA modes run as root (templates/_rdma.tpl: IPC_LOCK is effective
only for root); a root worker keeps the runtime's default capabilities (its sshd switches users
and chroots) but NET_RAW and adds IPC_LOCK, which RDMA memory registration needs; the root
launcher only runs mpirun and ssh (reading keys root owns) and drops every capability.
*/}}
{{- define "shardbench.containerSecurityContext" -}}
{{- $v := .root.Values -}}
allowPrivilegeEscalation: {{ .privileged | toJson }}
privileged: {{ .privileged | toJson }}
readOnlyRootFilesystem: {{ $v.readOnlyRootFilesystem | toJson }}
{{- if .asRoot }}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
capabilities:
  {{- if .worker }}
  drop: [NET_RAW]
  add: {{ include "shardbench.addedCapabilities" .root }}
  {{- else }}
  drop: [ALL]
  {{- end }}
{{- else }}
runAsNonRoot: true
runAsUser: {{ int $v.ssh.uid }}
runAsGroup: {{ int $v.ssh.uid }}
capabilities:
  drop: [ALL]
{{- end }}
{{- end }}

{{/* Pod securityContext. fsGroup makes the operator's SSH key Secret readable by the non-root user. */}}
{{- define "shardbench.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ int .Values.ssh.uid }}
runAsGroup: {{ int .Values.ssh.uid }}
fsGroup: {{ int .Values.ssh.uid }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
checkov skips that hold for every pod of the chart, each with its reason. Rendered as pod
annotations (checkov reads checkov.io/skipN from the metadata of what it scans).
*/}}
{{- define "shardbench.checkovSkips" -}}
{{- $skips := list "CKV_K8S_15=IfNotPresent on purpose: re-pulling a multi-GB CUDA image for every run would dominate its start-up" "CKV_K8S_21=the namespace is the release's, chosen at install time" }}
{{- if not .Values.image.digest }}
{{- $skips = append $skips "CKV_K8S_43=the image is built from this repository and referenced by tag; set image.digest to pin it" }}
{{- end }}
{{- toJson $skips }}
{{- end }}

{{/*
Pod annotations: checkov.io/skipN for each "CKV_ID=reason" in .skips, plus .extra (podAnnotations).
One per line, quoted; callers pipe it through trim | nindent.
*/}}
{{- define "shardbench.podAnnotations" -}}
{{- $m := deepCopy (.extra | default dict) }}
{{- range $i, $s := .skips }}
{{- $_ := set $m (printf "checkov.io/skip%d" (add1 $i)) $s }}
{{- end }}
{{- range $k := keys $m | sortAlpha }}
{{ $k | quote }}: {{ get $m $k | toString | quote }}
{{- end }}
{{- end }}

{{/*
The RayJob's driver: trainer/launchers.py ray_command() for this run (tests/chart/test_rayjob.py
checks they agree), one shell line. Called with a context whose .Values.launcher is "ray".
*/}}
{{- define "shardbench.rayEntrypoint" -}}
{{- $v := .Values }}
{{- $cmd := list "python" "-m" "shardbench.trainer.ray_launcher" "--world-size" (include "shardbench.worldSize" .) "--ranks-per-node" (toString (int $v.gpusPerWorker)) "--max-restarts" (toString (int $v.ray.maxRestarts)) }}
{{- if and $v.gpuResource (gt (int $v.gpusPerWorker) 0) }}{{ $cmd = concat $cmd (list "--gpus-per-rank" "1") }}{{ end }}
{{- $cmd = concat $cmd (list "--") (include "shardbench.trainerArgs" . | fromJsonArray) }}
{{- $quoted := list }}
{{- range $cmd }}{{ $quoted = append $quoted (squote .) }}{{ end }}
{{- join " " $quoted }}
{{- end }}
