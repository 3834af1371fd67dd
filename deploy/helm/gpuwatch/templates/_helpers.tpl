{{/* Names, labels, the image, and the environment every gpuwatch container shares. */}}

{{- define "gpuwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwatch.fullname" -}}
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

{{/* A component's object name: "<fullname>-<component>". */}}
{{- define "gpuwatch.componentName" -}}
{{- printf "%s-%s" (include "gpuwatch.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The service account a component's pods run as: the chart's own per component, or with
serviceAccount.create=false the existing one named by serviceAccount.name ("default"
when empty). Called with (dict "root" $ "component" name).
*/}}
{{- define "gpuwatch.serviceAccountName" -}}
{{- if .root.Values.serviceAccount.create -}}
{{- include "gpuwatch.componentName" . -}}
{{- else -}}
{{- .root.Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "gpuwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwatch.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuwatch.labels" -}}
{{ include "gpuwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpuwatch
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpuwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Kafka security protocol from kafka.tls.enabled and kafka.sasl.enabled. */}}
{{- define "gpuwatch.kafkaProtocol" -}}
{{- if and .Values.kafka.tls.enabled .Values.kafka.sasl.enabled -}}SASL_SSL
{{- else if .Values.kafka.tls.enabled -}}SSL
{{- else if .Values.kafka.sasl.enabled -}}SASL_PLAINTEXT
{{- else -}}PLAINTEXT
{{- end -}}
{{- end -}}

{{/* Kafka's bootstrap servers: the embedded Kafka's Service, or kafka.bootstrap. */}}
{{- define "gpuwatch.kafkaBootstrap" -}}
{{- if .Values.kafka.embedded.enabled -}}
{{- printf "%s:9092" (include "gpuwatch.componentName" (dict "root" . "component" "kafka")) -}}
{{- else -}}
{{- required "kafka.bootstrap is required with kafka.embedded.enabled=false: host:port[,host:port...] of your Kafka" .Values.kafka.bootstrap -}}
{{- end -}}
{{- end -}}

{{/* The replication factor of created topics: 1 on the embedded Kafka's one broker. */}}
{{- define "gpuwatch.kafkaReplicationFactor" -}}
{{- if .Values.kafka.embedded.enabled -}}1{{- else -}}{{ .Values.kafka.replicationFactor }}{{- end -}}
{{- end -}}

{{/* The Redis sink's Redis URL when it is no secret: the embedded Redis's Service, or redis.url. */}}
{{- define "gpuwatch.redisUrl" -}}
{{- if .Values.redis.embedded.enabled -}}
{{- printf "redis://%s:6379/0" (include "gpuwatch.componentName" (dict "root" . "component" "redis")) -}}
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/*
Checks of values that would otherwise fail late, in a pod: secrets in plain values,
more workers or sinks than partitions.
*/}}
{{- define "gpuwatch.validate" -}}
{{- $secretVars := list "GPUWATCH_REDIS_URL" "GPUWATCH_KAFKA_SASL_PASSWORD" -}}
{{- $managed := list "GPUWATCH_KAFKA_BOOTSTRAP" "GPUWATCH_TOPIC_PREFIX" "GPUWATCH_APP_ID" "GPUWATCH_KAFKA_PARTITIONS" "GPUWATCH_KAFKA_REPLICATION_FACTOR" "GPUWATCH_KAFKA_SECURITY_PROTOCOL" "GPUWATCH_KAFKA_SASL_MECHANISM" "GPUWATCH_KAFKA_SASL_USERNAME" "GPUWATCH_KAFKA_SSL_CAFILE" "GPUWATCH_KAFKA_SSL_CERTFILE" "GPUWATCH_KAFKA_SSL_KEYFILE" "GPUWATCH_METRICS_BIND" "GPUWATCH_PRICES" "GPUWATCH_METRICS_PORT" "GPUWATCH_AGENT_METRICS_PORT" "GPUWATCH_WATCHER_METRICS_PORT" "GPUWATCH_SINK_METRICS_PORT" "GPUWATCH_SINK_EXPORTER_PORT" "GPUWATCH_NODE_NAME" "GPUWATCH_AGENT_INTERVAL_S" "GPUWATCH_KUBELET_SOCKET" "GPUWATCH_POD_LOGS_DIR" "GPUWATCH_CLUSTER" -}}
{{- range $name, $_ := .Values.settings -}}
{{- if not (hasPrefix "GPUWATCH_" $name) -}}
{{- fail (printf "settings.%s: only GPUWATCH_* settings go here (the extraEnv of a component takes other variables)" $name) -}}
{{- end -}}
{{- if has $name $secretVars -}}
{{- fail (printf "settings.%s is a secret: use redis.existingSecret or kafka.sasl.passwordSecret" $name) -}}
{{- end -}}
{{- if has $name $managed -}}
{{- fail (printf "settings.%s is set by the chart from its own value (kafka.*, metrics.bind, prices, the metrics ports, nodeAgent.*, cluster.name)" $name) -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.redis.existingSecret.name) (regexMatch "^rediss?://[^/]*@" .Values.redis.url) -}}
{{- fail "redis.url holds credentials: put the URL in a Secret and name it in redis.existingSecret" -}}
{{- end -}}
{{- if and .Values.kafka.sasl.enabled (not .Values.kafka.sasl.passwordSecret.name) -}}
{{- fail "kafka.sasl.enabled needs kafka.sasl.passwordSecret.name (a Secret with the password)" -}}
{{- end -}}
{{- include "gpuwatch.validateEmbedded" . -}}
{{- include "gpuwatch.validateStrimzi" . -}}
{{- include "gpuwatch.validateNetwork" . -}}
{{- if gt (int .Values.worker.replicas) (int .Values.kafka.partitions) -}}
{{- fail (printf "worker.replicas (%d) exceeds kafka.partitions (%d): the extra workers would get no partition" (int .Values.worker.replicas) (int .Values.kafka.partitions)) -}}
{{- end -}}
{{- if and .Values.sinkRedis.enabled (gt (int .Values.sinkRedis.replicas) (int .Values.kafka.partitions)) -}}
{{- fail (printf "sinkRedis.replicas (%d) exceeds kafka.partitions (%d): the extra sinks would get no partition" (int .Values.sinkRedis.replicas) (int .Values.kafka.partitions)) -}}
{{- end -}}
{{- if and .Values.sinkMetrics.enabled (gt (int .Values.sinkMetrics.replicas) (int .Values.kafka.partitions)) -}}
{{- fail (printf "sinkMetrics.replicas (%d) exceeds kafka.partitions (%d): the extra sinks would get no partition" (int .Values.sinkMetrics.replicas) (int .Values.kafka.partitions)) -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$" (toString .Values.cluster.name)) -}}
{{- fail (printf "cluster.name %q: 1 to 63 letters, digits, '.', '_' or '-', starting and ending with a letter or digit" (toString .Values.cluster.name)) -}}
{{- end -}}
{{- if gt (len (toString .Values.cluster.name)) 63 -}}
{{- fail (printf "cluster.name %q: at most 63 characters" (toString .Values.cluster.name)) -}}
{{- end -}}
{{- if not (has .Values.nodeAgent.backend (list "nvml" "sim")) -}}
{{- fail "nodeAgent.backend: nvml or sim" -}}
{{- end -}}
{{- end -}}

{{/*
The environment of every gpuwatch container: Kafka (with its secret), metrics bind,
prices, the settings passthrough. Redis is added by the Redis sink alone. Called with
(dict "root" $ "prices" bool): the topics hook runs before the prices ConfigMap exists
and needs no prices.
*/}}
{{- define "gpuwatch.env" -}}
{{- $prices := .prices -}}
{{- with .root -}}
- name: GPUWATCH_KAFKA_BOOTSTRAP
  value: {{ include "gpuwatch.kafkaBootstrap" . | quote }}
- name: GPUWATCH_TOPIC_PREFIX
  value: {{ .Values.kafka.topicPrefix | quote }}
- name: GPUWATCH_APP_ID
  value: {{ .Values.kafka.appId | quote }}
- name: GPUWATCH_KAFKA_PARTITIONS
  value: {{ .Values.kafka.partitions | quote }}
- name: GPUWATCH_KAFKA_REPLICATION_FACTOR
  value: {{ include "gpuwatch.kafkaReplicationFactor" . | quote }}
- name: GPUWATCH_KAFKA_SECURITY_PROTOCOL
  value: {{ include "gpuwatch.kafkaProtocol" . | quote }}
{{- if .Values.kafka.sasl.enabled }}
- name: GPUWATCH_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: GPUWATCH_KAFKA_SASL_USERNAME
  value: {{ .Values.kafka.sasl.username | quote }}
- name: GPUWATCH_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.passwordSecret.name | quote }}
      key: {{ .Values.kafka.sasl.passwordSecret.key | quote }}
{{- end }}
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.caSecret.name }}
- name: GPUWATCH_KAFKA_SSL_CAFILE
  value: {{ printf "/etc/gpuwatch/kafka-ca/%s" .Values.kafka.tls.caSecret.key | quote }}
{{- end }}
{{- with .Values.kafka.tls.clientCertSecret }}
{{- if .name }}
- name: GPUWATCH_KAFKA_SSL_CERTFILE
  value: {{ printf "/etc/gpuwatch/kafka-client/%s" .certKey | quote }}
- name: GPUWATCH_KAFKA_SSL_KEYFILE
  value: {{ printf "/etc/gpuwatch/kafka-client/%s" .keyKey | quote }}
{{- end }}
{{- end }}
- name: GPUWATCH_METRICS_BIND
  value: {{ .Values.metrics.bind | quote }}
{{- if and $prices .Values.prices }}
- name: GPUWATCH_PRICES
  value: /etc/gpuwatch/prices/prices.yaml
{{- end }}
{{- range $name, $value := .Values.settings }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
The Secret holding the Redis password, "" when the chart passes none: with redis.auth.enabled,
redis.auth.existingSecret, or else the chart's own "<fullname>-redis" for the embedded Redis
(redis.yaml). An external Redis gets a password from redis.auth.existingSecret alone.
*/}}
{{- define "gpuwatch.redisPasswordSecret" -}}
{{- $auth := .Values.redis.auth -}}
{{- if $auth.enabled -}}
{{- if $auth.existingSecret.name -}}
{{- $auth.existingSecret.name -}}
{{- else if .Values.redis.embedded.enabled -}}
{{- include "gpuwatch.componentName" (dict "root" . "component" "redis") -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The key of the password in gpuwatch.redisPasswordSecret. */}}
{{- define "gpuwatch.redisPasswordKey" -}}
{{- if .Values.redis.auth.existingSecret.name -}}
{{- .Values.redis.auth.existingSecret.key -}}
{{- else -}}password{{- end -}}
{{- end -}}

{{/* REDIS_PASSWORD from gpuwatch.redisPasswordSecret (an env list item). */}}
{{- define "gpuwatch.redisPasswordEnv" -}}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "gpuwatch.redisPasswordSecret" . | quote }}
      key: {{ include "gpuwatch.redisPasswordKey" . | quote }}
{{- end -}}

{{/*
The Redis URL of every pod that talks to Redis (the Redis sink, the test pod): the whole
URL from redis.existingSecret; or with a password (gpuwatch.redisPasswordSecret) the URL
with ":$(REDIS_PASSWORD)@" put before its host, which the kubelet expands from the
REDIS_PASSWORD before it, so the password is in no rendered manifest; or the plain URL.
*/}}
{{- define "gpuwatch.redisEnv" -}}
{{- include "gpuwatch.redisEnvItems" . | trim -}}
{{- end -}}

{{- define "gpuwatch.redisEnvItems" -}}
{{- if and (not .Values.redis.embedded.enabled) .Values.redis.existingSecret.name }}
- name: GPUWATCH_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret.name | quote }}
      key: {{ .Values.redis.existingSecret.key | quote }}
{{- else if include "gpuwatch.redisPasswordSecret" . }}
{{ include "gpuwatch.redisPasswordEnv" . }}
- name: GPUWATCH_REDIS_URL
  value: {{ regexReplaceAll "^(rediss?://)" (include "gpuwatch.redisUrl" .) "${1}:$$(REDIS_PASSWORD)@" | quote }}
{{- else }}
- name: GPUWATCH_REDIS_URL
  value: {{ include "gpuwatch.redisUrl" . | quote }}
{{- end }}
{{- end -}}

{{/* Mounts every container shares: /tmp (the only writable path), CAs, prices (read-only). Called like gpuwatch.env. */}}
{{- define "gpuwatch.volumeMounts" -}}
{{- $prices := .prices -}}
{{- with .root -}}
- name: tmp
  mountPath: /tmp
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.caSecret.name }}
- name: kafka-ca
  mountPath: /etc/gpuwatch/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.clientCertSecret.name }}
- name: kafka-client
  mountPath: /etc/gpuwatch/kafka-client
  readOnly: true
{{- end }}
{{- if and $prices .Values.prices }}
- name: prices
  mountPath: /etc/gpuwatch/prices
  readOnly: true
{{- end }}
{{- end -}}
{{- end -}}

{{- define "gpuwatch.volumes" -}}
{{- $prices := .prices -}}
{{- with .root -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- if and .Values.kafka.tls.enabled .Values.kafka.tls.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.tls.caSecret.name | quote }}
    items:
      - key: {{ .Values.kafka.tls.caSecret.key | quote }}
        path: {{ .Values.kafka.tls.caSecret.key | quote }}
{{- end }}
{{- with .Values.kafka.tls.clientCertSecret }}
{{- if .name }}
- name: kafka-client
  secret:
    secretName: {{ .name | quote }}
    items:
      - key: {{ .certKey | quote }}
        path: {{ .certKey | quote }}
      - key: {{ .keyKey | quote }}
        path: {{ .keyKey | quote }}
{{- end }}
{{- end }}
{{- if and $prices .Values.prices }}
- name: prices
  configMap:
    name: {{ include "gpuwatch.componentName" (dict "root" . "component" "prices") }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
Pod annotations: the component's own, and a checksum of the price table, so a new table
rolls the pods (the processes read it at start): a YAML map, or nothing. Called with
(dict "root" $ "extra" map).
*/}}
{{- define "gpuwatch.podAnnotations" -}}
{{- $annotations := deepCopy (default (dict) .extra) -}}
{{- if .root.Values.prices -}}
{{- $_ := set $annotations "checksum/prices" (toYaml .root.Values.prices | sha256sum) -}}
{{- end -}}
{{- with $annotations -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* The container args: global flags, then the verb and its flags (a list). */}}
{{- define "gpuwatch.args" -}}
- --log-level
- {{ .root.Values.logLevel | quote }}
{{- range .args }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
The affinity of a Deployment with replicas: the component's own, or else a preference to
spread its replicas over nodes. Called with (dict "root" $ "component" name "affinity" map).
*/}}
{{- define "gpuwatch.spreadAffinity" -}}
{{- if .affinity -}}
{{- toYaml .affinity -}}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gpuwatch.selectorLabels" . | nindent 12 }}
{{- end -}}
{{- end -}}

{{/* A component's PodDisruptionBudget. Called with (dict "root" $ "component" name "maxUnavailable" n). */}}
{{- define "gpuwatch.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "gpuwatch.componentName" . }}
  labels:
    {{- include "gpuwatch.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .maxUnavailable }}
  selector:
    matchLabels:
      {{- include "gpuwatch.selectorLabels" . | nindent 6 }}
{{- end -}}

{{/* The Service of a component's /metrics. Called with (dict "root" $ "component" name "port" n). */}}
{{- define "gpuwatch.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "gpuwatch.componentName" . }}
  labels:
    {{- include "gpuwatch.labels" . | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "gpuwatch.selectorLabels" . | nindent 4 }}
  ports:
    - name: metrics
      port: {{ .port }}
      targetPort: metrics
      protocol: TCP
{{- end -}}
