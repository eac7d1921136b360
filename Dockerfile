# One image for the gateway, the Spark master and worker, and the scheduler (see docker-compose.yml).
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . /app
RUN bash scripts/setup.sh

ENV SPARK_HOME=/app/.venv/lib/python3.11/site-packages/pyspark
EXPOSE 4280
CMD [".venv/bin/jetlake", "serve", "--warehouse", "/warehouse", "--host", "0.0.0.0", "--port", "4280"]
