{{- define "idemsvc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "idemsvc.fullname" -}}
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

{{- define "idemsvc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "idemsvc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "idemsvc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idemsvc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "idemsvc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "idemsvc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "idemsvc.tenantsSecret" -}}
{{- default (printf "%s-tenants" (include "idemsvc.fullname" .)) .Values.tenants.secretName }}
{{- end }}

{{- define "idemsvc.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The scheme idemsvc serves: HTTPS with tls.enabled. */}}
{{- define "idemsvc.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/*
Settings that cannot work together fail the rendering, as idemsvc would
refuse them at start.
*/}}
{{- define "idemsvc.validate" -}}
{{- $r := .Values.redis }}
{{- $modes := 0 }}
{{- if $r.url }}{{ $modes = add1 $modes }}{{ end }}
{{- if $r.clusterAddrs }}{{ $modes = add1 $modes }}{{ end }}
{{- if $r.sentinel.addrs }}{{ $modes = add1 $modes }}{{ end }}
{{- if ne (int $modes) 1 }}
{{- fail "redis: give exactly one of redis.url, redis.clusterAddrs and redis.sentinel.addrs (without Redis idemsvc runs an in-memory store of one process)" }}
{{- end }}
{{- if and $r.sentinel.addrs (not $r.sentinel.master) }}
{{- fail "redis.sentinel.addrs needs redis.sentinel.master" }}
{{- end }}
{{- if and $r.url $r.tls.enabled }}
{{- fail "redis.tls.enabled is for Cluster and Sentinel: write redis.url as rediss://host:port for TLS to one node" }}
{{- end }}
{{- if and $r.tls.secretName (not $r.tls.enabled) (not (hasPrefix "rediss://" (lower $r.url))) }}
{{- fail "redis.tls.secretName needs TLS to Redis: redis.tls.enabled, or a rediss:// redis.url" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName, a kubernetes.io/tls Secret" }}
{{- end }}
{{- if and .Values.tls.clientCA.enabled (not .Values.tls.enabled) }}
{{- fail "tls.clientCA.enabled needs tls.enabled" }}
{{- end }}
{{- if and .Values.tenants.create (not .Values.tenants.file) }}
{{- fail "tenants.create needs tenants.file, the tenants file's content" }}
{{- end }}
{{- range $k, $v := .Values.env }}
{{- if has $k (list "IDEMSVC_LISTEN" "IDEMSVC_TENANTS_FILE" "IDEMSVC_TLS_CERT_FILE" "IDEMSVC_TLS_KEY_FILE" "IDEMSVC_TLS_CLIENT_CA_FILE" "IDEMSVC_REDIS_PASSWORD") }}
{{- fail (printf "env.%s: the chart sets it (see values.yaml)" $k) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
An environment value as idemsvc reads it: a number as an integer (Helm
would write 10485760 from a values file as 1.048576e+07, which idemsvc
refuses), anything else as text.
*/}}
{{- define "idemsvc.envValue" -}}
{{- if kindIs "float64" . -}}{{ . | int64 | toString | quote }}{{- else -}}{{ . | toString | quote }}{{- end -}}
{{- end }}
