/* CPU reference: the data-parallel collectives (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER) over the CPU
 * communicator of replicas running in threads or in the processes of an MPI job
 * (runtime/comm.h). With one replica (no communicator) the sum over one is the tensor
 * itself, and so is the gather. */
#include "runtime/cpu/cpu_kernels.h"

void tg_cpu_kernel_all_gather(const tg_cpu_op_args *a) {
    /* Run on the stored values, bf16 ones too (tg_cpu_op_run_any, op_run.c). With in1, this
     * replica's slice is in1, put in place first. */
    const size_t elem = (size_t)tg_dtype_size(a->out_dtype[0]), bytes = (size_t)a->op->p.all_gather.slice * elem;
    if (a->in[1]) memcpy((uint8_t *)a->out[0] + (size_t)(a->comm ? a->rank : 0) * bytes, a->in[1], bytes);
    /* Only an MPI group fails a gather (it has said why on stderr); the op fails with it. */
    if (a->comm && tg_cpu_all_gather(a->comm, a->rank, a->out[0], a->op->p.all_gather.slice, elem))
        tg_cpu_op_out_of_memory(a);
}

void tg_cpu_kernel_all_reduce(const tg_cpu_op_args *a) {
    /* Out of memory on any rank fails the op on every rank (the executor says so); so does
     * an MPI group's error, which it has printed. */
    if (a->comm && tg_cpu_all_reduce_sum(a->comm, a->rank, F32(a->out[0]), a->op->p.count.n))
        tg_cpu_op_out_of_memory(a);
}

void tg_cpu_kernel_reduce_scatter(const tg_cpu_op_args *a) {
    const tg_reduce_scatter_params *p = &a->op->p.reduce_scatter;
    if (a->comm && tg_cpu_reduce_scatter_sum(a->comm, a->rank, F32(a->out[0]), p->n, p->first, p->slice))
        tg_cpu_op_out_of_memory(a);
}
