# syntax=docker/dockerfile:1
# idemsvc and idemproxy: static binaries on a distroless base, running as a
# non-root user.
#   docker build --build-arg VERSION=v0.1.0 -t idemsvc .
#   docker run --rm -p 8080:8080 idemsvc
# idemproxy, from the same image (see examples/idemproxy-sidecar):
#   docker run --rm -p 8081:8081 --entrypoint /idemproxy --health-cmd '/idemproxy healthcheck' \
#     -e IDEMPROXY_UPSTREAM=http://app:3000 -e IDEMSVC_URL=http://idemsvc:8080 idemsvc
# HTTPS (see the README's "HTTPS"): mount a certificate and its key, e.g.
#   docker run --rm -p 8443:8443 -v $PWD/tls:/tls:ro -e IDEMSVC_LISTEN=:8443 \
#     -e IDEMSVC_TLS_CERT_FILE=/tls/tls.crt -e IDEMSVC_TLS_KEY_FILE=/tls/tls.key idemsvc

FROM golang:1.26-bookworm@sha256:38f30937ff0751bd8c202e53556168b9093302ee6d591e7e65a9d1b84a9d360c AS build
WORKDIR /src
COPY go.mod go.sum ./
# The Go client is a module of its own that go.mod takes from the repository.
COPY clients/go/go.mod clients/go/go.sum ./clients/go/
RUN --mount=type=cache,target=/go/pkg/mod GOWORK=off go mod download
COPY . .
# The version and revision that --version, the start-up log line and
# idemsvc_build_info report (as make build stamps them).
ARG VERSION=""
ARG REVISION=""
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w \
      -X github.com/idemsvc/idemsvc/internal/buildinfo.Version=${VERSION} \
      -X github.com/idemsvc/idemsvc/internal/buildinfo.Revision=${REVISION}" \
      -o /out/ ./cmd/idemsvc ./cmd/idemproxy

# distroless/static: CA certificates (for rediss://) and time zones, no
# shell, no package manager; "nonroot" is uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot@sha256:f5b485ea962d9bd1186b2f6b3a061191539b905b82ec395de78cbfae51f20e35
COPY --from=build /out/idemsvc /out/idemproxy /
USER 65532:65532
EXPOSE 8080
ENV IDEMSVC_LISTEN=:8080
# distroless has no shell or curl: the binary checks itself, over HTTPS when
# IDEMSVC_TLS_CERT_FILE is set (idemproxy: CMD ["/idemproxy", "healthcheck"]).
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD ["/idemsvc", "healthcheck"]
ENTRYPOINT ["/idemsvc"]
