# `hllm serve` in a container: the lean runtime and the HTTP server only (extras `runtime` and `serve`, no torch).
#
#   docker build -t hllm-serve .
#   docker run -p 8000:8000 -v $PWD/work/demo/export:/models/export:ro \
#       -v $PWD/api-keys:/run/secrets/hllm-api-keys:ro hllm-serve
#
# The model is a read-only volume at /models/export (an `hllm export` directory); API keys come from a mounted
# secret file (one key a line) read by --api-key-file, never from the image or the command line. Override CMD
# for TLS (--ssl-certfile / --ssl-keyfile from another mounted secret; the HEALTHCHECK then needs https) or
# traces (--otlp-endpoint; build with --build-arg EXTRAS=runtime,serve,otel). docs/serving.md, "Production checklist".
FROM python:3.11-slim

ARG EXTRAS=runtime,serve
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml constraints.txt README.md LICENSE /src/
COPY hllm /src/hllm
COPY deploy/install-serve.sh /src/deploy/install-serve.sh
RUN EXTRAS="$EXTRAS" sh /src/deploy/install-serve.sh /src && rm -rf /src \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin hllm

USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"]
ENTRYPOINT ["hllm", "serve"]
CMD ["/models/export", "--host", "0.0.0.0", "--port", "8000", "--api-key-file", "/run/secrets/hllm-api-keys", "--log-format", "json"]
