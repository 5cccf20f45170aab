FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY nexarch_events ./nexarch_events
COPY sql ./sql
# A fixed uid, so that the secrets compose mounts (with the host file's
# owner and mode) can be given to it: chown 10001 secrets/*; chmod 600.
RUN pip install --no-cache-dir . && useradd --system --uid 10001 --no-create-home nexarch
USER 10001
ENTRYPOINT []
EXPOSE 8080
CMD ["nexarch-events", "run"]
