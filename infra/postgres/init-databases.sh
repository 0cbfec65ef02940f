#!/bin/sh
# Runs once, on an empty data volume (docker-entrypoint-initdb.d): one PostgreSQL
# server, one database each for the vfops registry, Prefect, MLflow and MLflow's users
# (its basic-auth app), owned by the
# superuser from infra/.env. Names come from the same variables the services use.
set -eu
for db in "$VFOPS_DB" "$PREFECT_DB" "$MLFLOW_DB" "$MLFLOW_AUTH_DB"; do
  echo "creating database $db"
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -c "CREATE DATABASE \"$db\" OWNER \"$POSTGRES_USER\";"
done
