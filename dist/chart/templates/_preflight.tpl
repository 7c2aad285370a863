{{- /*
ichor.preflight: refuses an install on a cluster with no pod network.

It reads the Nodes with `lookup`. When every node is NotReady and its Ready
condition says the network plugin is not ready, the chart's pods could never
start, so the install fails with what to do. It is skipped when `lookup`
returns nothing (helm template, helm install --dry-run, no nodes) and by
preflight.cni=false.
*/}}
{{- define "ichor.preflight" -}}
{{- if .Values.preflight.cni -}}
{{- $found := lookup "v1" "Node" "" "" -}}
{{- $nodes := list -}}
{{- if and $found (hasKey $found "items") -}}
{{- $nodes = get $found "items" | default list -}}
{{- end -}}
{{- if gt (len $nodes) 0 -}}
{{- $noNetwork := 0 -}}
{{- range $node := $nodes -}}
{{- range $cond := (dig "status" "conditions" list $node) -}}
{{- if and (eq (get $cond "type") "Ready") (ne (get $cond "status") "True") -}}
{{- $text := printf "%v %v" (get $cond "reason") (get $cond "message") -}}
{{- if or (contains "NetworkPluginNotReady" $text) (contains "cni plugin not initialized" $text) -}}
{{- $noNetwork = add1 $noNetwork -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq (int $noNetwork) (len $nodes) -}}
{{- fail "this cluster has no pod network, so Ichor's pods cannot start. Run ichor cni bootstrap first (it installs Ichor's Cilium), then helm install again." -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}
