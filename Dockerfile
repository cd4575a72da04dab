# syntax=docker/dockerfile:1
# The tokenmeter image: built with the official Rust image, run on distroless (glibc and CA
# certificates, no shell, no package manager) as the unprivileged user 65532 ("nonroot").
#
#   docker build -t tokenmeter:0.1.0 .
#   docker run --rm -p 8080:8080 -p 9090:9090 tokenmeter:0.1.0 --upstream http://HOST:8000
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts. Both stages are
# Debian 12 (bookworm), so the binary links against the glibc it runs with.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# .dockerignore lets in only what cargo needs (manifest, lock file, sources).
COPY . .
# The registry and target caches persist across builds; the binary is copied out of the cache
# mount because the mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin tokenmeter \
    && install -D -m 0755 target/release/tokenmeter /out/tokenmeter

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="tokenmeter" \
      org.opencontainers.image.description="Streaming reverse proxy that measures LLM inference: TTFT, per-request and aggregate tokens/s" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/tokenmeter /usr/local/bin/tokenmeter
USER 65532:65532
# 8080: the proxy; 9090: /metrics, /healthz, /readyz.
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/tokenmeter"]
