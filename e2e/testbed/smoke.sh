#!/usr/bin/env bash
# Smoke test of a running test bed (after up.sh): checks that the control plane behaves as the
# e2e tests rely on. Creates one namespace, deletes it at the end. Prints "N passed, N failed".
#   e2e/testbed/up.sh && e2e/testbed/smoke.sh; e2e/testbed/down.sh
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DIR="${DBOP_TESTBED_DIR:-$REPO_ROOT/.testbed}"
KC="$DIR/kubeconfig"
[[ -f "$KC" ]] || die "no $KC: run e2e/testbed/up.sh first"
BIN="$(testbed_bin_dir)"
NS="smoke-$(date +%s)-$RANDOM"
k() { "$BIN/kubectl" --kubeconfig "$KC" -n "$NS" "$@"; }
passed=0; failed=0
ok() { passed=$((passed + 1)); log "PASS: $*"; }
ko() { failed=$((failed + 1)); log "FAIL: $*"; }
# until <seconds> <command...>: retry every 0.5s
until_ok() { local end=$(( $(date +%s) + $1 )); shift; until "$@" >/dev/null 2>&1; do (( $(date +%s) < end )) || return 1; sleep 0.5; done; }
jp() { k get "$1" -o jsonpath="$2" 2>/dev/null; }
eq() { [[ "$(jp "$1" "$2")" == "$3" ]]; }
eql() { [[ "$(k get pods -l "$1" -o jsonpath="$2" 2>/dev/null)" == "$3" ]]; }

k create namespace "$NS" >/dev/null && ok "namespace $NS created" || ko "namespace"
until_ok 30 k get serviceaccount default && ok "default ServiceAccount appeared" || ko "default ServiceAccount"

# --- CRD with a CEL rule -----------------------------------------------------------------------
"$BIN/kubectl" --kubeconfig "$KC" apply -f - >/dev/null <<'YAML'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.testbed.dbop.dev
spec:
  group: smoke.testbed.dbop.dev
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.replicas <= self.maxReplicas"
              message: "replicas must not exceed maxReplicas"
            properties:
              replicas: {type: integer}
              maxReplicas: {type: integer}
YAML
until_ok 30 "$BIN/kubectl" --kubeconfig "$KC" wait --for condition=Established --timeout 5s crd/widgets.smoke.testbed.dbop.dev &&
  ok "CRD established" || ko "CRD established"
until_ok 20 k apply -f - <<'YAML' && ok "valid Widget accepted" || ko "valid Widget"
apiVersion: smoke.testbed.dbop.dev/v1
kind: Widget
metadata: {name: good}
spec: {replicas: 1, maxReplicas: 3}
YAML
out=$(k apply -f - 2>&1 <<'YAML'
apiVersion: smoke.testbed.dbop.dev/v1
kind: Widget
metadata: {name: bad}
spec: {replicas: 5, maxReplicas: 3}
YAML
) && ko "invalid Widget was accepted" || {
  grep -q "replicas must not exceed maxReplicas" <<<"$out" && ok "invalid Widget refused by CEL: $(tail -1 <<<"$out" | cut -c1-120)" || ko "invalid Widget refused, but not by CEL: $out"; }

# --- StatefulSet with a volumeClaimTemplate --------------------------------------------------------
sts() { # name replicas image
cat <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: $1}
spec:
  replicas: $2
  serviceName: $1
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}}
    spec:
      containers:
      - {name: db, image: "$3"}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
YAML
}
sts db 1 postgres:16.4 | k apply -f - >/dev/null
until_ok 60 eq pvc/data-db-0 '{.status.phase}' Bound && ok "PVC data-db-0 Bound to $(jp pvc/data-db-0 '{.spec.volumeName}') (capacity $(jp pvc/data-db-0 '{.status.capacity.storage}'))" || ko "PVC data-db-0 not Bound: $(jp pvc/data-db-0 '{.status}')"
until_ok 60 eq pod/db-0 '{.status.conditions[?(@.type=="Ready")].status}' True &&
  ok "pod db-0 on $(jp pod/db-0 '{.spec.nodeName}'), phase $(jp pod/db-0 '{.status.phase}'), Ready" || ko "pod db-0 not Ready: $(jp pod/db-0 '{.status}')"
[[ "$(jp pod/db-0 '{.spec.nodeName}')" == kwok-node-* ]] || ko "db-0 not on a kwok node"
until_ok 30 eq statefulset/db '{.status.readyReplicas}' 1 && ok "StatefulSet db readyReplicas=1" || ko "StatefulSet readyReplicas: $(jp statefulset/db '{.status}')"

# PVC expansion: accepted (allowVolumeExpansion), spec grows; status.capacity is the PV's size.
k patch pvc data-db-0 --type merge -p '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}' >/dev/null &&
  eq pvc/data-db-0 '{.spec.resources.requests.storage}' 2Gi && ok "PVC expansion accepted (spec 2Gi, status.capacity $(jp pvc/data-db-0 '{.status.capacity.storage}'))" || ko "PVC expansion refused"
k patch pvc data-db-0 --type merge -p '{"spec":{"resources":{"requests":{"storage":"150Gi"}}}}' >/dev/null
until_ok 30 eq pvc/data-db-0 '{.status.capacity.storage}' 150Gi && ok "PVC expansion beyond the PV's size: status.capacity 150Gi (kwok resizer stage)" || ko "PVC resize: $(jp pvc/data-db-0 '{.status}')"

# --- Jobs --------------------------------------------------------------------------------------
job() { # name labels(yaml flow map)
cat <<YAML
apiVersion: batch/v1
kind: Job
metadata: {name: $1}
spec:
  backoffLimit: 0
  template:
    metadata: {labels: $2}
    spec:
      restartPolicy: Never
      initContainers:
      - {name: prepare, image: busybox}
      containers:
      - {name: agent, image: dbop-backup:dev}
YAML
}
job "done" '{app: done}' | k apply -f - >/dev/null
until_ok 60 eq job/done '{.status.conditions[?(@.type=="Complete")].status}' True && ok "Job done Complete" || ko "Job done: $(jp job/done '{.status}')"
p=$(k get pods -l job-name=done -o jsonpath='{.items[0].metadata.name}')
[[ "$(jp "pod/$p" '{.status.initContainerStatuses[0].state.terminated.reason}/{.status.containerStatuses[0].state.terminated.exitCode}')" == "Completed/0" ]] &&
  ok "Job pod $p: init container Completed, container exit 0" || ko "Job pod status: $(jp "pod/$p" '{.status}')"

job held '{app: held, testbed.dbop.dev/hold: "true"}' | k apply -f - >/dev/null
until_ok 30 eql "job-name=held" '{.items[0].status.phase}' Running || ko "held pod not Running"
sleep 4
p=$(k get pods -l job-name=held -o jsonpath='{.items[0].metadata.name}')
[[ "$(jp "pod/$p" '{.status.phase}')" == Running ]] && ok "held Job pod still Running after 4s" || ko "held pod: $(jp "pod/$p" '{.status.phase}')"
MSG='{"ok":false,"error":"upload failed: 503 Slow Down","bytes":12345}'
k annotate pod "$p" testbed.dbop.dev/termination-message="$MSG" testbed.dbop.dev/outcome=Failed >/dev/null
until_ok 30 eq "pod/$p" '{.status.phase}' Failed && ok "held pod Failed after the outcome annotation" || ko "held pod: $(jp "pod/$p" '{.status}')"
got=$(jp "pod/$p" '{.status.containerStatuses[0].state.terminated.message}')
[[ "$got" == "$MSG" && "$(jp "pod/$p" '{.status.containerStatuses[0].state.terminated.exitCode}')" == 1 ]] &&
  ok "termination message and exit code 1 in pod status: $got" || ko "termination message: got '$got'"
until_ok 30 eq job/held '{.status.conditions[?(@.type=="Failed")].status}' True && ok "Job held Failed" || ko "Job held: $(jp job/held '{.status}')"

job held-ok '{app: held-ok, testbed.dbop.dev/hold: "true"}' | k apply -f - >/dev/null
until_ok 30 eql "job-name=held-ok" '{.items[0].status.phase}' Running
p=$(k get pods -l job-name=held-ok -o jsonpath='{.items[0].metadata.name}')
k annotate pod "$p" testbed.dbop.dev/outcome=Succeeded 'testbed.dbop.dev/termination-message={"ok":true}' >/dev/null
until_ok 30 eq job/held-ok '{.status.conditions[?(@.type=="Complete")].status}' True &&
  ok "held Job completes after outcome=Succeeded (message $(jp "pod/$p" '{.status.containerStatuses[0].state.terminated.message}'))" || ko "Job held-ok: $(jp job/held-ok '{.status}')"

# --- never-ready -------------------------------------------------------------------------------
k apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: sulky, labels: {testbed.dbop.dev/never-ready: "true"}}
spec:
  containers: [{name: c, image: postgres:16.4}]
YAML
until_ok 30 eq pod/sulky '{.status.phase}' Running && sleep 3 &&
  eq pod/sulky '{.status.conditions[?(@.type=="Ready")].status}' False && eq pod/sulky '{.status.containerStatuses[0].started}' true &&
  ok "never-ready pod Running, container started, Ready=False" || ko "never-ready: $(jp pod/sulky '{.status}')"

# --- pod deletion: Deployment and StatefulSet pods are removed and recreated -------------------------
k create deployment web --image=nginx:1 >/dev/null
until_ok 60 eq deployment/web '{.status.readyReplicas}' 1 || ko "deployment not ready"
old=$(k get pods -l app=web -o jsonpath='{.items[0].metadata.name}')
k delete pod "$old" --wait=true --timeout=30s >/dev/null && ! k get pod "$old" >/dev/null 2>&1 && ok "Deployment pod $old deleted (removed by kwok)" || ko "Deployment pod $old not removed"
until_ok 60 eq deployment/web '{.status.readyReplicas}' 1 && new=$(k get pods -l app=web -o jsonpath='{.items[0].metadata.name}') && [[ "$new" != "$old" ]] &&
  ok "Deployment pod recreated as $new and Ready" || ko "Deployment pod not recreated"
uid=$(jp pod/db-0 '{.metadata.uid}')
k delete pod db-0 --wait=true --timeout=30s >/dev/null
until_ok 60 bash -c "[[ \"\$(\"$BIN/kubectl\" --kubeconfig '$KC' -n '$NS' get pod db-0 -o jsonpath='{.metadata.uid} {.status.conditions[?(@.type==\"Ready\")].status}')\" == *' True' && \"\$(\"$BIN/kubectl\" --kubeconfig '$KC' -n '$NS' get pod db-0 -o jsonpath='{.metadata.uid}')\" != '$uid' ]]" &&
  ok "StatefulSet pod db-0 recreated (new uid) and Ready, same PVC $(jp pod/db-0 '{.spec.volumes[0].persistentVolumeClaim.claimName}')" || ko "db-0 not recreated"

# --- garbage collection ------------------------------------------------------------------------
k create configmap owner >/dev/null
ouid=$(jp configmap/owner '{.metadata.uid}')
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: owned
  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: owner, uid: $ouid}]
YAML
k delete configmap owner >/dev/null
until_ok 60 bash -c "! '$BIN/kubectl' --kubeconfig '$KC' -n '$NS' get configmap owned" && ok "garbage collector deleted the owned ConfigMap" || ko "owned ConfigMap still there"

# --- StatefulSet RollingUpdate with a partition ------------------------------------------------------
sts pair 2 postgres:16.3 | k apply -f - >/dev/null
until_ok 90 eq statefulset/pair '{.status.readyReplicas}' 2 || ko "pair not ready: $(jp statefulset/pair '{.status}')"
k patch statefulset pair --type merge -p '{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"partition":1}},"template":{"spec":{"containers":[{"name":"db","image":"postgres:16.4"}]}}}}' >/dev/null
until_ok 90 eq pod/pair-1 '{.spec.containers[0].image} {.status.conditions[?(@.type=="Ready")].status}' "postgres:16.4 True" &&
  sleep 2 && eq pod/pair-0 '{.spec.containers[0].image}' postgres:16.3 && eq statefulset/pair '{.status.updatedReplicas}' 1 &&
  ok "partition=1: pair-1 updated to postgres:16.4, pair-0 kept postgres:16.3, updatedReplicas=1" ||
  ko "partition: pair-0=$(jp pod/pair-0 '{.spec.containers[0].image}') pair-1=$(jp pod/pair-1 '{.spec.containers[0].image}')"
k patch statefulset pair --type merge -p '{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}' >/dev/null
until_ok 90 eq pod/pair-0 '{.spec.containers[0].image} {.status.conditions[?(@.type=="Ready")].status}' "postgres:16.4 True" &&
  ok "partition=0: pair-0 updated too" || ko "pair-0 not updated after partition 0"

# --- PV pool: a deleted claim's volume becomes Available again ---------------------------------------
pv=$(jp pvc/data-db-0 '{.spec.volumeName}')
k delete statefulset db --wait=true >/dev/null; k delete pvc data-db-0 --wait=true >/dev/null
until_ok 60 bash -c "[[ \"\$('$BIN/kubectl' --kubeconfig '$KC' get pv $pv -o jsonpath='{.status.phase}')\" == Available ]]" &&
  ok "PV $pv Released and recycled to Available" || ko "PV $pv: $("$BIN/kubectl" --kubeconfig "$KC" get pv "$pv" -o jsonpath='{.status.phase}')"

# --- audit log ---------------------------------------------------------------------------------
# shellcheck disable=SC1091
. "$DIR/ports.env"
curl -fsS -o /dev/null -A "dbop-smoke/0.0 (audit check)" --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" \
  -H 'Content-Type: application/json' -X POST "https://${API_ADDR:-127.0.0.1}:$API_PORT/api/v1/namespaces/$NS/configmaps" \
  -d '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"audited"}}'
n=$(grep -c '"userAgent":"dbop-smoke/0.0 (audit check)"' "$DIR/audit.log")
line=$(grep '"userAgent":"dbop-smoke/0.0 (audit check)"' "$DIR/audit.log" | tail -1)
[[ "$n" == 1 ]] && grep -q '"verb":"create"' <<<"$line" && grep -q '"name":"audited"' <<<"$line" &&
  ok "audit log: exactly 1 write by user agent dbop-smoke (verb create, user $(sed -n 's/.*"user":{"username":"\([^"]*\)".*/\1/p' <<<"$line"))" || ko "audit log: $n lines: $line"

"$BIN/kubectl" --kubeconfig "$KC" delete namespace "$NS" --wait=false >/dev/null
"$BIN/kubectl" --kubeconfig "$KC" delete crd widgets.smoke.testbed.dbop.dev --wait=false >/dev/null
echo "smoke: $passed passed, $failed failed"
((failed == 0))
