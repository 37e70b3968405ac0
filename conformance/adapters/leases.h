/* A small lease table shared by the C adapters: lease name -> peer handle. */
#ifndef CONFORM_LEASES_H
#define CONFORM_LEASES_H
#include <pthread.h>
#include <stdint.h>

#define MAX_LEASES 1024
struct lease_slot { uint64_t lease; void *handle; int used; };
static struct lease_slot lease_tab[MAX_LEASES];
static pthread_mutex_t lease_lock = PTHREAD_MUTEX_INITIALIZER;

static int lease_put(uint64_t lease, void *h)
{
	int i, r = -1;
	pthread_mutex_lock(&lease_lock);
	for (i = 0; i < MAX_LEASES; i++)
		if (!lease_tab[i].used) {
			lease_tab[i].lease = lease;
			lease_tab[i].handle = h;
			lease_tab[i].used = 1;
			r = 0;
			break;
		}
	pthread_mutex_unlock(&lease_lock);
	return r;
}

/* What lease_take returns for a lease the destroyed cache held: its
 * release is a no-op. */
#define LEASE_ORPHAN ((void *)1)

/* The cache is destroyed: every lease held becomes an orphan. */
static void lease_orphan_all(void)
{
	int i;
	pthread_mutex_lock(&lease_lock);
	for (i = 0; i < MAX_LEASES; i++)
		if (lease_tab[i].used)
			lease_tab[i].handle = LEASE_ORPHAN;
	pthread_mutex_unlock(&lease_lock);
}

static void *lease_take(uint64_t lease)
{
	int i;
	void *h = NULL;
	pthread_mutex_lock(&lease_lock);
	for (i = 0; i < MAX_LEASES; i++)
		if (lease_tab[i].used && lease_tab[i].lease == lease) {
			h = lease_tab[i].handle;
			lease_tab[i].used = 0;
			break;
		}
	pthread_mutex_unlock(&lease_lock);
	return h;
}
#endif
