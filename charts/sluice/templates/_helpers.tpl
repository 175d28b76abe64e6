{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "gateway") */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}-{{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sluice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The operator's fixed contract (operator/sluice_operator/builders/routing_table.py): it writes this ConfigMap
     and key in every namespace holding InferenceModels; the gateway mounts it from its own namespace. */}}
{{- define "sluice.routingTable.name" -}}sluice-routing-table{{- end -}}
{{- define "sluice.routingTable.key" -}}routing-table.json{{- end -}}

{{/* Labels of the runtime pods the operator creates (operator/sluice_operator/builders/names.py). */}}
{{- define "sluice.runtimeSelector" -}}
app.kubernetes.io/name: sluice-runtime
app.kubernetes.io/managed-by: sluice-operator
{{- end -}}

{{- define "sluice.gatewaySecretName" -}}
{{- .Values.gateway.config.existingSecret | default (printf "%s-gateway" (include "sluice.fullname" .)) -}}
{{- end -}}

{{/* The bundled Redis runs unless redis.url names another. */}}
{{- define "sluice.redisBundled" -}}
{{- if and .Values.redis.bundled.enabled (not .Values.redis.url) }}true{{ end -}}
{{- end -}}

{{- define "sluice.redisUrl" -}}
{{- if include "sluice.redisBundled" . -}}
redis://{{ include "sluice.fullname" . }}-redis:6379/0
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* Rules of the operator's RBAC (operator/sluice_operator/rbac/rules.yaml, copied into files/ by `make crds`),
     the named sets joined, with this release's name in resourceNames: (dict "root" $ "sets" (list "served")) */}}
{{- define "sluice.operatorRules" -}}
{{- $all := .root.Files.Get "files/operator-rbac.yaml" | fromYaml -}}
{{- $rules := list -}}
{{- range .sets }}{{ $rules = concat $rules (get $all .) }}{{ end -}}
{{- toYaml $rules | replace "sluice-runtime" (printf "%s-runtime" (include "sluice.fullname" .root)) -}}
{{- end -}}

{{/* The runtime credential (contracts/sluice_contracts/runtime_credential.py): the operator fills the Secret
     `<fullname>-runtime-credential` of the release namespace and copies it into every namespace it serves;
     the gateway and the runtime pods mount it at this directory. */}}
{{- define "sluice.runtimeCredential.name" -}}
{{- .Values.gateway.runtimeCredentialSecret | default (printf "%s-runtime-credential" (include "sluice.fullname" .)) -}}
{{- end -}}
{{- define "sluice.runtimeCredential.dir" -}}/var/run/sluice/runtime-credential{{- end -}}
{{- define "sluice.runtimeCredential.key" -}}api-key{{- end -}}

{{/* A label map as the operator's flags take it: k=v,k=v (sorted). */}}
{{- define "sluice.labelList" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* gateway.yaml as the chart renders it: (dict "root" $) for the whole file, (dict "root" $ "startOnly" true) for
     the fields the gateway binds at start only (all but files/gateway-reloadable-fields.yaml), whose checksum
     restarts the gateway pods when they change. */}}
{{- define "sluice.gatewayConfig" -}}
{{- $root := .root -}}
{{- $c := $root.Values.gateway.config -}}
{{- $credential := printf "%s/%s" (include "sluice.runtimeCredential.dir" $root) (include "sluice.runtimeCredential.key" $root) -}}
{{- $config := dict "listen" (dict "host" "0.0.0.0" "port" 8080) "max_body_bytes" (int $c.maxBodyBytes) "access_log" $c.accessLog "tenants" $c.tenants "admin_keys" $c.adminKeys "upstream_credential_file" $credential "metrics_port" (int $root.Values.gateway.metricsPort) -}}
{{- with $c.timeouts }}{{ $_ := set $config "timeouts" . }}{{ end -}}
{{- $_ := set $config "shutdown" (dict "ready_grace_s" (int $root.Values.gateway.shutdown.readyGraceSeconds) "drain_s" (int $root.Values.gateway.shutdown.drainSeconds)) -}}
{{- with $c.routing }}{{ $_ := set $config "routing" . }}{{ end -}}
{{- with $c.coldStart }}{{ $_ := set $config "cold_start" . }}{{ end -}}
{{- with $c.responses }}{{ $_ := set $config "responses" . }}{{ end -}}
{{- $batch := deepCopy ($c.batch | default dict) -}}
{{- $_ := set $batch "files_dir" (printf "%s/files" (include "sluice.batchStoreDir" $root)) -}}
{{- if $root.Values.gateway.batchStore.databaseSecret.name -}}
{{- $_ := set $batch "database_file" (include "sluice.batchDatabaseFile" $root) -}}
{{- else -}}
{{- $_ := set $batch "database" (printf "%s/batch.db" (include "sluice.batchStoreDir" $root)) -}}
{{- end -}}
{{- $_ := set $config "batch" $batch -}}
{{- with $c.priority }}{{ $_ := set $config "priority" . }}{{ end -}}
{{- $audit := deepCopy ($c.audit | default dict) -}}
{{- if $root.Values.gateway.promptCapture.enabled -}}
{{- $capture := deepCopy (get $audit "prompt_capture" | default dict) -}}
{{- $_ := set $capture "sink" (include "sluice.promptCaptureFile" $root) -}}
{{- $_ := set $audit "prompt_capture" $capture -}}
{{- end -}}
{{- with $audit }}{{ $_ := set $config "audit" . }}{{ end -}}
{{- with (include "sluice.redisUrl" $root) }}
{{- $_ := set $config "redis" (include "sluice.redisSettings" $root | fromJson) -}}
{{- end -}}
{{- if .startOnly -}}
{{- range ($root.Files.Get "files/gateway-reloadable-fields.yaml" | fromYamlArray) }}{{ $config = omit $config . }}{{ end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The gateway's writable volume for the batch store (its config's Secret mount is read-only): the files'
     contents, and the SQLite file when no PostgreSQL Secret is named. */}}
{{- define "sluice.batchStoreDir" -}}/var/lib/sluice/batch{{- end -}}

{{/* Where the PostgreSQL URL's Secret is mounted: a fixed file name, whatever its key, so that an existingSecret
     gateway.yaml can name it too. */}}
{{- define "sluice.batchDatabaseDir" -}}/var/run/sluice/batch-database{{- end -}}
{{- define "sluice.batchDatabaseFile" -}}{{ include "sluice.batchDatabaseDir" . }}/url{{- end -}}

{{/* The gateway's writable volume for prompt capture (gateway.promptCapture), of its own: whoever may read the
     captured prompts need not be who may read the batches. */}}
{{- define "sluice.promptCaptureDir" -}}/var/lib/sluice/prompt-capture{{- end -}}
{{- define "sluice.promptCaptureFile" -}}{{ include "sluice.promptCaptureDir" . }}/prompts.jsonl{{- end -}}

{{/* The claim the batch volume is, or empty for the pod's own emptyDir. */}}
{{- define "sluice.batchClaim" -}}
{{- $v := .Values.gateway.batchStore.volume -}}
{{- if $v.existingClaim -}}{{ $v.existingClaim }}{{- else if $v.create -}}{{ include "sluice.fullname" . }}-batch{{- end -}}
{{- end -}}

{{/* "true" when more than one gateway replica may run (the autoscaler may add one). */}}
{{- define "sluice.gatewayReplicated" -}}
{{- $g := .Values.gateway -}}
{{- if $g.autoscaling.enabled -}}{{ if gt (int $g.autoscaling.maxReplicas) 1 }}true{{ end }}
{{- else if gt (int $g.replicaCount) 1 -}}true{{- end -}}
{{- end -}}
