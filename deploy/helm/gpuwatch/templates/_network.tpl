{{/* The pieces of the per-component NetworkPolicies (networkpolicy.yaml) and the checks of their values. */}}

{{/* The networkPolicy values: no leftover of the one policy for all, and with egress restricted every peer a component needs. */}}
{{- define "gpuwatch.validateNetwork" -}}
{{- $n := .Values.networkPolicy -}}
{{- if or (hasKey $n "egress") (hasKey $n "redisEgress") -}}
{{- fail "networkPolicy.egress and networkPolicy.redisEgress are gone: egress is restricted per component with networkPolicy.restrictEgress=true and networkPolicy.dns, kafkaTo, redisTo and apiServer (deploy/README.md)" -}}
{{- end -}}
{{- if and $n.enabled $n.restrictEgress -}}
{{- if and (not .Values.kafka.embedded.enabled) (not $n.kafkaTo) -}}
{{- fail "networkPolicy.restrictEgress with an external Kafka needs networkPolicy.kafkaTo: the egress rules (to, ports) that reach its brokers" -}}
{{- end -}}
{{- if and .Values.sinkRedis.enabled (not .Values.redis.embedded.enabled) (not $n.redisTo) -}}
{{- fail "networkPolicy.restrictEgress with an external Redis needs networkPolicy.redisTo: the Redis sink's egress rules (to, ports) to it" -}}
{{- end -}}
{{- $agentApi := and .Values.nodeAgent.enabled .Values.nodeAgent.dra.enabled (eq .Values.nodeAgent.backend "nvml") -}}
{{- if and (or .Values.k8sWatcher.enabled $agentApi) (not $n.apiServer) -}}
{{- fail "networkPolicy.restrictEgress needs networkPolicy.apiServer: the watcher's and the node agent's (nodeAgent.dra.enabled) egress rules to the API server (the addresses of `kubectl get endpoints kubernetes -n default`, port 443 or 6443)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Egress to DNS (networkPolicy.dns): a list of one rule, or nothing. */}}
{{- define "gpuwatch.dnsEgress" -}}
{{- with .Values.networkPolicy.dns -}}
{{- if .enabled -}}
- to:
    {{- toYaml .to | nindent 4 }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Egress to Kafka: the embedded Kafka's pod, or networkPolicy.kafkaTo. */}}
{{- define "gpuwatch.kafkaEgress" -}}
{{- if .Values.kafka.embedded.enabled -}}
- to:
    - podSelector:
        matchLabels:
          {{- include "gpuwatch.selectorLabels" (dict "root" . "component" "kafka") | nindent 10 }}
  ports:
    - port: 9092
      protocol: TCP
{{- else -}}
{{- with .Values.networkPolicy.kafkaTo -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Egress to Redis, the Redis sink's (and the test pod's): the embedded Redis's pod, or networkPolicy.redisTo. */}}
{{- define "gpuwatch.redisEgress" -}}
{{- if .Values.redis.embedded.enabled -}}
- to:
    - podSelector:
        matchLabels:
          {{- include "gpuwatch.selectorLabels" (dict "root" . "component" "redis") | nindent 10 }}
  ports:
    - port: 6379
      protocol: TCP
{{- else -}}
{{- with .Values.networkPolicy.redisTo -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
One component's NetworkPolicy. Called with (dict "root" $ "component" name
"ingress" (a rendered list of NetworkPolicyIngressRule, "" for none: nothing gets in)
"egress" (a rendered list of NetworkPolicyEgressRule; used with restrictEgress alone,
"" for none: nothing gets out)).
*/}}
{{- define "gpuwatch.networkPolicy" -}}
{{- $restrict := .root.Values.networkPolicy.restrictEgress -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "gpuwatch.componentName" . }}
  labels:
    {{- include "gpuwatch.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "gpuwatch.selectorLabels" . | nindent 6 }}
  policyTypes:
    - Ingress
    {{- if $restrict }}
    - Egress
    {{- end }}
  {{- if .ingress }}
  ingress:
    {{- .ingress | nindent 4 }}
  {{- else }}
  ingress: []
  {{- end }}
  {{- if $restrict }}
  {{- if .egress }}
  egress:
    {{- .egress | nindent 4 }}
  {{- else }}
  egress: []
  {{- end }}
  {{- end }}
{{- end -}}
