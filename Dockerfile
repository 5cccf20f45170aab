FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY nexarch_events ./nexarch_events
COPY sql ./sql
RUN pip install --no-cache-dir . && useradd --system nexarch
USER nexarch
ENTRYPOINT []
EXPOSE 8080
CMD ["nexarch-events", "run"]
