/* verbs.c: libmrcache with its built-in verbs registrar on a protection
 * domain the program owns. Without an RDMA device it prints "no RDMA device"
 * and why, and exits 0 (there is nothing to cache for). Exits 1 on an error.
 *
 *   cc verbs.c $(pkg-config --cflags --libs mrcache libibverbs) -o verbs
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <mrcache.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  int n = 0;
  errno = 0;
  struct ibv_device **devices = ibv_get_device_list(&n);
  if (!devices || n == 0) {
    printf("no RDMA device: ibv_get_device_list %s (%s); nothing to register\n",
           devices ? "lists none" : "failed", devices ? "load rdma_rxe for a software device" : strerror(errno));
    if (devices) ibv_free_device_list(devices);
    return 0;
  }
  struct ibv_context *ctx = ibv_open_device(devices[0]);
  if (!ctx) { perror("ibv_open_device"); ibv_free_device_list(devices); return 1; }
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  if (!pd) { perror("ibv_alloc_pd"); ibv_close_device(ctx); ibv_free_device_list(devices); return 1; }

  int rc = 1;
  mrcache_registrar_t registrar;
  mrcache_config_t config;
  mrcache_t *cache = NULL;
  mrcache_status_t st = mrcache_registrar_verbs(pd, &registrar);
  if (st == MRCACHE_OK) st = mrcache_config_init(&config);
  if (st == MRCACHE_OK) st = mrcache_create(&config, &registrar, &cache);
  if (st == MRCACHE_OK) {
    size_t len = 1 << 20;
    char *buf = malloc(len);
    mrcache_lease_t lease;
    uint32_t lkey = 0, rkey = 0;
    for (int i = 0; i < 2 && st == MRCACHE_OK; i++) {
      st = mrcache_acquire(cache, buf, len, MRCACHE_ACCESS_LOCAL_WRITE | MRCACHE_ACCESS_REMOTE_READ, &lease);
      if (st == MRCACHE_OK) st = mrcache_lease_keys(cache, lease, &lkey, &rkey);
      if (st == MRCACHE_OK) printf("%s: lkey %#x rkey %#x\n", ibv_get_device_name(devices[0]), lkey, rkey);
      if (st == MRCACHE_OK) st = mrcache_release(cache, lease);
    }
    if (st == MRCACHE_OK) st = mrcache_destroy(cache);
    free(buf);
  }
  if (st == MRCACHE_OK) rc = 0;
  else fprintf(stderr, "%s: %s\n", mrcache_status_name(st), mrcache_last_error(NULL));
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(devices);
  return rc;
}
