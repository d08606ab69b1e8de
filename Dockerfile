# Build stage: the release binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY .cargo .cargo
COPY benches benches
COPY src src
COPY migrations migrations
RUN cargo build --locked --release && strip target/release/blobgate

# Runtime: a small Debian with the binary, running as an unprivileged user.
FROM debian:bookworm-slim
# curl: the compose healthchecks ask the admin listener's /readyz.
RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --home /data blobgate && mkdir -p /data && chown blobgate /data && chmod 700 /data
COPY --from=build /src/target/release/blobgate /usr/local/bin/blobgate
USER blobgate
VOLUME /data
ENV BLOBGATE_DATA_DIR=/data \
    BLOBGATE_LISTEN=0.0.0.0:8080 \
    BLOBGATE_ADMIN_LISTEN=0.0.0.0:8081
EXPOSE 8080 8081
STOPSIGNAL SIGTERM
ENTRYPOINT ["blobgate"]
CMD ["serve"]
