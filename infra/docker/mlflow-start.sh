#!/bin/sh
# mlflow-start.sh [MLFLOW SERVER FLAGS...]
#
# MLflow's tracking server behind its basic-auth app (`mlflow server --app-name
# basic-auth`): every request but /health needs a user. The auth config is written at
# start from the environment (never baked into the image), in a private file under
# $MLFLOW_AUTH_CONFIG_DIR (a memory-backed folder in compose and Kubernetes):
#   MLFLOW_AUTH_DATABASE_URI        the users/permissions store (its own database)
#   MLFLOW_AUTH_ADMIN_USERNAME/_PASSWORD  the admin, created on first start (MLflow
#                                   reads these two itself; later changes of the
#                                   password go through MLflow's update-password API)
#   MLFLOW_FLASK_SERVER_SECRET_KEY  signs the UI's session cookies
#   MLFLOW_AUTH_DEFAULT_PERMISSION  what other users may do by default (READ)
# Clients authenticate with MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD.
set -eu

missing=""
for name in MLFLOW_AUTH_DATABASE_URI MLFLOW_AUTH_ADMIN_USERNAME MLFLOW_AUTH_ADMIN_PASSWORD \
  MLFLOW_FLASK_SERVER_SECRET_KEY; do
  eval "value=\${$name-}"
  [ -n "$value" ] || missing="$missing $name"
done
if [ -n "$missing" ]; then
  echo "mlflow-start: refusing to start MLflow without authentication: set${missing}" \
    "(infra/README.md, Secrets)" >&2
  exit 2
fi

config_dir=${MLFLOW_AUTH_CONFIG_DIR:-/tmp/mlflow-auth}
mkdir -p "$config_dir"
umask 077
export MLFLOW_AUTH_CONFIG_PATH="$config_dir/basic_auth.ini"
# the admin's name and password stay in the environment (read by MLflow), out of the file
cat >"$MLFLOW_AUTH_CONFIG_PATH" <<EOF
[mlflow]
default_permission = ${MLFLOW_AUTH_DEFAULT_PERMISSION:-READ}
database_uri = ${MLFLOW_AUTH_DATABASE_URI}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
EOF

exec "$(dirname "$0")/refuse-placeholders.sh" mlflow server --app-name basic-auth "$@"
