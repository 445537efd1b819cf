{{/* Live metrics (trainer/exporter.py): every rank serves on metrics.port + its local rank, so a
worker pod with gpusPerWorker ranks has that many metrics ports: "metrics" (local rank 0), then
"metrics-1", "metrics-2"... */}}
{{- define "shardbench.metricsPortNames" -}}
{{- $names := list }}
{{- range $i := until (int .Values.gpusPerWorker) }}
{{- $names = append $names (ternary "metrics" (printf "metrics-%d" $i) (eq $i 0)) }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/* The container ports of a pod that runs ranks (MPIJob worker, Ray worker). */}}
{{- define "shardbench.metricsContainerPorts" -}}
{{- range $i, $name := include "shardbench.metricsPortNames" . | fromJsonArray }}
- {name: {{ $name }}, containerPort: {{ add (int $.Values.metrics.port) $i }}}
{{- end }}
{{- end }}

{{/* The pods that run ranks, for the PodMonitor and the metrics NetworkPolicy: MPIJob workers
(never the launcher), or Ray's worker group when ray.enabled (never the head: num-cpus 0, no
ranks). */}}
{{- define "shardbench.rankPodSelector" -}}
matchLabels:
  {{- include "shardbench.selectorLabels" . | nindent 2 }}
  app.kubernetes.io/component: {{ ternary "ray-worker" "worker" (.Values.ray.enabled | default false) }}
{{- end }}
