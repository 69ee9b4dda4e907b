{{/* The chart name, or nameOverride. */}}
{{- define "dbop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, or the release name when it already
contains the chart name, or "<release>-<chart>".
*/}}
{{- define "dbop.fullname" -}}
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

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "dbop.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels that select the operator's pod. Not `app.kubernetes.io/managed-by: dbop`: that label
marks the objects the operator itself manages, and its watches select on it.
*/}}
{{- define "dbop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dbop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The labels of every object of the chart. */}}
{{- define "dbop.labels" -}}
helm.sh/chart: {{ include "dbop.chart" . }}
{{ include "dbop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "dbop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dbop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image, tagged with image.tag or the appVersion. */}}
{{- define "dbop.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
What the operator does, and nothing more (the same rules for the ClusterRole and for the Role of
watchNamespace mode). Keep in step with the code: src/controller.rs and src/backup/controller.rs
(watches), src/reconcile/{observe,act,cleanup}.rs (reads and writes), src/upgrade/ (decides).
*/}}
{{- define "dbop.rules" -}}
# The API: Databases (read, finalizer patch) and DatabaseBackups (the schedule creates and
# prunes backups), their status, and the dbop.dev/cleanup finalizer.
- apiGroups: ["dbop.dev"]
  resources: ["databases"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["dbop.dev"]
  resources: ["databasebackups"]
  verbs: ["get", "list", "watch", "patch", "update", "create", "delete"]
- apiGroups: ["dbop.dev"]
  resources: ["databases/status", "databasebackups/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["dbop.dev"]
  resources: ["databases/finalizers", "databasebackups/finalizers"]
  verbs: ["update"]
# Owned objects: the credentials Secret (also reads users' credentials and S3 Secrets, keys only),
# the Services, the data claims (expansion; deleted by deletionPolicy Delete).
- apiGroups: [""]
  resources: ["secrets", "services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The init Job, the backup Jobs and the upgrade preflight Jobs.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create"]
# Job pods: the agent's result is in their termination message, a preflight's image pull error
# in its waiting state. Database pods during an upgrade: their revision and readiness; a rollback
# deletes the pods stuck on the image being rolled back (src/upgrade/plan.rs).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "delete"]
# ConfigMaps: read those referenced by spec.init.configMapRef and s3.ca; create the one holding
# inline init SQL (mounted into the init Job as a file).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
