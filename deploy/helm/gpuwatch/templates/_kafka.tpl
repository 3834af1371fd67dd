{{/* Kafka beyond the connection settings: who creates the topics, which they are, the checks of the embedded and Strimzi values. */}}

{{/*
Who runs `gpuwatch topics create`: "job", the pre-install/pre-upgrade hook (an external
Kafka exists before the release); "init", a first container of the worker and sink pods
(the embedded Kafka is created with the release, after any pre-install hook would run);
"" with topics.create=false or Strimzi (its KafkaTopics create them).
*/}}
{{- define "gpuwatch.topicsBy" -}}
{{- if and .Values.topics.create (not .Values.kafka.strimzi.enabled) -}}
{{- if .Values.kafka.embedded.enabled -}}init{{- else -}}job{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Strimzi KafkaUser's name (and its Secret's): kafka.strimzi.user.name or the release's full name. */}}
{{- define "gpuwatch.strimziUser" -}}
{{- default (include "gpuwatch.fullname" .) .Values.kafka.strimzi.user.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Every topic gpuwatch uses, as a YAML list of {name, config}, with the prefix and app id
of the values: the public topics of docs/DESIGN.md §3 (schemas/topics.py ALL_TOPICS,
their configs from gpuwatch.kafka.topic_configs), the worker's internal tick and fleet
topics (gpuwatch/run/worker.py ensure_tick_topic) and the compacted changelogs of its two
tables (streams/faust/app.py changelog_topic_names). tests/deploy keeps this list equal
to the code's.
*/}}
{{- define "gpuwatch.topicList" -}}
{{- $prefix := .Values.kafka.topicPrefix -}}
{{- $app := printf "%s%s" $prefix .Values.kafka.appId -}}
{{- $day := 86400000 -}}
{{- $public := list
  (list "nvml.samples" 1) (list "k8s.pods" 7) (list "k8s.nodes" 7) (list "pod.usage" 1)
  (list "pod.lifecycle" 30) (list "attribution" 35) (list "gpu.windows" 30)
  (list "alerts" 30) (list "capacity" 30) (list "k8s.workloads" 7)
  (list "workload.lifecycle" 30) (list "work.units" 35) (list "deadletter" 14) -}}
{{- range $public }}
- name: {{ printf "%s%s" $prefix (index . 0) | quote }}
  config:
    cleanup.policy: delete
    retention.ms: {{ mul (index . 1) $day | toString | quote }}
{{- end }}
# Ticks matter for seconds; an hour covers a restart (TICK_RETENTION_MS).
- name: {{ printf "%s.ticks" $app | quote }}
  config:
    cleanup.policy: delete
    retention.ms: "3600000"
# A restart reads fleet inputs again from the oldest the state did not hold (FLEET_RETENTION_MS).
- name: {{ printf "%s.fleet" $app | quote }}
  config:
    cleanup.policy: delete
    retention.ms: {{ mul 7 $day | toString | quote }}
{{- range list "node-state" "pod-state" }}
- name: {{ printf "%s.%s.changelog" $app . | quote }}
  config:
    cleanup.policy: compact
{{- end }}
{{- end -}}

{{/* The embedded Kafka and Redis against the values for an external one. */}}
{{- define "gpuwatch.validateEmbedded" -}}
{{- $kafka := .Values.kafka -}}
{{- if $kafka.embedded.enabled -}}
{{- if $kafka.bootstrap -}}
{{- fail (printf "kafka.bootstrap %q is for an external Kafka: set kafka.embedded.enabled=false with it (gpuwatch reaches the embedded Kafka at its Service)" (toString $kafka.bootstrap)) -}}
{{- end -}}
{{- if or $kafka.tls.enabled $kafka.sasl.enabled -}}
{{- fail "kafka.tls and kafka.sasl are for an external Kafka (kafka.embedded.enabled=false): the embedded Kafka speaks PLAINTEXT, inside the namespace and behind its NetworkPolicy" -}}
{{- end -}}
{{- if $kafka.strimzi.enabled -}}
{{- fail "kafka.strimzi.enabled is for a Kafka of the Strimzi operator: set kafka.embedded.enabled=false and kafka.bootstrap" -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9_-]{22}$" (toString $kafka.embedded.clusterId)) -}}
{{- fail (printf "kafka.embedded.clusterId %q: 22 characters, a base64 UUID (bin/kafka-storage.sh random-uuid)" (toString $kafka.embedded.clusterId)) -}}
{{- end -}}
{{- end -}}
{{- if and $kafka.tls.clientCertSecret.name (not $kafka.tls.enabled) -}}
{{- fail "kafka.tls.clientCertSecret needs kafka.tls.enabled: a client certificate is presented over TLS" -}}
{{- end -}}
{{- if .Values.sinkRedis.enabled -}}
{{- $redis := .Values.redis -}}
{{- if $redis.embedded.enabled -}}
{{- if or $redis.url $redis.existingSecret.name $redis.tls.caSecret.name -}}
{{- fail "redis.url, redis.existingSecret and redis.tls are for a Redis of your own: set redis.embedded.enabled=false with them" -}}
{{- end -}}
{{- else if not (or $redis.url $redis.existingSecret.name) -}}
{{- fail "redis.url or redis.existingSecret.name is required with redis.embedded.enabled=false" -}}
{{- else if and $redis.auth.enabled $redis.auth.existingSecret.name -}}
{{- if $redis.existingSecret.name -}}
{{- fail "redis.auth.existingSecret and redis.existingSecret: one or the other (the URL of redis.existingSecret holds its password)" -}}
{{- end -}}
{{- if not (regexMatch "^rediss?://" $redis.url) -}}
{{- fail "redis.auth.existingSecret puts its password into a redis:// or rediss:// redis.url; for a unix:// URL put the whole URL in redis.existingSecret" -}}
{{- end -}}
{{- end -}}
{{- if and $redis.auth.existingSecret.name (not $redis.auth.enabled) -}}
{{- fail "redis.auth.existingSecret needs redis.auth.enabled" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Strimzi values: a cluster to label the resources with, and the client settings that match the KafkaUser. */}}
{{- define "gpuwatch.validateStrimzi" -}}
{{- $strimzi := .Values.kafka.strimzi -}}
{{- if $strimzi.enabled -}}
{{- if not $strimzi.cluster -}}
{{- fail "kafka.strimzi.cluster is required: the name of the Strimzi Kafka resource" -}}
{{- end -}}
{{- $user := include "gpuwatch.strimziUser" . -}}
{{- $auth := $strimzi.user.authentication -}}
{{- if eq $auth "tls" -}}
{{- if not (and .Values.kafka.tls.enabled .Values.kafka.tls.clientCertSecret.name) -}}
{{- fail (printf "kafka.strimzi.user.authentication=tls needs kafka.tls.enabled and kafka.tls.clientCertSecret: name %s (the Secret the User Operator writes), certKey user.crt, keyKey user.key" $user) -}}
{{- end -}}
{{- else if eq $auth "scram-sha-512" -}}
{{- $sasl := .Values.kafka.sasl -}}
{{- if not (and $sasl.enabled (eq $sasl.mechanism "SCRAM-SHA-512") (eq $sasl.username $user) $sasl.passwordSecret.name) -}}
{{- fail (printf "kafka.strimzi.user.authentication=scram-sha-512 needs kafka.sasl.enabled with mechanism SCRAM-SHA-512, username %s and passwordSecret.name %s (the Secret the User Operator writes, key password)" $user $user) -}}
{{- end -}}
{{- else -}}
{{- fail (printf "kafka.strimzi.user.authentication %q: tls or scram-sha-512" (toString $auth)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
