# shellcheck shell=bash
# scripts/mpi-env.sh — sourced by the scripts that call mpirun: lets Open MPI run
# as root and oversubscribe small machines, uses shared memory between local
# ranks, makes idle ranks yield the core, and pins OpenBLAS to one thread per rank.
FSDP_MPIRUN_ARGS=(--oversubscribe --bind-to none)
if [ "$(id -u)" -eq 0 ]; then FSDP_MPIRUN_ARGS+=(--allow-run-as-root); fi
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl=self,vader
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
