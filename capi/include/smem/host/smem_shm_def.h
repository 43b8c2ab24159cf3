/* Types of memfabric_hybrid's Share Memory API (smem_shm_def.h). */
#ifndef HMC_SMEM_SHM_DEF_H
#define HMC_SMEM_SHM_DEF_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *smem_shm_t;
#define SMEM_SHM_TIMEOUT_MAX UINT32_MAX
#define SMEM_SHM_ATOMIC_NUM_LIMIT 1024

/* MTE: load/store through a mapping (a co-located rank); RDMA: a one-sided transport. */
typedef enum {
    SMEMS_DATA_OP_MTE = 1U << 0,
    SMEMS_DATA_OP_SDMA = 1U << 1,
    SMEMS_DATA_OP_RDMA = 1U << 2,
} smem_shm_data_op_type;

typedef struct {
    uint32_t shmInitTimeout;          /* seconds, default 120 */
    uint32_t shmCreateTimeout;        /* seconds, default 120 */
    uint32_t controlOperationTimeout; /* seconds, default 120 */
    bool startConfigStoreServer;      /* rank 0 starts the store, default true */
    uint32_t flags;
} smem_shm_config_t;

#ifdef __cplusplus
}
#endif
#endif /* HMC_SMEM_SHM_DEF_H */
