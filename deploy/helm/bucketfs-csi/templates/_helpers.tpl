{{/* The CSI driver's name: fixed by the driver (csi/mod.rs DRIVER_NAME). */}}
{{- define "bucketfs-csi.driverName" -}}
csi.bucketfs.io
{{- end }}

{{- define "bucketfs-csi.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "bucketfs-csi.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "bucketfs-csi.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Selector labels of one component (node or controller): call with (list . "node"). */}}
{{- define "bucketfs-csi.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The provisioner reads a StorageClass's secret with a get, never a list: nothing more. */}}
{{- define "bucketfs-csi.secretsRule" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
  {{- with .Values.controller.secretNames }}
  resourceNames:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
