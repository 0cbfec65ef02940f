#!/bin/sh
# refuse-placeholders.sh COMMAND [ARGS...]
#
# The first step of every container in infra/: refuse to start while any environment
# variable still holds the placeholder of infra/.env.example or
# infra/k8s/secrets.example.yaml ("change-me", any case: a password, a key, or a
# database URL built from one), then exec COMMAND in this process (PID 1 stays the
# service). compose.yaml mounts this file into the third-party images and puts it in
# front of their own entrypoint; the vfops images hold it as
# /usr/local/bin/refuse-placeholders.sh (their ENTRYPOINT).
set -eu

if [ "$#" -eq 0 ]; then
  echo "refuse-placeholders: no command to run (usage: refuse-placeholders.sh COMMAND [ARGS...])" >&2
  exit 2
fi

placeholders=""
# names only (values may span lines); each value read back by name
for name in $(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p'); do
  eval "value=\${$name-}"
  case "$value" in
    *[Cc][Hh][Aa][Nn][Gg][Ee]-[Mm][Ee]*) placeholders="$placeholders $name" ;;
  esac
done

if [ -n "$placeholders" ]; then
  echo "refusing to start: the placeholder 'change-me' is still set in${placeholders};" \
    "set real values in infra/.env (compose) or the Kubernetes Secrets (infra/README.md, Secrets)" >&2
  exit 2
fi

exec "$@"
