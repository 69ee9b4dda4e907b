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
The PromQL label matchers of the operator's own series (up, dbop_controllers_running, dbop_ready)
in the alerts: metrics.prometheusRule.operatorSelector, or the job the ServiceMonitor gives the
metrics Service's targets and the release namespace.
*/}}
{{- define "dbop.operatorSelector" -}}
{{- default (printf "job=%q,namespace=%q" (printf "%s-metrics" (include "dbop.fullname" .)) .Release.Namespace) .Values.metrics.prometheusRule.operatorSelector }}
{{- end }}

{{/*
The watched namespaces, comma-separated: watchNamespaces and the older single watchNamespace,
each once. Empty: every namespace.
*/}}
{{- define "dbop.watchNamespaces" -}}
{{- concat .Values.watchNamespaces (list .Values.watchNamespace) | compact | uniq | join "," }}
{{- end }}

{{/*
What the operator does, and nothing more (the same rules for the ClusterRole and for the Role of
watchNamespaces mode). docs/install.md lists the call site of every verb; e2e/tests/helm.rs runs
the operator as this chart's ServiceAccount and fails on any Forbidden in the audit log.
*/}}
{{- define "dbop.rules" -}}
# Databases: watched (list, watch), read by the backup controller (get), the dbop.dev/cleanup
# finalizer (patch), their status (patch).
- apiGroups: ["dbop.dev"]
  resources: ["databases"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["dbop.dev"]
  resources: ["databases/status", "databasebackups/status"]
  verbs: ["patch"]
# DatabaseBackups: watched, read as a restore's or a deletion's source (get), made by the
# schedule, an upgrade and a Snapshot deletion (create), pruned by retention (delete), released
# from a deleted Database under Retain/Snapshot (patch: the owner reference).
- apiGroups: ["dbop.dev"]
  resources: ["databasebackups"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Owner references with blockOwnerDeletion (the objects a Database or a backup owns) need
# update on the owner's finalizers where OwnerReferencesPermissionEnforcement is on.
- apiGroups: ["dbop.dev"]
  resources: ["databases/finalizers", "databasebackups/finalizers"]
  verbs: ["update"]
# Secrets: the generated credentials and TLS ones (create; the server certificate applied, owner
# reference adopted or released, the CA copied into the credentials: patch), the
# users' credentials and S3 Secrets (get), dbop's own watched (list, watch: label-selected).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Services and StatefulSets: server-side apply (patch; create when they do not exist yet).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Data claims: made by the StatefulSet controller; dbop expands (patch) and, with
# deletionPolicy Delete, deletes them.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# The init Job, the restore Job, the backup and verify Jobs and the upgrade preflight Jobs; a
# failed init Job whose SQL was fixed since is deleted (with its uid as precondition) and made
# again.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Job pods: the agent's result is in their termination message, a preflight's image pull error
# in its waiting state. Database pods during an upgrade: their revision and readiness; a rollback
# deletes the pods stuck on the image being rolled back (src/upgrade/plan.rs). Database pods are
# watched (their role and readiness: label-selected) and labelled with their role (patch:
# dbop.dev/role, which the -rw and -ro Services select by).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch", "delete"]
# The PodDisruptionBudget of a Database with standbys: server-side apply (patch; create), watched
# (dbop's label) for the cache, deleted when the Database is down to one instance.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The NetworkPolicy of a Database with spec.networkPolicy: server-side apply (patch; create),
# watched (dbop's label) for the cache, deleted when the spec no longer asks for it.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The cert-manager Certificate of a Database with spec.tls.issuerRef: read each pass (get; not
# watched), server-side apply (patch; create), deleted when the spec no longer names an issuer.
# Without cert-manager installed these rules grant nothing.
- apiGroups: ["cert-manager.io"]
  resources: ["certificates"]
  verbs: ["get", "create", "patch", "delete"]
# ConfigMaps: read those referenced by spec.init.configMapRef and s3.ca; make the immutable one
# holding inline init SQL (mounted into the init Job as a file; deleted with a replaced init
# Job) and apply the server configuration `<name>-config` (mounted into the database pods),
# both watched (dbop's label) for the cache.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The primary Lease of every Database: watched (dbop's label) for the cache, made once (create),
# its designated primary written with a compare-and-swap (update). Its instances' identity: a
# ServiceAccount, and a Role and RoleBinding that let it read and update that one Lease (the
# operator holds those verbs itself, which is what lets it grant them).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create"]
# Events (a repeated one is patched into a series).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
