/* uring_reg.h: a registrar that pins pages the way ibv_reg_mr does, and a
 * "device" that reads and writes memory only through those pins. Shared by
 * the standalone reproducers (conformance/reproducers/, which include it
 * through a one-line shim there) and the C conformance adapters
 * (conformance/adapters/adapter.c, which define UR_SLOTS larger first).
 * Header only, raw syscalls (no liburing needed), Linux 5.13 or later
 * (IORING_REGISTER_BUFFERS2/_UPDATE).
 *
 * The "NIC" is one io_uring with a sparse fixed-buffer table:
 *   ur_reg(addr, len)      IORING_REGISTER_BUFFERS_UPDATE of one slot with
 *                          [addr, addr+len): the kernel pins the frames that
 *                          back the range *now* (FOLL_PIN|FOLL_LONGTERM, as
 *                          ib_umem_get does) and keeps them until ur_dereg.
 *   ur_dereg(slot)         the slot emptied: the frames are unpinned.
 *   ur_dma_write(slot, a, len, byte)
 *                          the device writes: IORING_OP_READ_FIXED from a
 *                          pipe holding `len` copies of `byte` into the
 *                          slot's pinned frames at the offset of `a` in the
 *                          registered range. The page tables are not
 *                          consulted: the bytes go where the registration
 *                          points, as an RDMA write to an MR does.
 *   ur_dma_read(slot, a, len, out)
 *                          the device reads (IORING_OP_WRITE_FIXED into a
 *                          pipe): what the pinned frames hold.
 * ur_check_write() runs the usual check: the application fills its pages
 * with one byte, the device writes another through the registration, and
 * the application must see the device's byte at its address. It prints
 * "STALE: ..." and returns 1 when it does not.
 *
 * One ring per process, shared by every thread (calls are serialised). A
 * fork child inherits the ring (the fd and the shared ring mappings) as it
 * inherits a verbs context: slots registered by the parent still point at
 * the parent's frames. Written for this project (mrcache); public domain
 * or the project's licence, at your option. */
#ifndef URING_REG_H
#define URING_REG_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef UR_SLOTS
#define UR_SLOTS 64
#endif

static struct {
	int fd;
	unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
	unsigned *cq_head, *cq_tail, *cq_mask;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqes;
	int used[UR_SLOTS];
	void *base[UR_SLOTS];
	size_t len[UR_SLOTS];
	long live, total;
	pthread_mutex_t lock;
} ur = { .fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER };

/* Sets up the ring and an empty table of UR_SLOTS fixed buffers. Returns 0,
 * or a negative errno with what failed in `err` (the ring is then unusable). */
static inline int ur_try_init(char *err, size_t errn)
{
	struct io_uring_params p;
	struct io_uring_rsrc_register r;
	char *sq, *cq;
	int e;

	memset(&p, 0, sizeof(p));
	ur.fd = (int)syscall(__NR_io_uring_setup, 4, &p);
	if (ur.fd < 0) {
		e = errno;
		snprintf(err, errn, "io_uring_setup: %s (io_uring unavailable or disabled, e.g. kernel.io_uring_disabled)",
			 strerror(e));
		return -e;
	}
	sq = mmap(NULL, p.sq_off.array + p.sq_entries * sizeof(unsigned), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ur.fd,
		  IORING_OFF_SQ_RING);
	cq = mmap(NULL, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
		  ur.fd, IORING_OFF_CQ_RING);
	ur.sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ur.fd,
		       IORING_OFF_SQES);
	if (sq == MAP_FAILED || cq == MAP_FAILED || ur.sqes == MAP_FAILED) {
		e = errno;
		snprintf(err, errn, "mapping the io_uring rings: %s", strerror(e));
		close(ur.fd);
		ur.fd = -1;
		return -e;
	}
	ur.sq_head = (unsigned *)(sq + p.sq_off.head);
	ur.sq_tail = (unsigned *)(sq + p.sq_off.tail);
	ur.sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
	ur.sq_array = (unsigned *)(sq + p.sq_off.array);
	ur.cq_head = (unsigned *)(cq + p.cq_off.head);
	ur.cq_tail = (unsigned *)(cq + p.cq_off.tail);
	ur.cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
	ur.cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
	memset(&r, 0, sizeof(r));
	r.nr = UR_SLOTS;
	r.flags = IORING_RSRC_REGISTER_SPARSE;
	if (syscall(__NR_io_uring_register, ur.fd, IORING_REGISTER_BUFFERS2, &r, sizeof(r)) < 0) {
		e = errno;
		snprintf(err, errn, "IORING_REGISTER_BUFFERS2 (a sparse table of %d fixed buffers): %s (Linux 5.13 or later needed)",
			 UR_SLOTS, strerror(e));
		close(ur.fd);
		ur.fd = -1;
		return -e;
	}
	return 0;
}

/* ur_try_init, or exit 2 with the reason on stderr (for the reproducers). */
static inline void ur_init(void)
{
	char err[256];
	int e = ur_try_init(err, sizeof(err));

	if (e) {
		fprintf(stderr, "uring_reg: %s\n", err);
		exit(2);
	}
}

static inline int ur_update(unsigned slot, void *addr, size_t len)
{
	struct iovec iov = { addr, len };
	struct io_uring_rsrc_update2 u;

	memset(&u, 0, sizeof(u));
	u.offset = slot;
	u.data = (uint64_t)(uintptr_t)&iov;
	u.nr = 1;
	return syscall(__NR_io_uring_register, ur.fd, IORING_REGISTER_BUFFERS_UPDATE, &u, sizeof(u)) < 0 ? -errno : 0;
}

/* Pins [addr, addr+len): returns the slot (the registration's handle), or a
 * negative errno. */
static inline int ur_reg(void *addr, size_t len)
{
	int s, e;

	pthread_mutex_lock(&ur.lock);
	for (s = 0; s < UR_SLOTS && ur.used[s]; s++)
		;
	if (s == UR_SLOTS) {
		pthread_mutex_unlock(&ur.lock);
		return -ENOSPC;
	}
	e = ur_update((unsigned)s, addr, len);
	if (!e) {
		ur.used[s] = 1;
		ur.base[s] = addr;
		ur.len[s] = len;
		ur.live++;
		ur.total++;
	}
	pthread_mutex_unlock(&ur.lock);
	return e ? e : s;
}

static inline int ur_dereg(int slot)
{
	int e;

	pthread_mutex_lock(&ur.lock);
	if (slot < 0 || slot >= UR_SLOTS || !ur.used[slot]) {
		pthread_mutex_unlock(&ur.lock);
		fprintf(stderr, "uring_reg: deregistration of slot %d, which is not registered (deregistered twice?)\n", slot);
		return -EINVAL;
	}
	e = ur_update((unsigned)slot, NULL, 0);
	if (!e) {
		ur.used[slot] = 0;
		ur.live--;
	}
	pthread_mutex_unlock(&ur.lock);
	return e;
}

/* One fixed-buffer transfer between the slot's pinned frames and a pipe. */
static inline int ur_xfer(int op, int slot, void *a, size_t len, int fd)
{
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	unsigned tail, head;
	int res;

	tail = *ur.sq_tail;
	sqe = &ur.sqes[tail & *ur.sq_mask];
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = (uint8_t)op;
	sqe->fd = fd;
	sqe->addr = (uint64_t)(uintptr_t)a;
	sqe->len = (uint32_t)len;
	sqe->off = (uint64_t)-1; /* pipes: the current position */
	sqe->buf_index = (uint16_t)slot;
	ur.sq_array[tail & *ur.sq_mask] = tail & *ur.sq_mask;
	__atomic_store_n(ur.sq_tail, tail + 1, __ATOMIC_RELEASE);
	if (syscall(__NR_io_uring_enter, ur.fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
		return -errno;
	head = *ur.cq_head;
	while (head == __atomic_load_n(ur.cq_tail, __ATOMIC_ACQUIRE))
		if (syscall(__NR_io_uring_enter, ur.fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
			return -errno;
	cqe = &ur.cqes[head & *ur.cq_mask];
	res = cqe->res;
	__atomic_store_n(ur.cq_head, head + 1, __ATOMIC_RELEASE);
	return res;
}

/* The device writes `len` bytes `byte` at `a` through the registration in
 * `slot` (a must lie in the registered range; len at most 64 KiB, a pipe's
 * default capacity). Returns 0 or a negative errno. Allocates nothing (a
 * memory hook of the cache under test sees no call of ours). */
static inline int ur_dma_write(int slot, void *a, size_t len, unsigned char byte)
{
	unsigned char src[4096];
	size_t put = 0;
	int pfd[2], r = 0;

	if (len > 65536)
		return -E2BIG;
	if (pipe(pfd))
		return -errno;
	memset(src, byte, sizeof(src));
	while (put < len) {
		size_t n = len - put < sizeof(src) ? len - put : sizeof(src);
		ssize_t w = write(pfd[1], src, n);
		if (w <= 0) {
			r = w < 0 ? -errno : -EIO;
			break;
		}
		put += (size_t)w;
	}
	if (!r) {
		pthread_mutex_lock(&ur.lock);
		r = ur_xfer(IORING_OP_READ_FIXED, slot, a, len, pfd[0]);
		pthread_mutex_unlock(&ur.lock);
	}
	close(pfd[0]);
	close(pfd[1]);
	return r < 0 ? r : (r == (int)len ? 0 : -EIO);
}

/* The device reads `len` bytes at `a` through the registration into `out`
 * (len at most 64 KiB). Returns 0 or a negative errno. */
static inline int ur_dma_read(int slot, void *a, size_t len, unsigned char *out)
{
	int pfd[2], r;

	if (len > 65536)
		return -E2BIG;
	if (pipe(pfd))
		return -errno;
	pthread_mutex_lock(&ur.lock);
	r = ur_xfer(IORING_OP_WRITE_FIXED, slot, a, len, pfd[1]);
	pthread_mutex_unlock(&ur.lock);
	if (r == (int)len && read(pfd[0], out, len) != (ssize_t)len)
		r = -EIO;
	close(pfd[0]);
	close(pfd[1]);
	return r < 0 ? r : (r == (int)len ? 0 : -EIO);
}

/* The application fills [a, a+len) with `app`, the device writes `dev`
 * through `slot`, the application reads its pages back. Returns 0 if it
 * sees the device's bytes; prints STALE and returns 1 if it does not. */
static inline int ur_check_write(const char *who, int slot, void *a, size_t len, unsigned char app, unsigned char dev)
{
	unsigned char *p = a;
	size_t i, seen = 0;
	int r;

	memset(a, app, len);
	r = ur_dma_write(slot, a, len, dev);
	if (r) {
		fprintf(stderr, "%s: the device write through slot %d failed: %s\n", who, slot, strerror(-r));
		return 2;
	}
	for (i = 0; i < len; i++)
		seen += p[i] == dev;
	if (seen != len) {
		printf("STALE: %s: the device wrote 0x%02x x %zu through registration (slot %d) for %p, but the application "
		       "reads 0x%02x at %p: the registration pins frames the application no longer maps there\n",
		       who, dev, len, slot, a, p[0], a);
		fflush(stdout);
		return 1;
	}
	printf("ok: %s: the device's 0x%02x x %zu landed at %p\n", who, dev, len, a);
	fflush(stdout);
	return 0;
}

#endif
