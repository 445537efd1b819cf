{{/*
The results volume: its size, its access modes, and where an attempt's checkpoints go.
*/}}

{{/*
Size of the created claim: persistence.size, else 1Gi, or with checkpoints what they need:
16 bytes per parameter per checkpoint (fp32 weights and Adam's two moments, 12 B, plus the 16-bit
weights DeepSpeed saves beside them), checkpoint.keep kept plus the one being written, 20% for
the file systems' overhead, and 1Gi for the records and logs. gpt2-1.3b with keep 2: 71Gi.
*/}}
{{- define "shardbench.volumeSize" -}}
{{- $p := .Values.persistence }}
{{- if $p.size }}
{{- $p.size }}
{{- else if .Values.checkpoint.enabled }}
{{- $preset := get (include "shardbench.contract" . | fromJson).presets .Values.run.model }}
{{- $bytes := mul (int64 $preset.params) 16 (add (int .Values.checkpoint.keep) 1) 12 }}
{{- printf "%dGi" (add (div $bytes (mul 10 1073741824)) 1) }}
{{- else }}1Gi{{ end }}
{{- end }}

{{/*
Where this attempt's checkpoints go: <run dir>/checkpoints with checkpoint.resume (continue an
earlier attempt), else <run dir>/attempts/<attempt>/checkpoints, fresh for each install (the
volume outlives uninstall, so a rerun would otherwise resume from the last attempt's state and
report its numbers). A launcher retried within the attempt (runPolicy.backoffLimit) reruns the
same command, so it still resumes.
*/}}
{{- define "shardbench.checkpointDir" -}}
{{- $run := printf "%s/%s" .Values.persistence.mountPath (include "shardbench.runName" .) }}
{{- if .Values.checkpoint.resume }}
{{- printf "%s/checkpoints" $run }}
{{- else }}
{{- printf "%s/attempts/%s/checkpoints" $run (.Values.checkpoint.attempt | default (now | unixEpoch | toString)) }}
{{- end }}
{{- end }}

{{/* One-line refusals about the volume (called from shardbench.validate). */}}
{{- define "shardbench.validateStorage" -}}
{{- $p := .Values.persistence }}
{{- if and $p.enabled (not $p.existingClaim) (gt (int .Values.workers) 1) (not (has "ReadWriteMany" $p.accessModes)) }}
{{- fail (printf "persistence with workers %d needs persistence.accessModes [ReadWriteMany] (every worker mounts the results volume; a %s volume attaches to one node, so workers elsewhere hang in ContainerCreating): --set persistence.accessModes={ReadWriteMany} with a storage class that offers it, or persistence.existingClaim" (int .Values.workers) (join "," $p.accessModes)) }}
{{- end }}
{{- end }}
