{{/*
Bounds of the number values given as text. `helm --set x=0.5` passes the string "0.5" (helm types
only integers), so the schema takes numeric text for every number value (its pattern) but can
check bounds on real numbers only; this checks the same bounds on the text, one line each.
The paths and bounds come from files/contract.json `numbers` (scripts/gen_chart_contract.py,
from values.schema.json). Templates write such a value verbatim: "0.5" renders as 0.5.
*/}}
{{- define "shardbench.validateNumbers" -}}
{{- range $path, $b := (include "shardbench.contract" . | fromJson).numbers }}
{{- $v := $.Values }}
{{- $given := true }}
{{- range splitList "." $path }}
{{- if and $given (kindIs "map" $v) (hasKey $v .) }}{{ $v = get $v . }}{{ else }}{{ $given = false }}{{ end }}
{{- end }}
{{- if and $given (kindIs "string" $v) }}
{{- $f := float64 $v }}
{{- if and (hasKey $b "minimum") (lt $f (float64 $b.minimum)) }}
{{- fail (printf "%s must be at least %v, got %s" $path $b.minimum $v) }}
{{- end }}
{{- if and (hasKey $b "exclusiveMinimum") (le $f (float64 $b.exclusiveMinimum)) }}
{{- fail (printf "%s must be above %v, got %s" $path $b.exclusiveMinimum $v) }}
{{- end }}
{{- if and (hasKey $b "maximum") (gt $f (float64 $b.maximum)) }}
{{- fail (printf "%s must be at most %v, got %s" $path $b.maximum $v) }}
{{- end }}
{{- if and (hasKey $b "exclusiveMaximum") (ge $f (float64 $b.exclusiveMaximum)) }}
{{- fail (printf "%s must be below %v, got %s" $path $b.exclusiveMaximum $v) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
