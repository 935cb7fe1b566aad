{{/*
Names and labels shared by every object of the release.
*/}}

{{- define "relaylet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's object name; also the ServiceAccount's and the RBAC objects' base name. */}}
{{- define "relaylet.fullname" -}}
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

{{- define "relaylet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "relaylet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "relaylet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "relaylet.labels" -}}
helm.sh/chart: {{ include "relaylet.chart" . }}
{{ include "relaylet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "relaylet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Where leaf kubeconfig Secrets live. */}}
{{- define "relaylet.leafSecretNamespace" -}}
{{- default .Release.Namespace .Values.leafSecretNamespace }}
{{- end }}

{{/* Whether the root client CA is read from kube-system (no bundle given in values). */}}
{{- define "relaylet.readsClusterClientCA" -}}
{{- if and (not .Values.auth.clientCA.configMap) (not .Values.auth.clientCA.secret) }}true{{ end }}
{{- end }}

{{/* The Secret holding the serving certificate, when relaylet does not generate one. */}}
{{- define "relaylet.servingCertSecret" -}}
{{- if eq .Values.servingCert.mode "secret" }}
{{- .Values.servingCert.secret.name }}
{{- else if eq .Values.servingCert.mode "certManager" }}
{{- printf "%s-serving-cert" (include "relaylet.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The container's resources: the values', with a memory limit derived from every cap in
limits when none is given, so the caps are reached before the OOM killer: 64 MiB, plus in KiB
48 per connection (each may hold a small partial request head), 16 per pending handshake, 128
more per connection with a large head, 48 per session and 48 more per log stream (values.yaml
says why; tests/it/memory_caps.rs fills every cap at once under it).
*/}}
{{- define "relaylet.memoryLimitMiB" -}}
{{- $l := .Values.limits -}}
{{- $kib := add (mul (int $l.maxConnections) 48) (mul (int $l.maxPendingHandshakes) 16) (mul (int $l.maxLargeHeadConnections) 128) (mul (int $l.maxSessions) 48) (mul (int $l.maxLogStreams) 48) -}}
{{- add 64 (div (add $kib 1023) 1024) -}}
{{- end -}}

{{- define "relaylet.resources" -}}
{{- $res := deepCopy .Values.resources -}}
{{- $limits := default (dict) $res.limits -}}
{{- if not (hasKey $limits "memory") -}}
{{- $_ := set $limits "memory" (printf "%sMi" (include "relaylet.memoryLimitMiB" .)) -}}
{{- end -}}
{{- $_ := set $res "limits" $limits -}}
{{- toYaml $res -}}
{{- end -}}
