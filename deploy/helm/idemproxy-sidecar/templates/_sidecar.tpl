{{/*
idemproxy as a container of an application's pod. In the application's
Deployment (see example/ and README.md):

  containers:
    - name: app
      ...
    {{- include "idemproxy-sidecar.container" .Values.idemproxy | nindent 4 }}
  volumes:
    {{- include "idemproxy-sidecar.volumes" .Values.idemproxy | nindent 4 }}

The argument is the application's idemproxy values:

  image:          {repository, tag or digest, pullPolicy}  the idemsvc image (it holds /idemproxy); required
  upstreamPort:   the application's port on localhost; required
  idemsvcURL:     idemsvc's URL, e.g. http://idemsvc.idemsvc.svc:8080; required
  apiKeySecret:   {name, key}: the Secret with the tenant's API key; required
  port:           where callers reach idemproxy [8081]
  adminPort:      /healthz and /metrics [9081], apart from the application's own
  idemsvcCASecret: {name, key}: the CA of an idemsvc that serves HTTPS with a private CA
  env:            further IDEMPROXY_* settings (IDEMPROXY_METHODS, IDEMPROXY_WAIT_MS...)
  resources:      the container's resources
*/}}
{{- define "idemproxy-sidecar.container" -}}
{{- $image := required "idemproxy.image is required" .image }}
{{- $repo := required "idemproxy.image.repository is required (the idemsvc image, which holds /idemproxy)" $image.repository }}
{{- if not (or $image.tag $image.digest) }}
{{- fail "idemproxy.image: give tag or digest" }}
{{- end }}
{{- $port := int (default 8081 .port) }}
{{- $adminPort := int (default 9081 .adminPort) }}
{{- $key := required "idemproxy.apiKeySecret is required: the Secret with the tenant's API key" .apiKeySecret -}}
- name: idemproxy
  image: {{ if $image.digest }}{{ printf "%s@%s" $repo $image.digest | quote }}{{ else }}{{ printf "%s:%s" $repo $image.tag | quote }}{{ end }}
  imagePullPolicy: {{ default "IfNotPresent" $image.pullPolicy }}
  # The image's entrypoint is idemsvc; idemproxy sits beside it.
  command: ["/idemproxy"]
  env:
    - name: IDEMPROXY_LISTEN
      value: {{ printf ":%d" $port | quote }}
    - name: IDEMPROXY_ADMIN_LISTEN
      value: {{ printf ":%d" $adminPort | quote }}
    - name: IDEMPROXY_UPSTREAM
      value: {{ printf "http://127.0.0.1:%d" (int (required "idemproxy.upstreamPort is required: the application's port" .upstreamPort)) | quote }}
    - name: IDEMSVC_URL
      value: {{ required "idemproxy.idemsvcURL is required" .idemsvcURL | quote }}
    - name: IDEMSVC_API_KEY
      valueFrom:
        secretKeyRef:
          name: {{ required "idemproxy.apiKeySecret.name is required" $key.name }}
          key: {{ default "api-key" $key.key }}
    {{- if .idemsvcCASecret }}
    - name: IDEMSVC_CA_FILE
      value: /etc/idemproxy/idemsvc-ca/ca.crt
    {{- end }}
    {{- range $name, $value := .env }}
    - name: {{ $name }}
      {{- /* A number as an integer: Helm would write 1048576 from a values file as 1.048576e+06. */}}
      value: {{ if kindIs "float64" $value }}{{ $value | int64 | toString | quote }}{{ else }}{{ $value | toString | quote }}{{ end }}
    {{- end }}
  ports:
    - name: idemproxy
      containerPort: {{ $port }}
      protocol: TCP
    - name: idemproxy-admin
      containerPort: {{ $adminPort }}
      protocol: TCP
  # /healthz answers while idemproxy serves; it does not ask idemsvc, so
  # requests without a key keep flowing while idemsvc is down (keyed ones
  # get 503: idemproxy fails closed).
  readinessProbe:
    httpGet:
      path: /healthz
      port: idemproxy-admin
    periodSeconds: 5
  livenessProbe:
    httpGet:
      path: /healthz
      port: idemproxy-admin
    periodSeconds: 10
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
    seccompProfile:
      type: RuntimeDefault
  resources:
    {{- toYaml (default (dict "requests" (dict "cpu" "50m" "memory" "32Mi") "limits" (dict "memory" "128Mi")) .resources) | nindent 4 }}
  {{- if .idemsvcCASecret }}
  volumeMounts:
    - name: idemproxy-idemsvc-ca
      mountPath: /etc/idemproxy/idemsvc-ca
      readOnly: true
  {{- end }}
{{- end }}

{{/* The volumes the container mounts (none unless idemsvcCASecret). */}}
{{- define "idemproxy-sidecar.volumes" -}}
{{- if .idemsvcCASecret }}
- name: idemproxy-idemsvc-ca
  secret:
    secretName: {{ required "idemproxy.idemsvcCASecret.name is required" .idemsvcCASecret.name }}
    items:
      - key: {{ default "ca.crt" .idemsvcCASecret.key }}
        path: ca.crt
{{- end }}
{{- end }}
