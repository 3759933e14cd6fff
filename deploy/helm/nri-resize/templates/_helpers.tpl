{{/* The chart's name. */}}
{{- define "nri-resize.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name, or release-chart when the release does not contain the chart's
name. `helm install nri-resize ...` gives the names of the kustomize install. */}}
{{- define "nri-resize.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Selector labels: the kustomize install's app.kubernetes.io/name and the release. */}}
{{- define "nri-resize.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nri-resize.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "nri-resize.labels" -}}
{{ include "nri-resize.selectorLabels" . }}
app.kubernetes.io/part-of: nri-resize
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "nri-resize.configName" -}}
{{ include "nri-resize.fullname" . }}-config
{{- end }}

{{- define "nri-resize.metricsName" -}}
{{ include "nri-resize.fullname" . }}-metrics
{{- end }}

{{/* The daemon's configuration: .Values.config with [resize] mode from .Values.mode. */}}
{{- define "nri-resize.config" -}}
{{- if not (has .Values.mode (list "Enforce" "Observe")) }}
{{- fail (printf "mode must be \"Enforce\" or \"Observe\", got %q" (toString .Values.mode)) }}
{{- end }}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if not (kindIs "map" (get $config "resize")) }}
{{- $_ := set $config "resize" dict }}
{{- end }}
{{- $_ := set $config.resize "mode" .Values.mode }}
{{- if .Values.kubeletConfigFile }}
{{- if not (kindIs "map" (get $config "kubelet")) }}
{{- $_ := set $config "kubelet" dict }}
{{- end }}
{{- $_ := set $config.kubelet "config_file" (include "nri-resize.kubeletConfigMount" .) }}
{{- end }}
{{- include "nri-resize.toml" $config }}
{{- end }}

{{/* A map as a TOML document: its scalars, then each map below it as a [table] (nested maps as
[table.sub]). Not Helm's toToml: values files reach templates with every number as a float64,
which toToml writes as 1024.0 or 1.073741824e+09, and the daemon's integer keys refuse floats;
here a whole number is written as an integer. Sizes (Kubernetes quantities, "1Gi", "250m") and
durations ("60s") are strings and written as TOML strings. Keys are the daemon's ([a-z_]), bare. */}}
{{- define "nri-resize.toml" -}}
{{- range $k, $v := . }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ $k }} = {{ include "nri-resize.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := . }}
{{- if kindIs "map" $v }}
{{- include "nri-resize.tomlTable" (dict "name" $k "table" $v) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nri-resize.tomlTable" -}}
{{- $name := .name }}

[{{ $name }}]
{{- range $k, $v := .table }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ $k }} = {{ include "nri-resize.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k, $v := .table }}
{{- if kindIs "map" $v }}
{{- include "nri-resize.tomlTable" (dict "name" (printf "%s.%s" $name $k) "table" $v) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nri-resize.tomlValue" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if kindIs "float64" . }}{{ if eq (float64 (int64 .)) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if or (kindIs "int" .) (kindIs "int64" .) }}{{ . }}
{{- else if kindIs "slice" . }}[{{ range $i, $e := . }}{{ if $i }}, {{ end }}{{ include "nri-resize.tomlValue" $e }}{{ end }}]
{{- else }}{{ fail (printf "config: cannot write %v (%s) as TOML" . (kindOf .)) }}
{{- end }}
{{- end }}

{{/* Where the daemon sees kubelet's configuration file (kubeletConfigFile, mounted read-only). */}}
{{- define "nri-resize.kubeletConfigMount" -}}
/etc/kubelet/{{ base .Values.kubeletConfigFile }}
{{- end }}
