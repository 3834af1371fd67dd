{{/*
The PrometheusRule's spec, rendered from the shipped rules file and the values.

The file (files/ links to deploy/prometheus/) stays the one source of the rules and of
their defaults: it is parsed here and each alert is changed only where a value says so,
so the default values render it unchanged. Per alert (prometheusRule.rules.<name>):
enabled, for, severity, labels; for every alert: prometheusRule.additionalLabels and
a runbook_url under prometheusRule.runbookBaseUrl. The threshold rules hold thresholds
the worker's settings hold too (the idle utilization, how long a pod may queue...): each
is found by its literal in the file and replaced by prometheusRule.thresholds.<name> or,
when that is empty, by the release's own setting (settings.GPUWATCH_...), so the rules
and the workers of one release cannot disagree. A literal the file no longer holds
fails the render rather than leave a threshold unchanged. The stream's rules hold no
threshold: the worker applies its settings before it fires.
*/}}
{{- define "gpuwatch.ruleSpec" -}}
{{- $v := .Values.prometheusRule -}}
{{- $from := $v.alertsFrom | default "stream" -}}
{{- if not (has $from (list "stream" "thresholds")) -}}
{{- fail "prometheusRule.alertsFrom: stream or thresholds" -}}
{{- end -}}
{{- $file := ternary "gpuwatch-rules.yml" "gpuwatch-threshold-rules.yml" (eq $from "stream") -}}
{{- $spec := .Files.Get (printf "files/%s" $file) | fromYaml -}}
{{- if or (hasKey $spec "Error") (not $spec.groups) -}}
{{- fail (printf "files/%s is not a rules file: %v" $file ($spec.Error | default "no groups")) -}}
{{- end -}}
{{- $own := $v.rules | default dict -}}
{{- $names := list -}}
{{- range $spec.groups }}{{ range .rules }}{{ with .alert }}{{ $names = append $names . }}{{ end }}{{ end }}{{ end -}}
{{- range $name, $_ := $own -}}
{{- if not (has $name $names) -}}
{{- fail (printf "prometheusRule.rules.%s: %s has no such alert (it has %s)" $name $file (uniq $names | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- $edits := dict "subs" list "fors" dict "forText" list -}}
{{- if eq $from "thresholds" -}}
{{- $edits = include "gpuwatch.thresholdEdits" . | fromYaml -}}
{{- end -}}
{{- $groups := list -}}
{{- range $group := $spec.groups -}}
{{- $rules := list -}}
{{- range $rule := $group.rules -}}
{{- $name := $rule.alert | default "" -}}
{{- $mine := index $own $name | default dict -}}
{{- if not (and $name (eq (toString (dig "enabled" true $mine)) "false")) -}}
{{- $r := deepCopy $rule -}}
{{- if $name -}}
{{- $for := $mine.for | default (index $edits.fors $name) | default "" -}}
{{- if $for -}}
{{- $_ := set $r "for" $for -}}
{{- end -}}
{{- $subs := list -}}
{{- range $edits.subs }}{{ if eq (index . 0) $name }}{{ $subs = append $subs . }}{{ end }}{{ end -}}
{{- if and $for (has $name $edits.forText) -}}
{{- /* The description states the `for` ("for at least 1 minute"): keep it true. */ -}}
{{- $subs = append $subs (list $name "description" "for at least [0-9]+ [a-z]+" (printf "for at least %s" (include "gpuwatch.humanDuration" $for))) -}}
{{- end -}}
{{- range $subs -}}
{{- $holder := $r -}}
{{- $key := index . 1 -}}
{{- if eq $key "description" -}}
{{- $holder = $r.annotations -}}
{{- end -}}
{{- $text := index $holder $key | toString -}}
{{- if not (regexMatch (index . 2) $text) -}}
{{- fail (printf "files/%s: the %s of %s no longer holds /%s/, the threshold the chart replaces (templates/_rules.tpl)" $file $key $name (index . 2)) -}}
{{- end -}}
{{- $_ := set $holder $key (regexReplaceAll (index . 2) $text (index . 3)) -}}
{{- end -}}
{{- $labels := mergeOverwrite (dict) ($r.labels | default dict) ($v.additionalLabels | default dict) ($mine.labels | default dict) -}}
{{- with $mine.severity -}}
{{- $_ := set $labels "severity" . -}}
{{- end -}}
{{- if $labels -}}
{{- $_ := set $r "labels" $labels -}}
{{- end -}}
{{- with $v.runbookBaseUrl -}}
{{- $base := trimSuffix "/" . -}}
{{- /* A page (.md) holds every runbook under an anchor; a site has a page per alert. */ -}}
{{- $url := ternary (printf "%s#%s" $base (lower $name)) (printf "%s/%s" $base (lower $name)) (hasSuffix ".md" $base) -}}
{{- $_ := set $r "annotations" (mergeOverwrite ($r.annotations | default dict) (dict "runbook_url" $url)) -}}
{{- end -}}
{{- end -}}
{{- $rules = append $rules $r -}}
{{- end -}}
{{- end -}}
{{- /* A group whose alerts are all disabled goes: Prometheus has nothing to evaluate. */ -}}
{{- if $rules -}}
{{- $groups = append $groups (set (omit $group "rules") "rules" $rules) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}

{{/*
What the thresholds change in gpuwatch-threshold-rules.yml, as YAML: "subs", a list of
[alert, expr|description, regex of the file's literal, replacement]; "fors", alert ->
its `for`; "forText", the alerts whose description states their `for`. A threshold
neither value nor setting gives changes nothing: the file's literal (the settings'
default, a test keeps them equal) stands.
*/}}
{{- define "gpuwatch.thresholdEdits" -}}
{{- $subs := list -}}
{{- $fors := dict -}}
{{- $arg := dict "root" . -}}
{{- with include "gpuwatch.ruleThreshold" (merge (dict "name" "idleUtilPct" "setting" "GPUWATCH_IDLE_UTIL_PCT" "kind" "pct") $arg) -}}
{{- $ratio := printf "%.6g" (divf (float64 .) 100) -}}
{{- $subs = append $subs (list "GpuIdleAllocated" "expr" "gpuwatch_gpu_utilization_ratio < [0-9.]+" (printf "gpuwatch_gpu_utilization_ratio < %s" $ratio)) -}}
{{- $subs = append $subs (list "GpuIdleAllocated" "description" "under [0-9.]+ % utilization" (printf "under %s %% utilization" .)) -}}
{{- end -}}
{{- with include "gpuwatch.ruleThreshold" (merge (dict "name" "idleAlertAfterSeconds" "setting" "GPUWATCH_IDLE_ALERT_AFTER_S" "kind" "seconds") $arg) -}}
{{- $_ := set $fors "GpuIdleAllocated" (include "gpuwatch.promDuration" .) -}}
{{- end -}}
{{- with include "gpuwatch.ruleThreshold" (merge (dict "name" "queuedAlertAfterSeconds" "setting" "GPUWATCH_QUEUED_ALERT_AFTER_S" "kind" "seconds") $arg) -}}
{{- $subs = append $subs (list "PodQueuedTooLong" "expr" "gpuwatch_pod_state_seconds\\{state=\"queued\"\\} > [0-9]+" (printf "gpuwatch_pod_state_seconds{state=\"queued\"} > %s" .)) -}}
{{- $subs = append $subs (list "PodQueuedTooLong" "description" "more than [0-9]+ [a-z]+" (printf "more than %s" (include "gpuwatch.humanDuration" (include "gpuwatch.promDuration" .)))) -}}
{{- $_ := set $fors "WorkloadQueuedTooLong" (include "gpuwatch.promDuration" .) -}}
{{- end -}}
{{- with include "gpuwatch.ruleThreshold" (merge (dict "name" "stallAfterSeconds" "setting" "GPUWATCH_STALL_AFTER_S" "kind" "seconds") $arg) -}}
{{- $subs = append $subs (list "PodStalled" "description" "the stall threshold \\([0-9]+ [a-z]+\\)" (printf "the stall threshold (%s)" (include "gpuwatch.humanDuration" (include "gpuwatch.promDuration" .)))) -}}
{{- end -}}
{{- with include "gpuwatch.ruleThreshold" (merge (dict "name" "xidAlertHoldSeconds" "setting" "GPUWATCH_XID_ALERT_HOLD_S" "kind" "seconds") $arg) -}}
{{- $d := include "gpuwatch.promDuration" . -}}
{{- $subs = append $subs (list "GpuXidError" "expr" "gpuwatch_gpu_xid_errors_total\\[[0-9]+[smh]\\]" (printf "gpuwatch_gpu_xid_errors_total[%s]" $d)) -}}
{{- $subs = append $subs (list "GpuXidError" "expr" "gpuwatch_gpu_xid_errors_total offset [0-9]+[smh]" (printf "gpuwatch_gpu_xid_errors_total offset %s" $d)) -}}
{{- $subs = append $subs (list "GpuXidError" "description" "in the last [0-9]+ [a-z]+" (printf "in the last %s" (include "gpuwatch.humanDuration" $d))) -}}
{{- end -}}
{{- with include "gpuwatch.ruleThreshold" (merge (dict "name" "throttleAlertAfterSeconds" "setting" "GPUWATCH_THROTTLE_ALERT_AFTER_S" "kind" "seconds") $arg) -}}
{{- $_ := set $fors "GpuThrottled" (include "gpuwatch.promDuration" .) -}}
{{- end -}}
{{- toYaml (dict "subs" $subs "fors" $fors "forText" (list "GpuIdleAllocated" "GpuThrottled" "WorkloadQueuedTooLong")) -}}
{{- end -}}

{{/*
A threshold as text, "" when unset: prometheusRule.thresholds.<name>, else the setting
of the same meaning in settings. "pct": a utilization percentage, 0 to 100 (printed
without trailing zeros); "seconds": a whole number of seconds, at least 1. Called with
(dict "root" $ "name" value-name "setting" GPUWATCH_... "kind" "pct"|"seconds").
*/}}
{{- define "gpuwatch.ruleThreshold" -}}
{{- $value := index (.root.Values.prometheusRule.thresholds | default dict) .name -}}
{{- $from := printf "prometheusRule.thresholds.%s" .name -}}
{{- if kindIs "invalid" $value -}}
{{- $value = index (.root.Values.settings | default dict) .setting -}}
{{- $from = printf "settings.%s" .setting -}}
{{- end -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $text := toString $value -}}
{{- if eq .kind "pct" -}}
{{- if not (and (regexMatch "^[0-9]+([.][0-9]+)?$" $text) (le (float64 $text) 100.0)) -}}
{{- fail (printf "%s %q: a utilization percentage, 0 to 100" $from $text) -}}
{{- end -}}
{{- printf "%.6g" (float64 $text) -}}
{{- else -}}
{{- if and (kindIs "float64" $value) (eq $value (floor $value)) -}}
{{- /* A number of values.yaml is a float: 1000000 would print as 1e+06. */ -}}
{{- $text = printf "%.0f" $value -}}
{{- end -}}
{{- if not (and (regexMatch "^[0-9]+$" $text) (ge (int64 $text) 1)) -}}
{{- fail (printf "%s %q: a whole number of seconds, at least 1" $from $text) -}}
{{- end -}}
{{- int64 $text -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Seconds as a Prometheus duration in its largest whole unit: 600 -> 10m, 90 -> 90s. */}}
{{- define "gpuwatch.promDuration" -}}
{{- $s := int64 . -}}
{{- if eq (mod $s 3600) 0 -}}{{ div $s 3600 }}h
{{- else if eq (mod $s 60) 0 -}}{{ div $s 60 }}m
{{- else -}}{{ $s }}s
{{- end -}}
{{- end -}}

{{/*
A Prometheus duration in words, as the rules' descriptions write it: 10m -> "10 minutes",
1m -> "1 minute", 90s -> "90 seconds". A duration of several units (1h30m) stays as it is.
*/}}
{{- define "gpuwatch.humanDuration" -}}
{{- if regexMatch "^[0-9]+[smh]$" . -}}
{{- $s := mul (int64 (regexFind "^[0-9]+" .)) (get (dict "s" 1 "m" 60 "h" 3600) (regexFind "[smh]$" .)) -}}
{{- $n := $s -}}
{{- $unit := "second" -}}
{{- if eq (mod $s 3600) 0 -}}
{{- $n = div $s 3600 -}}
{{- $unit = "hour" -}}
{{- else if eq (mod $s 60) 0 -}}
{{- $n = div $s 60 -}}
{{- $unit = "minute" -}}
{{- end -}}
{{- $n }} {{ $unit }}{{ if ne (int64 $n) 1 }}s{{ end -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}
