{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "kunpeng-tap.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every object. */}}
{{- define "kunpeng-tap.fullname" -}}
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

{{- define "kunpeng-tap.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "kunpeng-tap.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kunpeng-tap
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component ("agent" or "operator"): pass (list $ "agent"). */}}
{{- define "kunpeng-tap.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "kunpeng-tap.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "kunpeng-tap.agent.fullname" -}}
{{- printf "%s-agent" (include "kunpeng-tap.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kunpeng-tap.operator.fullname" -}}
{{- printf "%s-operator" (include "kunpeng-tap.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kunpeng-tap.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "kunpeng-tap.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kunpeng-tap.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "kunpeng-tap.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image reference: pass (list $ .Values.agent.image). */}}
{{- define "kunpeng-tap.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) }}
{{- end }}

{{/* The port of an address like ":9091" or "0.0.0.0:9091"; empty when there is none. */}}
{{- define "kunpeng-tap.portOf" -}}
{{- $parts := splitList ":" . -}}
{{- if gt (len $parts) 1 }}{{ last $parts }}{{ end -}}
{{- end }}

{{/* The runtime endpoint as a host path (`unix://` stripped). */}}
{{- define "kunpeng-tap.agent.runtimeSocket" -}}
{{- trimPrefix "unix://" .Values.agent.flags.containerRuntimeServiceEndpoint }}
{{- end }}

{{/*
"true" when the API server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy
(Kubernetes >= 1.30, unless switched off with --runtime-config), empty otherwise. `helm install`
and `helm upgrade` know it from the server's API list, and so does `helm template` given the
cluster's list with --api-versions (as GitOps tools pass it). A plain `helm template` knows no
resource at all (not even v1/Pod): there the Kubernetes version decides (--kube-version).
*/}}
{{- define "kunpeng-tap.vapServed" -}}
{{- $api := .Capabilities.APIVersions -}}
{{- if $api.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
true
{{- else if and (not ($api.Has "v1/Pod")) (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end }}

{{/*
"true" when the chart installs the agent's node-restriction policy: the value is on and the API
server serves it.
*/}}
{{- define "kunpeng-tap.nodeRestriction" -}}
{{- if and .Values.agent.enabled .Values.agent.nodeRestriction.enabled (include "kunpeng-tap.vapServed" .) -}}
true
{{- end -}}
{{- end }}

{{/*
"true" when the chart creates the PrometheusRule: the value is on and the API server serves
monitoring.coreos.com/v1 (prometheus-operator's CRDs), or `metrics.prometheusRule.force` is set
(a `helm template` for another cluster).
*/}}
{{- define "kunpeng-tap.prometheusRule" -}}
{{- $r := .Values.metrics.prometheusRule -}}
{{- $api := .Capabilities.APIVersions -}}
{{- if and $r.enabled (or $r.force ($api.Has "monitoring.coreos.com/v1") ($api.Has "monitoring.coreos.com/v1/PrometheusRule")) -}}
true
{{- end -}}
{{- end }}
