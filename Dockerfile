# One image for the gateways, the Spark master and worker, the scheduler and the S3 server (see docker-compose.yml).
# The base is pinned to Debian 12 (bookworm): plain python:3.11-slim now follows Debian 13, which has no
# openjdk-17-jre-headless (bookworm ships 17.0.x in main and bookworm-security; Spark 4.2 runs on Java 17).

# versitygw, the S3-compatible server, pinned as scripts/setup.sh pins it (its go.mod asks for Go 1.25).
FROM golang:1.25-bookworm AS versitygw
RUN GOBIN=/out go install github.com/versity/versitygw/cmd/versitygw@v1.8.0

FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . /app
COPY --from=versitygw /out/versitygw /app/.venv/bin/versitygw
# --s3-spark: the Spark jobs reach an s3:// warehouse through S3A (hadoop-aws and the AWS SDK bundle).
RUN bash scripts/setup.sh --s3-spark

ENV SPARK_HOME=/app/.venv/lib/python3.11/site-packages/pyspark
EXPOSE 4280
# Off loopback the gateway needs authentication: set JETLAKE_TOKEN, or mount a config and pass --config.
CMD [".venv/bin/jetlake", "serve", "--warehouse", "/warehouse", "--host", "0.0.0.0", "--port", "4280", "--config", "examples/container.conf"]
