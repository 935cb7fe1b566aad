{{/*
The relaylet container's env from the chart's values, as YAML list items. extraEnv is rendered
after it and may not name any of these (deployment.yaml refuses it).
*/}}
{{- define "relaylet.env" -}}
{{- $certSecret := include "relaylet.servingCertSecret" . -}}
# The root apiserver dials the first Node address: this pod's IP.
- name: LEAF_NODE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
# Kosmos' spelling, with dashes; valid in a container env.
- name: PREFERRED-ADDRESS-TYPE
  value: {{ .Values.nodeServer.preferredAddressType | quote }}
- name: NODE_SERVER_PORT
  value: {{ .Values.nodeServer.port | quote }}
- name: NODE_PORTS
  value: {{ .Values.nodeServer.nodePorts | quote }}
- name: NODE_NAME_PREFIX
  value: {{ .Values.nodeNamePrefix | quote }}
- name: AUTH_MODE
  value: {{ .Values.auth.mode | quote }}
{{- if eq .Values.auth.mode "x509" }}
{{- if not .Values.auth.x509AllowedUsers }}
{{- fail "auth.mode=x509 needs auth.x509AllowedUsers: the root client CA also signs every node's kubelet client certificate, so without a list any of them could exec into every leaf pod" }}
{{- end }}
- name: X509_ALLOWED_USERS
  value: {{ join "," .Values.auth.x509AllowedUsers | quote }}
{{- end }}
- name: STREAM_IDLE_TIMEOUT
  value: {{ .Values.stream.idleTimeout | quote }}
- name: STREAM_CREATION_TIMEOUT
  value: {{ .Values.stream.creationTimeout | quote }}
- name: NODE_STATS_CACHE_TTL
  value: {{ .Values.nodeServer.statsCacheTTL | quote }}
- name: LEAF_SPARE_CONNECTION
  value: {{ .Values.stream.spareLeafConnection | quote }}
- name: EXTEND_WEBSOCKETS_TO_KUBELET
  value: {{ .Values.stream.extendWebSocketsToKubelet | quote }}
- name: MAX_CONNECTIONS
  value: {{ .Values.limits.maxConnections | quote }}
- name: MAX_CONNECTIONS_PER_CLIENT
  value: {{ .Values.limits.maxConnectionsPerClient | quote }}
- name: MAX_PENDING_HANDSHAKES
  value: {{ .Values.limits.maxPendingHandshakes | quote }}
- name: MAX_UNAUTHENTICATED_CONNECTIONS
  value: {{ .Values.limits.maxUnauthenticatedConnections | quote }}
- name: MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT
  value: {{ .Values.limits.maxUnauthenticatedConnectionsPerClient | quote }}
- name: MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER
  value: {{ .Values.limits.maxUnauthenticatedConnectionsPerUser | quote }}
- name: MAX_LARGE_HEAD_CONNECTIONS
  value: {{ .Values.limits.maxLargeHeadConnections | quote }}
- name: MAX_SESSIONS
  value: {{ .Values.limits.maxSessions | quote }}
- name: MAX_SESSIONS_PER_USER
  value: {{ .Values.limits.maxSessionsPerUser | quote }}
- name: MAX_SESSIONS_PER_NAMESPACE
  value: {{ .Values.limits.maxSessionsPerNamespace | default (max 1 (div (int .Values.limits.maxSessions) 4)) | quote }}
- name: MAX_LOG_STREAMS
  value: {{ .Values.limits.maxLogStreams | quote }}
- name: MAX_LOG_STREAMS_PER_USER
  value: {{ .Values.limits.maxLogStreamsPerUser | quote }}
- name: MAX_LOG_STREAMS_PER_NAMESPACE
  value: {{ .Values.limits.maxLogStreamsPerNamespace | default (max 1 (div (int .Values.limits.maxLogStreams) 4)) | quote }}
- name: LEAF_POD_SYNC
  value: {{ .Values.podSync.enabled | quote }}
{{- if and .Values.podSync.enabled .Values.podSync.rootApiserver }}
- name: LEAF_POD_ROOT_APISERVER
  value: {{ .Values.podSync.rootApiserver | quote }}
{{- end }}
- name: LEAF_POD_MATCH
  value: {{ .Values.leafPods.match | quote }}
{{- with .Values.leafPods.marker }}
- name: LEAF_POD_MARKER
  value: {{ . | quote }}
{{- end }}
# Leaf bounds: how many pods and nodes of one leaf are kept.
- name: LEAF_MAX_PODS
  value: {{ .Values.leafBounds.maxPods | quote }}
- name: LEAF_MAX_NODES
  value: {{ .Values.leafBounds.maxNodes | quote }}
# Open sessions may finish for this long after SIGTERM; 10 s less than the pod's
# termination grace period, so relaylet ends them itself before it is killed.
- name: SHUTDOWN_GRACE_PERIOD
  value: {{ printf "%ds" (max 1 (sub (int .Values.terminationGracePeriodSeconds) 20)) | quote }}
- name: LEADER_ELECT
  value: {{ .Values.leaderElection.enabled | quote }}
{{- if .Values.leaderElection.enabled }}
# The Deployment's selector: a replica Lease counts only for a Running pod it
# selects (docs/security.md, "Replicas").
- name: REPLICA_SELECTOR
  value: {{ include "relaylet.selectorLabels" . | replace ": " "=" | replace "\n" "," | quote }}
{{- end }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: LEAF_SECRET_NAMESPACE
  value: {{ include "relaylet.leafSecretNamespace" . | quote }}
- name: METRICS_ADDR
  value: {{ printf "0.0.0.0:%v" .Values.metrics.port | quote }}
- name: LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: RUST_LOG
  value: {{ .Values.log.level | quote }}
{{- if eq .Values.servingCert.mode "csr" }}
- name: SERVING_CERT_MODE
  value: csr
- name: SERVING_CERT_CSR_APPROVER
  value: {{ .Values.servingCert.csr.approver | quote }}
{{- with .Values.servingCert.csr.expiration }}
- name: SERVING_CERT_CSR_EXPIRATION
  value: {{ . | quote }}
{{- end }}
{{- with .Values.servingCert.csr.renewBefore }}
- name: SERVING_CERT_RENEW_BEFORE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if $certSecret }}
- name: APISERVER_CERT_LOCATION
  value: /etc/relaylet/serving/tls.crt
- name: APISERVER_KEY_LOCATION
  value: /etc/relaylet/serving/tls.key
{{- end }}
{{- if not (include "relaylet.readsClusterClientCA" .) }}
- name: APISERVER_CA_CERT_LOCATION
  value: {{ printf "/etc/relaylet/client-ca/%s" .Values.auth.clientCA.key | quote }}
{{- end }}
{{- end }}
