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

{{/* The ServiceAccount relaylet runs as (made by the chart unless serviceAccount.create=false). */}}
{{- define "relaylet.serviceAccountName" -}}
{{- default (include "relaylet.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/*
With hostNetwork, relaylet's ports are the node's: the kubelet port and the nodePorts above it,
and the metrics port, must stay clear of the node's own daemons (10248-10259: kubelet healthz,
kube-proxy metrics, kubelet, kubelet read-only, kube-proxy healthz, controller-manager,
cloud-controller-manager, scheduler) and of each other.
*/}}
{{- define "relaylet.checkHostPorts" -}}
{{- if .Values.hostNetwork }}
{{- $first := int .Values.nodeServer.port }}
{{- $last := add $first .Values.nodeServer.nodePorts }}
{{- if and (le $first 10259) (ge $last 10248) }}
{{- fail (printf "hostNetwork=true: nodeServer.port %d and the nodePorts above it (up to %d) are the node's ports and overlap 10248-10259, where the node's kubelet (10250), kube-proxy and control plane listen: set nodeServer.port to 10260 or more (e.g. 10300), or lower it with fewer nodePorts (docs/install.md, \"Host network\")" $first $last) }}
{{- end }}
{{- $metrics := int .Values.metrics.port }}
{{- if and (ge $metrics 10248) (le $metrics 10259) }}
{{- fail (printf "hostNetwork=true: metrics.port %d is one of the node's own ports (10248-10259): choose another" $metrics) }}
{{- end }}
{{- if and (ge $metrics $first) (le $metrics $last) }}
{{- fail (printf "hostNetwork=true: metrics.port %d is in the kubelet ports %d-%d (nodeServer.port and nodePorts): choose another" $metrics $first $last) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A map of values as YAML, the keys of .order first and in that order, then any others sorted
(so the defaults render in the order they always had); a key set to null is left out. Called
with (dict "values" $map "order" (list ...)).
*/}}
{{- define "relaylet.orderedYaml" -}}
{{- $m := .values -}}
{{- $lines := list -}}
{{- range $k := .order }}
{{- if and (hasKey $m $k) (not (kindIs "invalid" (index $m $k))) }}{{ $lines = append $lines (dict $k (index $m $k) | toYaml) }}{{ end }}
{{- end }}
{{- range $k, $v := $m }}
{{- if and (not (has $k $.order)) (not (kindIs "invalid" $v)) }}{{ $lines = append $lines (dict $k $v | toYaml) }}{{ end }}
{{- end }}
{{- join "\n" $lines }}
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
