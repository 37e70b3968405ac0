/* Open MPI 4.1.4 rcache/grdma: two threads deadlock. One evicts (holding
 * the VMA lock, it deletes an interior node of the interval tree and waits
 * for the tree's readers to move on); the other is such a reader: inside its
 * tree traversal, grdma's lookup callback blocks on the VMA lock (P6).
 * This is the hang of ../../../shared/bench/peers-mt (pb_grdma mt,
 * REG=uring: thread A spins in opal_interval_tree_delete, thread B blocks on
 * a mutex under opal_interval_tree_traverse), reduced to one eviction and
 * one cache hit.
 *
 * Library: Open MPI 4.1.4 (Debian bookworm libopenmpi-dev 4.1.4-3+b1),
 *   libopen-pal's rcache framework with the grdma component, initialised
 *   with opal_init (no mpirun); opal_set_using_threads(true) as under
 *   MPI_THREAD_MULTIPLE (GRDMA_THREADS=0: false, deadlocks the same way: the
 *   locks involved are taken unconditionally). register_mem/deregister_mem
 *   are ours and pin with io_uring fixed buffers (../uring_reg.h); like
 *   ibv_reg_mr at its limit, register_mem says OPAL_ERR_OUT_OF_RESOURCE when
 *   told to, which makes grdma evict.
 *
 * Sequence:
 *   1. Seven one-page registrations R1..R7 at increasing addresses (keys 1..7),
 *      inserted in that order: grdma's interval tree (a red-black tree) is
 *      then 2 (root); 1, 4; 3, 6; 5, 7 -- R4 is an interior node whose
 *      successor (R5) is not its right child. All are released (cached,
 *      unleased) in the order R7, R4, R1, R2, R3, R5, R6: the LRU list.
 *   2. Thread A: rcache_register of a new page; register_mem answers
 *      OUT_OF_RESOURCE; grdma evicts the LRU head: mca_rcache_grdma_evict_lru_local
 *      takes vma_lock, removes R7 from the tree and calls deregister_mem(R7)
 *      with vma_lock held. There (only to force the interleaving), A lets
 *      thread B go and waits until B sleeps in a futex:
 *   3. Thread B: rcache_register(R1's page): the lookup traverses the tree
 *      (opal_interval_tree_traverse takes a reader token at the current epoch)
 *      and finds R1 unleased, so mca_rcache_grdma_check_cached ->
 *      mca_rcache_grdma_remove_from_lru -> opal_mutex_lock(vma_lock): B
 *      sleeps, still a reader of the tree.
 *   4. A returns from deregister_mem; grdma unlocks, retries register_mem
 *      (OUT_OF_RESOURCE again) and evicts the next LRU entry, R4: vma_lock
 *      again (A takes it again before B wakes up: glibc's mutex is not fair;
 *      to make this certain rather than likely, B runs on A's CPU with the
 *      SCHED_IDLE policy, so A's unlock does not hand it the CPU), then
 *      opal_interval_tree_delete(R4): an interior node whose successor is
 *      not its right child, so rp_free_wait -> rp_wait_for_readers spins
 *      until every reader has seen the new epoch -- including B, which waits
 *      for the vma_lock that A holds.
 * Expected: both rcache_register calls return (a writer must not wait for
 *   readers while holding a lock that a reader's callback takes).
 * Observed: neither returns: A spins (100% CPU) in opal_interval_tree_delete,
 *   B sleeps in pthread_mutex_lock; this program prints
 *     DEADLOCK: after 5 s thread A (eviction, state R) and thread B (lookup,
 *     state S) have not returned ...
 *   and exits 1. (If B happens to take the lock first in step 4, nothing
 *   hangs; the program then starts over, up to 5 attempts. Here the first
 *   attempt hangs.)
 * Responsible: opal/mca/rcache/grdma/rcache_grdma_module.c:
 *   mca_rcache_grdma_evict_lru_local holds vma_lock across dereg_mem ->
 *   mca_rcache_base_vma_delete -> opal_interval_tree_delete, while
 *   mca_rcache_grdma_check_cached, the callback of a tree traversal, takes
 *   vma_lock (mca_rcache_grdma_remove_from_lru); opal/class/opal_interval_tree.c:
 *   opal_interval_tree_delete_interior -> rp_free_wait -> rp_wait_for_readers
 *   busy-waits for all readers (`while (tree->reader_epochs[i] < epoch_id)`).
 *   Line numbers not pinned: the 4.1.4 sources are not installed here;
 *   function names and statements checked against open-mpi/ompi's files.
 *
 * Build: OMPI=/usr/lib/x86_64-linux-gnu/openmpi
 *   gcc -O1 -g -Wall -I.. -I$OMPI/include/openmpi -I$OMPI/include evict-vs-lookup-deadlock.c \
 *       -L$OMPI/lib -Wl,-rpath,$OMPI/lib -lopen-pal -lpthread -o evict-vs-lookup-deadlock
 * Run: ./evict-vs-lookup-deadlock   exit 1 and a DEADLOCK line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/evict-vs-lookup-deadlock.c.
 * Written for the mrcache project (conformance/reproducers). */
#define _GNU_SOURCE
#include "opal_config.h"
#include "opal/runtime/opal.h"
#include "opal/mca/base/base.h"
#include "opal/mca/rcache/rcache.h"
#include "opal/mca/rcache/base/base.h"
#if OPAL_MAJOR_VERSION >= 5
#include "opal/mca/threads/thread_usage.h" /* moved in Open MPI 5 */
#else
#include "opal/threads/thread_usage.h"
#endif
#include "uring_reg.h"
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

typedef struct {
	mca_rcache_base_registration_t super;
	int slot; /* the io_uring fixed buffer: our "MR" */
} my_reg_t;

#define RW (MCA_RCACHE_ACCESS_LOCAL_WRITE | MCA_RCACHE_ACCESS_REMOTE_READ | MCA_RCACHE_ACCESS_REMOTE_WRITE)
#define PAGE 4096
#define STRIDE 65536

static mca_rcache_base_module_t *rc;
static unsigned char *arena;
static sem_t b_go, done;
static volatile int fail_regs, hold_in_dereg, b_started;
static volatile pid_t tid_a, tid_b;

/* The state letter of one of our threads (R running, S sleeping) and whether
 * it is in a futex syscall. */
static char thread_state(pid_t tid, int *in_futex)
{
	char path[64], buf[256], *p;
	FILE *f;
	char st = '?';

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	if ((f = fopen(path, "r"))) {
		if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) && p[1])
			st = p[2];
		fclose(f);
	}
	*in_futex = 0;
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
	if ((f = fopen(path, "r"))) {
		if (fgets(buf, sizeof(buf), f))
			*in_futex = atoi(buf) == SYS_futex;
		fclose(f);
	}
	return st;
}

static int my_register_mem(void *reg_data, void *base, size_t size, mca_rcache_base_registration_t *reg)
{
	int s;

	(void)reg_data;
	if (fail_regs > 0) {
		fail_regs--;
		return OPAL_ERR_OUT_OF_RESOURCE; /* as ibv_reg_mr's ENOMEM at the pinning limit */
	}
	s = ur_reg(base, size);
	if (s < 0)
		return OPAL_ERR_OUT_OF_RESOURCE;
	((my_reg_t *)reg)->slot = s;
	return OPAL_SUCCESS;
}

static int my_deregister_mem(void *reg_data, mca_rcache_base_registration_t *reg)
{
	(void)reg_data;
	ur_dereg(((my_reg_t *)reg)->slot);
	if (hold_in_dereg && gettid() == tid_a) {
		/* step 2: A holds vma_lock here (evict_lru_local); let B start its
		 * lookup and wait until it sleeps on the lock. */
		int i, fx = 0;
		hold_in_dereg = 0;
		sem_post(&b_go);
		for (i = 0; i < 2000; i++) {
			if (b_started && thread_state(tid_b, &fx) == 'S' && fx)
				break;
			usleep(1000);
		}
	}
	return OPAL_SUCCESS;
}

static void grdma_init(void)
{
	int argc = 1;
	char *argv0[] = { "evict-vs-lookup-deadlock", NULL }, **argv = argv0;
	mca_rcache_base_resources_t res;

	if (opal_init(&argc, &argv) != OPAL_SUCCESS || mca_base_framework_open(&opal_rcache_base_framework, 0) != OPAL_SUCCESS) {
		fprintf(stderr, "opal_init or the rcache framework failed\n");
		exit(2);
	}
	opal_set_using_threads(!getenv("GRDMA_THREADS") || atoi(getenv("GRDMA_THREADS")));
	memset(&res, 0, sizeof(res));
	res.cache_name = "repro";
	res.sizeof_reg = sizeof(my_reg_t);
	res.register_mem = my_register_mem;
	res.deregister_mem = my_deregister_mem;
	rc = mca_rcache_base_module_create("grdma", NULL, &res);
	if (!rc) {
		fprintf(stderr, "mca_rcache_base_module_create(grdma) failed\n");
		exit(2);
	}
}

static mca_rcache_base_registration_t *acquire(int key)
{
	mca_rcache_base_registration_t *r = NULL;

	if (rc->rcache_register(rc, arena + (size_t)key * STRIDE, PAGE, 0, RW, &r) != OPAL_SUCCESS) {
		fprintf(stderr, "rcache_register(key %d) failed\n", key);
		exit(2);
	}
	return r;
}

static cpu_set_t one_cpu;

static void *thread_a(void *arg)
{
	(void)arg;
	pthread_setaffinity_np(pthread_self(), sizeof(one_cpu), &one_cpu);
	tid_a = gettid();
	fail_regs = 2;
	hold_in_dereg = 1;
	rc->rcache_deregister(rc, acquire(8)); /* 2, 4 */
	sem_post(&done);
	return NULL;
}

static void *thread_b(void *arg)
{
	struct sched_param sp = { 0 };

	(void)arg;
	/* Only to let A re-take vma_lock before B wakes (step 4): B shares A's
	 * CPU with the SCHED_IDLE policy, so A's unlock does not hand B the CPU. */
	pthread_setaffinity_np(pthread_self(), sizeof(one_cpu), &one_cpu);
	if (sched_setscheduler(0, SCHED_IDLE, &sp))
		perror("sched_setscheduler(SCHED_IDLE)");
	tid_b = gettid();
	sem_wait(&b_go);
	b_started = 1; /* from here B's only sleep is on vma_lock */
	rc->rcache_deregister(rc, acquire(1)); /* 3 */
	sem_post(&done);
	return NULL;
}

/* One attempt, in a child process: 0 both returned, 1 deadlock, 2 error. */
static int attempt(void)
{
	static const int release_order[] = { 7, 4, 1, 2, 3, 5, 6 };
	mca_rcache_base_registration_t *r[8];
	struct timespec until;
	pthread_t a, b;
	int i, fa = 0, fb = 0, finished = 0;
	char sa, sb;

	ur_init();
	grdma_init();
	arena = mmap(NULL, 9 * STRIDE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (arena == MAP_FAILED)
		return 2;
	memset(arena, 0x5a, 9 * STRIDE);
	for (i = 1; i <= 7; i++) /* 1 */
		r[i] = acquire(i);
	for (i = 0; i < 7; i++)
		rc->rcache_deregister(rc, r[release_order[i]]);

	sem_init(&b_go, 0, 0);
	sem_init(&done, 0, 0);
	CPU_ZERO(&one_cpu);
	CPU_SET(sched_getcpu(), &one_cpu);
	pthread_create(&b, NULL, thread_b, NULL);
	pthread_create(&a, NULL, thread_a, NULL);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	while (finished < 2 && sem_timedwait(&done, &until) == 0)
		finished++;
	if (finished == 2) {
		printf("both threads returned\n");
		return 0;
	}
	sa = thread_state(tid_a, &fa);
	sb = thread_state(tid_b, &fb);
	printf("DEADLOCK: after 5 s thread A (eviction, state %c%s) and thread B (lookup, state %c%s) have not returned "
	       "(A spins in opal_interval_tree_delete waiting for B's traversal; B waits for the vma_lock A holds)\n",
	       sa, fa ? ", in futex" : "", sb, fb ? ", in futex" : "");
	fflush(stdout);
	return 1;
}

int main(void)
{
	int n, st;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (n = 1; n <= 5; n++) {
		printf("attempt %d\n", n);
		pid = fork();
		if (pid == 0)
			_exit(attempt());
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) == 2)
			return 2;
		if (WEXITSTATUS(st) == 1)
			return 1;
	}
	printf("no deadlock in 5 attempts\n");
	return 0;
}
