# vfops GRPO trainer (GPU). Build from the repository root:
#   docker build -f infra/docker/trainer.Dockerfile -t vfops-trainer:dev .
# One image per training rank; the vLLM generation server runs from the vllm/vllm-openai
# image (vLLM pins its own torch: vfops/training/VLLM.md).
# -devel: DeepSpeed JIT-compiles its CUDA ops (fused Adam, ...) on first use, with nvcc.
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*

# A venv: Ubuntu's system Python refuses pip installs (PEP 668).
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# vLLM in the trainer too, only for `[generation] sync = "nccl"` (the trainer joins
# vLLM's weight-transfer NCCL group); its torch is the one training uses. Build with
# --build-arg VLLM_VERSION= to leave it out (filesystem sync only).
ARG VLLM_VERSION=0.33.0
ARG TORCH_VERSION=2.13.0
RUN if [ -n "$VLLM_VERSION" ]; then \
        pip install --no-cache-dir "vllm==${VLLM_VERSION}"; \
    else \
        pip install --no-cache-dir "torch==${TORCH_VERSION}"; \
    fi

WORKDIR /opt/vfops
COPY pyproject.toml README.md ./
COPY vfops ./vfops
COPY environments ./environments
COPY configs ./configs
# [train]: transformers, accelerate, peft, deepspeed (pyproject.toml).
RUN pip install --no-cache-dir -e '.[train,gguf]' \
        ./environments/arithmetic ./environments/calculator ./environments/code_exec \
        ./environments/guess_number \
        ./environments/judged_qa ./environments/lucky_digit ./environments/mixed \
        ./environments/reverse_text \
    && python -m compileall -q vfops > /dev/null

# /outputs and /sync owned by the run-time user: named volumes mounted there start
# with this ownership (infra/compose.yaml trainer); /opt/vfops/outputs for flow runs
# started in /opt/vfops (the GPU work pool).
RUN useradd --create-home --uid 10001 vfops \
    && mkdir -p /outputs /sync /opt/vfops/outputs \
    && chown 10001:10001 /outputs /sync /opt/vfops/outputs
# The placeholder check in front of every command (infra/docker/refuse-placeholders.sh);
# vLLM's admin middleware, copied into the vllm pod by its init container (infra/k8s/training).
COPY infra/docker/refuse-placeholders.sh /usr/local/bin/refuse-placeholders.sh
COPY infra/vllm/vfops_vllm_admin.py /opt/vfops-infra/vfops_vllm_admin.py
USER 10001
ENV VFOPS_HOME=/home/vfops/.vfops \
    PREFECT_HOME=/home/vfops/.prefect

# Each rank: accelerate launch --num_machines N --machine_rank R --main_process_ip HOST
#   --deepspeed_config_file ... -m vfops.training._launched FOLDER  (infra/k8s/trainer.yaml);
# on one machine `vfops train CONFIG --num-processes M --deepspeed ...` does the launch.
ENTRYPOINT ["refuse-placeholders.sh", "accelerate", "launch"]
CMD ["--help"]
