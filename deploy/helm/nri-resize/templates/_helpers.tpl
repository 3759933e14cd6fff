{{/* The chart's name (nameOverride), at most 63 characters: a label value. */}}
{{- define "nri-resize.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: fullnameOverride, else the release name, or release-name when the release does
not contain the name. `helm install nri-resize ...` gives the names of the kustomize install.
At most 63 characters (a DNS label), so that every name built from it fits too
(nri-resize.suffixed). */}}
{{- define "nri-resize.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* fullname-<suffix>, the full name cut so that the whole is at most 63 characters (a Service
name is a DNS label): a 52-character release gives a 63-character Service name, not 71. Called
with (list $ "suffix"). */}}
{{- define "nri-resize.suffixed" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $base := include "nri-resize.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $base $suffix }}
{{- end }}

{{/* Selector labels: the kustomize install's app.kubernetes.io/name and the release. */}}
{{- define "nri-resize.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nri-resize.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* app.kubernetes.io/version: the image tag, or the chart's appVersion when the tag is empty,
as a label value (at most 63 characters of [A-Za-z0-9_.-], starting and ending alphanumeric).
Never a digest: image.digest pins the image, and the schema refuses `@` in a tag. */}}
{{- define "nri-resize.version" -}}
{{- $v := .Values.image.tag | default .Chart.AppVersion | toString }}
{{- $v = regexReplaceAll "[^A-Za-z0-9_.-]" (replace "+" "_" (first (splitList "@" $v))) "-" }}
{{- regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" ($v | trunc 63) "" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "nri-resize.labels" -}}
{{ include "nri-resize.selectorLabels" . }}
app.kubernetes.io/part-of: nri-resize
{{- with include "nri-resize.version" . }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The image: repository:tag, pinned by digest when image.digest is set
(repository:tag@digest; repository@digest when the tag is empty). */}}
{{- define "nri-resize.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.digest }}
{{- if .Values.image.tag }}
{{- printf "%s:%s@%s" $repo .Values.image.tag .Values.image.digest }}
{{- else }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- end }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the pods run as: the chart's own (serviceAccount.create), named
serviceAccount.name or the full name; otherwise serviceAccount.name, or the namespace's
"default". */}}
{{- define "nri-resize.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nri-resize.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The NRI plugin index, two digits (a number is zero-padded: 5 -> "05"). */}}
{{- define "nri-resize.pluginIndex" -}}
{{- if kindIs "string" .Values.pluginIndex }}
{{- .Values.pluginIndex }}
{{- else }}
{{- printf "%02d" (int .Values.pluginIndex) }}
{{- end }}
{{- end }}

{{- define "nri-resize.configName" -}}
{{ include "nri-resize.suffixed" (list . "config") }}
{{- end }}

{{- define "nri-resize.metricsName" -}}
{{ include "nri-resize.suffixed" (list . "metrics") }}
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

{{/* The annotations of annotation-based scraping (Prometheus' kubernetes_sd_configs relabelling
by prometheus.io/scrape, port and path), on the pods or the Service
(monitoring.scrapeAnnotations). */}}
{{- define "nri-resize.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metricsPort | toString | quote }}
prometheus.io/path: /metrics
{{- end }}
