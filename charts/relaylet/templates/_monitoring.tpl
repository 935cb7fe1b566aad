{{/*
An alert's `for` and labels: its severity, then metrics.prometheusRule.alertLabels. Called with
(list $alert $prometheusRule).
*/}}
{{- define "relaylet.alertLabels" -}}
{{- $alert := index . 0 }}
{{- $rule := index . 1 -}}
for: {{ $alert.for }}
labels:
  severity: {{ $alert.severity }}
  {{- with $rule.alertLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/*
A counter that rose in the last 15 minutes, summed by namespace and the labels given. A child of
a relaylet family is made by its first event, so its series starts at 1 and increase() alone
never sees that first rise: a series that did not exist 15 minutes ago counts as risen too.
Called with (list "counter_total" "namespace=\"ns\"" "label, label").
*/}}
{{- define "relaylet.rose" -}}
{{- $name := index . 0 }}
{{- $sel := index . 1 }}
{{- $by := index . 2 -}}
sum by (namespace, {{ $by }}) (
  (increase({{ $name }}{ {{- $sel -}} }[15m]) > 0)
  or ({{ $name }}{ {{- $sel -}} } unless {{ $name }}{ {{- $sel -}} } offset 15m)
)
{{- end }}

{{/*
The scrape settings shared by the ServiceMonitor's endpoint and the PodMonitor's; called with
the monitor's values.
*/}}
{{- define "relaylet.scrapeEndpoint" -}}
port: metrics
path: /metrics
scheme: http
interval: {{ .interval }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
{{- with .relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A monitor made in another namespace than the release's selects the release namespace's
objects; called with (list $ $monitor).
*/}}
{{- define "relaylet.monitorNamespaceSelector" -}}
{{- $root := index . 0 }}
{{- $monitor := index . 1 }}
{{- if and $monitor.namespace (ne $monitor.namespace $root.Release.Namespace) -}}
namespaceSelector:
  matchNames:
    - {{ $root.Release.Namespace }}
{{- end }}
{{- end }}
