# The rollouts-controller image: built in the Rust image, run on distroless (glibc, CA
# certificates, no shell, no package manager) as a non-root user. See deploy/README.md.
#   docker build -t ghcr.io/rollouts-rs/rollouts-controller:v0.1.0 .

# Same Debian release as the runtime image below, so the binary's glibc matches.
FROM docker.io/library/rust:1.92-bookworm AS builder
WORKDIR /src
COPY . .
RUN cargo build --release --locked --package rollouts-controller --bin rollouts-controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /src/target/release/rollouts-controller /usr/local/bin/rollouts-controller
# Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
USER 65532:65532
# 8080: /healthz and /readyz; 8090: /metrics.
EXPOSE 8080 8090
ENTRYPOINT ["/usr/local/bin/rollouts-controller"]
