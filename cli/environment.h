/* The machine and software a run was measured on, for benchmark artifacts
 * (environment.json): the host CPU, kernel and OS, the compiler that built tunegraph, the
 * libraries' versions, and on a CUDA run the GPU's name and clocks and the driver, CUDA,
 * cuBLASLt and NCCL versions. What cannot be found is listed under "absent" with why. */
#ifndef TUNEGRAPH_CLI_ENVIRONMENT_H
#define TUNEGRAPH_CLI_ENVIRONMENT_H

#include <jansson.h>

/* device: "cpu" or "cuda" (the run's). NULL when out of memory. */
json_t *environment_describe(const char *device);

#endif
