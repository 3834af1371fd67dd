{{/*
A component whose replicas share the partitions of one Kafka consumer group (the
worker, the Redis sink, the metrics sink): its Deployment (spread over nodes, /metrics and /livez
probed, no API token), its PodDisruptionBudget and the Service of its /metrics. Called
with (dict
  "root" $  "component" name  "values" (the component's values)
  "args" (the verb and its flags)  "portEnv" (the setting that takes values.metricsPort)
  "prices" (bool: the price table is mounted, and a new one rolls the pods)
  "startupFailures" (startup probes of 5 s before the pod is restarted)
  "env" "mounts" "volumes" (rendered YAML lists of the component's own, or "")).
*/}}
{{- define "gpuwatch.consumer" -}}
{{- $root := .root -}}
{{- $v := .values -}}
{{- $c := dict "root" .root "component" .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "gpuwatch.componentName" $c }}
  labels:
    {{- include "gpuwatch.labels" $c | nindent 4 }}
spec:
  replicas: {{ $v.replicas }}
  selector:
    matchLabels:
      {{- include "gpuwatch.selectorLabels" $c | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "gpuwatch.labels" $c | nindent 8 }}
      {{- $annotations := $v.podAnnotations | toYaml | trim }}
      {{- if .prices }}
      {{- $annotations = include "gpuwatch.podAnnotations" (dict "root" $root "extra" $v.podAnnotations) }}
      {{- end }}
      {{- if and $annotations (ne $annotations "{}") }}
      annotations:
        {{- $annotations | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "gpuwatch.serviceAccountName" $c }}
      # It never calls the Kubernetes API.
      automountServiceAccountToken: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
      {{- if eq (include "gpuwatch.topicsBy" $root) "init" }}
      # The embedded Kafka starts with the release, after any pre-install hook would have
      # run: its topics are created here, before the process that checks them
      # (idempotent; restarted until the broker answers).
      initContainers:
        - name: topics
          image: {{ include "gpuwatch.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- include "gpuwatch.args" (dict "root" $root "args" (list "topics" "create")) | nindent 12 }}
          env:
            {{- include "gpuwatch.env" (dict "root" $root "prices" false) | nindent 12 }}
          resources:
            {{- toYaml $root.Values.topics.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "gpuwatch.volumeMounts" (dict "root" $root "prices" false) | nindent 12 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "gpuwatch.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- include "gpuwatch.args" (dict "root" $root "args" .args) | nindent 12 }}
          env:
            - name: {{ .portEnv }}
              value: {{ $v.metricsPort | quote }}
            {{- with .env }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- include "gpuwatch.env" (dict "root" $root "prices" .prices) | nindent 12 }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $v.metricsPort }}
              protocol: TCP
          # /metrics is served once the topics are found (the process exits while Kafka or
          # the topics are missing, and is restarted).
          startupProbe:
            httpGet:
              path: /metrics
              port: metrics
            periodSeconds: 5
            failureThreshold: {{ .startupFailures }}
          # /livez fails while a partition it holds has records waiting and no progress
          # past the stall limit (GPUWATCH_WORKER_STALL_LIMIT_S, GPUWATCH_SINK_STALL_LIMIT_S):
          # a stuck process still answers /metrics.
          livenessProbe:
            httpGet:
              path: /livez
              port: metrics
            periodSeconds: 20
            timeoutSeconds: 10
            failureThreshold: 3
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "gpuwatch.volumeMounts" (dict "root" $root "prices" .prices) | nindent 12 }}
            {{- with .mounts }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        {{- include "gpuwatch.volumes" (dict "root" $root "prices" .prices) | nindent 8 }}
        {{- with .volumes }}
        {{- . | nindent 8 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- include "gpuwatch.spreadAffinity" (dict "root" $root "component" .component "affinity" $v.affinity) | nindent 8 }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- if $v.pdb.enabled }}
---
# Voluntary disruptions (drains, upgrades) take one replica at a time: its partitions
# move to the others.
{{ include "gpuwatch.pdb" (dict "root" $root "component" .component "maxUnavailable" $v.pdb.maxUnavailable) }}
{{- end }}
---
{{ include "gpuwatch.metricsService" (dict "root" $root "component" .component "port" $v.metricsPort) }}
{{- end -}}
