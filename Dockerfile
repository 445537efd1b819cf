# syntax=docker/dockerfile:1
# The image the chart runs: CUDA + PyTorch + DeepSpeed (ops prebuilt) + OpenMPI + sshd + shardbench.
#   docker build -t shardbench:0.1.0-cuda .                        # GPU shapes (values/a10|a100|h100|h200.yaml)
#   docker build --build-arg VARIANT=cpu -t shardbench:0.1.0-cpu .  # values/cpu.yaml
# Everything is installed here: a run downloads nothing and JIT-compiles no DeepSpeed op it uses.

# cuda or cpu: picks the base image below and the PyTorch build.
ARG VARIANT=cuda
# -devel, not -runtime: nvcc builds the DeepSpeed ops at image build time.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
ARG CPU_IMAGE=ubuntu:24.04

FROM ${CUDA_IMAGE} AS base-cuda
FROM ${CPU_IMAGE} AS base-cpu
FROM base-${VARIANT}

ARG VARIANT
# The non-root user the pods run as: values.yaml ssh.user / ssh.uid / ssh.port must match.
ARG USER=mpiuser
ARG UID=10001
ARG SSH_PORT=2222
# Pinned like scripts/bootstrap.sh, so a cluster run uses the versions a local run does.
ARG TORCH_VERSION=2.13.0
ARG DEEPSPEED_VERSION=0.19.8
ARG MPI4PY_VERSION=4.1.2
# PyTorch's CPU-only wheels (the PyPI wheels are the CUDA build); used when VARIANT=cpu.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# GPU architectures the DeepSpeed ops are compiled for: A100 8.0, A10 8.6, H100/H200 9.0.
ARG TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# OpenMPI and ssh: mpirun on the launcher starts the ranks over ssh; the workers run sshd.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev build-essential ninja-build \
      openmpi-bin libopenmpi-dev openssh-server openssh-client \
      ca-certificates procps iproute2 libibverbs1 ibverbs-providers rdma-core \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /run/sshd

RUN python3 -m venv /opt/venv \
 && pip install --upgrade pip setuptools wheel \
 && if [ "$VARIANT" = cpu ]; then \
      pip install --index-url "$TORCH_CPU_INDEX" "torch==${TORCH_VERSION}"; \
    else \
      pip install "torch==${TORCH_VERSION}"; \
    fi \
 && pip install "mpi4py==${MPI4PY_VERSION}"

# DeepSpeed against the torch above (no build isolation), with the ops the strategies use
# prebuilt: fused/CPU Adam and the flatten utils on GPU, the shared-memory comm op on CPU.
RUN if [ "$VARIANT" = cpu ]; then \
      DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 pip install --no-build-isolation "deepspeed==${DEEPSPEED_VERSION}"; \
    else \
      TORCH_CUDA_ARCH_LIST="$TORCH_CUDA_ARCH_LIST" DS_BUILD_OPS=0 DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1 \
        DS_BUILD_UTILS=1 pip install --no-build-isolation "deepspeed==${DEEPSPEED_VERSION}"; \
    fi \
 && ds_report

# This project (the trainer and its DeepSpeed configs; the suite comes along, unused here).
COPY pyproject.toml README.md /src/
COPY trainer /src/trainer
COPY tui /src/tui
RUN pip install /src && rm -rf /src

# The user, with its sshd config. The MPI Operator mounts the job's keys at /home/$USER/.ssh
# (the chart's sshAuthMountPath); ssh clients go to the workers' port without asking about keys.
COPY docker/sshd_config /home/${USER}/.sshd_config
COPY docker/entrypoint.sh /usr/local/bin/shardbench-entrypoint
RUN useradd --create-home --uid "$UID" --user-group --shell /bin/bash "$USER" \
 && printf 'Port %s\nHostKey /home/%s/.ssh/id_rsa\n' "$SSH_PORT" "$USER" >> "/home/$USER/.sshd_config" \
 && mkdir -p "/home/$USER/.ssh" "/home/$USER/.cache" \
 && chown -R "$USER:$USER" "/home/$USER" \
 && chmod 0755 /usr/local/bin/shardbench-entrypoint \
 && printf 'Host *\n    Port %s\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n' \
      "$SSH_PORT" > /etc/ssh/ssh_config.d/00-shardbench.conf

USER ${UID}
WORKDIR /home/${USER}
EXPOSE ${SSH_PORT}
ENTRYPOINT ["/usr/local/bin/shardbench-entrypoint"]
CMD ["python", "-m", "trainer", "--help"]
