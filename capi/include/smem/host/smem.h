/* memfabric_hybrid's common host API (smem.h) on HMC-Go: libmf_smem.so, any Linux host.
 * Signatures, values and return codes are upstream's; behaviour differences are listed in
 * docs/memfabric.md. Every function returns 0 (SM_OK) on success and a negative SM_* code on
 * failure, with the reason in the calling thread's last-error text. */
#ifndef HMC_SMEM_H
#define HMC_SMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ASYNC_COPY_FLAG (1UL << 0)
#define COPY_EXTEND_FLAG (1UL << 1)
#define SMEM_WORLD_SIZE_MAX 1024
#define SMEM_INVALID_DEV_ID (-1)

/* Return codes. */
#define SM_OK 0
#define SM_ERROR (-1)
#define SM_INVALID_PARAM (-2000)
#define SM_MALLOC_FAILED (-2001)
#define SM_NEW_OBJECT_FAILED (-2002)
#define SM_NOT_STARTED (-2003)
#define SM_TIMEOUT (-2004)
#define SM_REPEAT_CALL (-2005)
#define SM_DUPLICATED_OBJECT (-2006)
#define SM_OBJECT_NOT_EXISTS (-2007)
#define SM_NOT_INITIALIZED (-2008)
#define SM_RESOURCE_IN_USE (-2009)
#define SM_RECONNECT (-2010)

int32_t smem_init(uint32_t flags);
void smem_uninit(void);
/* Starts a config store at "tcp://ip:port" in this process (kept until smem_uninit). */
int32_t smem_create_config_store(const char *storeUrl);
/* Routes the library's log lines to func (level 0 debug .. 3 error); NULL: SM_INVALID_PARAM. */
int32_t smem_set_extern_logger(void (*func)(int level, const char *msg));
int32_t smem_set_log_level(int level);
/* enable = false: store links in clear (the default). TLS for the store is configured through
 * smem_bm_config_t.storeTlsConfig; enable = true here is SM_INVALID_PARAM. */
int32_t smem_set_conf_store_tls(bool enable, const char *tls_info, const uint32_t tls_info_len);
/* Password decryption callback of upstream's TLS key API. */
typedef int (*smem_decrypt_handler)(const char *cipherText, size_t cipherTextLen, char *plainText, size_t *plainTextLen);
/* Accepted and ignored (upstream's is a stub too): store TLS keys come from
 * smem_bm_config_t.storeTlsConfig.keyPath. NULL or empty key: SM_INVALID_PARAM. */
int32_t smem_set_config_store_tls_key(const char *tls_pk, const uint32_t tls_pk_len, const char *tls_pk_pw,
                                      const uint32_t tls_pk_pw_len, const smem_decrypt_handler h);
const char *smem_get_last_err_msg(void);
const char *smem_get_and_clear_last_err_msg(void);

#ifdef __cplusplus
}
#endif
#endif /* HMC_SMEM_H */
