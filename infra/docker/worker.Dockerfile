# vfops Prefect worker (CPU). Build from the repository root:
#   docker build -f infra/docker/worker.Dockerfile -t vfops-worker:dev .
# Runs the flows (eval-sweep, judge-score, nightly-eval, promote-checkpoint, ...) and
# `vfops db upgrade`; the same image serves the process worker (compose) and the
# kubernetes worker (infra/k8s), hence the [k8s] extra.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # nothing is ever fetched from a model/data hub at run time
    HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1

# torch first, from the CPU index: otherwise the [train] extra would pull a multi-GB
# CUDA build (same order as the Makefile).
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

WORKDIR /opt/vfops
COPY pyproject.toml README.md ./
COPY vfops ./vfops
COPY environments ./environments
COPY configs ./configs
# Editable: `vfops deploy` registers deployments whose source is this checkout
# (the folder holding the vfops.flows entry points' modules, vfops/flows/), so /opt/vfops
# must be where the package lives.
# [train]: promotion gates evaluate registered checkpoints in-process (transformers).
# Byte-compiled once here, like `make setup`.
RUN pip install --no-cache-dir -e '.[train,k8s,gguf]' \
        ./environments/arithmetic ./environments/calculator ./environments/code_exec \
        ./environments/guess_number \
        ./environments/judged_qa ./environments/lucky_digit ./environments/mixed \
        ./environments/reverse_text \
    && python -m compileall -q vfops > /dev/null

# Never root at run time; state (VFOPS_HOME, Prefect's home) under the user's home.
# Flow runs start in /opt/vfops (the deployments' working directory): evaluations
# without an output folder write ./outputs there.
RUN useradd --create-home --uid 10001 vfops \
    && mkdir -p /opt/vfops/outputs && chown 10001:10001 /opt/vfops/outputs
USER 10001
ENV VFOPS_HOME=/home/vfops/.vfops \
    PREFECT_HOME=/home/vfops/.prefect

# Every command starts by refusing the "change-me" placeholders (infra/.env.example,
# infra/k8s/secrets.example.yaml), then execs; Kubernetes flow-run pods (the CPU work
# pool) keep this ENTRYPOINT and pass `prefect flow-run execute` as its arguments.
COPY infra/docker/refuse-placeholders.sh /usr/local/bin/refuse-placeholders.sh

EXPOSE 8080
ENTRYPOINT ["refuse-placeholders.sh"]
# --with-healthcheck serves GET /health on PREFECT_WORKER_WEBSERVER_PORT (8080).
CMD ["prefect", "worker", "start", "--pool", "vfops", "--type", "process", "--with-healthcheck"]
