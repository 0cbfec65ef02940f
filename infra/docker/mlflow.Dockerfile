# MLflow tracking server: the official image plus the two drivers it lacks
# (PostgreSQL backend store through psycopg 3, S3/MinIO artifacts through boto3).
# Keep the tag at the MLflow version the project is tested with (pyproject: mlflow>=3.1).
FROM ghcr.io/mlflow/mlflow:v3.17.2

# Flask-WTF: the basic-auth app's CSRF protection (MLflow's [auth] extra).
RUN pip install --no-cache-dir "psycopg[binary]==3.3.9" "boto3==1.44.8" "Flask-WTF==1.3.0"

# Basic auth always (mlflow-start.sh: refuses the "change-me" placeholders and a
# missing credential, writes the auth config under /tmp, then
# `mlflow server --app-name basic-auth`); never root.
COPY infra/docker/refuse-placeholders.sh infra/docker/mlflow-start.sh /usr/local/bin/
RUN useradd --create-home --uid 10001 mlflow
USER 10001
ENTRYPOINT ["mlflow-start.sh"]

# Health probe: python, since the image has no curl.
HEALTHCHECK --interval=10s --timeout=5s --retries=12 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=4)"]
