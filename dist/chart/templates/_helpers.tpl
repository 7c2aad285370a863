{{- /* Names, labels and images shared by Ichor's templates. */}}

{{- define "ichor.chart" -}}
{{ printf "%s-%s" .Chart.Name (.Chart.Version | replace "+" "_") }}
{{- end }}

{{- /* Labels on every object of the chart. */}}
{{- define "ichor.labels" -}}
helm.sh/chart: {{ include "ichor.chart" . }}
app.kubernetes.io/name: ichor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ichor
{{- end }}

{{- /* The controller's selector. `app.kubernetes.io/name: ichor` is how
ichor adopt recognises a Helm-installed Ichor (R4.3a): do not change it. */}}
{{- define "ichor.controller.selector" -}}
app.kubernetes.io/name: ichor
app.kubernetes.io/component: controller
{{- end }}

{{- define "ichor.controller.image" -}}
{{ .Values.manager.image.repository }}:{{ .Values.manager.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "ichor.ui.selector" -}}
app.kubernetes.io/name: ichor
app.kubernetes.io/component: ui
{{- end }}

{{- /* The UI runs the ichor binary (`ichor ui`); the ichor-ui image carries it. */}}
{{- define "ichor.ui.image" -}}
{{ .Values.ichorUI.image.repository }}:{{ .Values.ichorUI.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "ichor.webhook.service" -}}ichor-webhook{{- end }}
{{- define "ichor.webhook.secret" -}}ichor-webhook-tls{{- end }}

{{- /* Checks that need no cluster: the namespace and the values. */}}
{{- define "ichor.checks" -}}
{{- if ne .Release.Namespace "ichor-system" -}}
{{- fail (printf "Ichor runs in the namespace ichor-system, not %s: install with --namespace ichor-system --create-namespace" .Release.Namespace) -}}
{{- end -}}
{{- $port := int .Values.ichorUI.port -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "ichorUI.port %v is not a TCP port: use 1-65535 (default 8443)" .Values.ichorUI.port) -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.ichorUI.plaintextPort) -}}
{{- $plain := int .Values.ichorUI.plaintextPort -}}
{{- if or (lt $plain 1) (gt $plain 65535) (eq $plain $port) -}}
{{- fail (printf "ichorUI.plaintextPort %v is not a TCP port other than ichorUI.port: use 1-65535, or null for none" .Values.ichorUI.plaintextPort) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.ichorUI.tls.caConfigMap .Values.ichorUI.tls.caSecret -}}
{{- fail "set one of ichorUI.tls.caConfigMap and ichorUI.tls.caSecret, not both" -}}
{{- end -}}
{{- $np := .Values.networkPolicy.cilium.enabled -}}
{{- if not (or (kindIs "invalid" $np) (kindIs "bool" $np)) -}}
{{- fail (printf "networkPolicy.cilium.enabled is %v: use true, false or null" $np) -}}
{{- end -}}
{{- end }}

{{- /* A ServiceMonitor's or PodMonitor's interval and scrapeTimeout, when set. */}}
{{- define "ichor.monitoring.timing" -}}
{{- with .interval }}
interval: {{ . }}
{{- end }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
{{- end }}

{{- /* The runbook address written in files/prometheus-rules.yaml, which
monitoring.prometheusRule.runbookUrl replaces. */}}
{{- define "ichor.monitoring.defaultRunbookUrl" -}}
https://github.com/maesh/ichor/blob/main/docs/runbooks.md
{{- end }}
