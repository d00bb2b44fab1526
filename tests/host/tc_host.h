/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The kernel interfaces the index (tc_slots.c, tc_hmap.c, tc_dorder.c)
 * uses, for building it on the host: gcc atomics for the kernel's atomics
 * and barriers, pthread spinlocks, malloc for kvmalloc/vmalloc, qsort for
 * sort.  x86-64 and other 64-bit hosts.
 */
#ifndef TC_HOST_H
#define TC_HOST_H

#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
#define gfp_t unsigned int

#define GFP_KERNEL	0x1u
#define GFP_NOIO	0x2u
#define __GFP_ZERO	0x100u
#define __GFP_NOWARN	0x200u
#define __GFP_RETRY_MAYFAIL	0x400u
#define __GFP_NORETRY	0x800u
#define KMALLOC_MAX_SIZE	(4ul << 20)

#define U32_MAX		UINT32_MAX
#define U64_MAX		UINT64_MAX
#define BITS_PER_LONG	(8 * (int)sizeof(long))
#define BIT(n)		(1UL << (n))

#define DIV_ROUND_UP(n, d)	(((n) + (d) - 1) / (d))
#define round_up(x, y)		((((x) - 1) | ((__typeof__(x))((y) - 1))) + 1)
#define min_t(t, a, b)		((t)(a) < (t)(b) ? (t)(a) : (t)(b))
#define max_t(t, a, b)		((t)(a) > (t)(b) ? (t)(a) : (t)(b))
#define min(a, b)		((a) < (b) ? (a) : (b))
#define clamp(v, lo, hi)	((v) < (lo) ? (lo) : (v) > (hi) ? (hi) : (v))

/*
 * Memory order: the kernel's on the C11 model.  Loads and stores of shared
 * words are relaxed atomics (no data race for the compiler or a sanitizer),
 * acquire/release and fences as the kernel's barriers promise.
 */
#define READ_ONCE(x)		__atomic_load_n(&(x), __ATOMIC_RELAXED)
#define likely(x)		__builtin_expect(!!(x), 1)
#define unlikely(x)		__builtin_expect(!!(x), 0)
#define WRITE_ONCE(x, v)	__atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
/* barrier: acquire load */
#define smp_load_acquire(p)	__atomic_load_n((p), __ATOMIC_ACQUIRE)
/* barrier: release store */
#define smp_store_release(p, v)	__atomic_store_n((p), (v), __ATOMIC_RELEASE)
/* barrier: orders loads */
#define smp_rmb()		__atomic_thread_fence(__ATOMIC_ACQUIRE)
/* barrier: orders stores */
#define smp_wmb()		__atomic_thread_fence(__ATOMIC_RELEASE)
/* barrier: full */
#define smp_mb()		__atomic_thread_fence(__ATOMIC_SEQ_CST)
#define try_cmpxchg(p, oldp, new) \
	__atomic_compare_exchange_n((p), (oldp), (new), false, \
				    __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)
/* the value found at *p (@o: swapped), fully ordered as the kernel's */
#define cmpxchg(p, o, n) ({						\
	__typeof__(*(p)) __old = (o);					\
	__atomic_compare_exchange_n((p), &__old, (n), false,		\
				    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);\
	__old;								\
})
/* threads here are not pinned to a CPU: let a preempted lock holder run */
#define cpu_relax()		sched_yield()

/* ---- atomic bitops on arrays of unsigned long ---- */
#define TC_HOST_W(nr, a)	(&(a)[(nr) / BITS_PER_LONG])
#define TC_HOST_B(nr)		(1UL << ((nr) % BITS_PER_LONG))

static inline bool test_bit(long nr, const unsigned long *a)
{
	return __atomic_load_n(TC_HOST_W(nr, a), __ATOMIC_RELAXED) &
	       TC_HOST_B(nr);
}

static inline void set_bit(long nr, unsigned long *a)
{
	__atomic_fetch_or(TC_HOST_W(nr, a), TC_HOST_B(nr), __ATOMIC_RELAXED);
}

static inline void clear_bit(long nr, unsigned long *a)
{
	__atomic_fetch_and(TC_HOST_W(nr, a), ~TC_HOST_B(nr),
			   __ATOMIC_RELAXED);
}

static inline bool test_and_set_bit(long nr, unsigned long *a)
{
	return __atomic_fetch_or(TC_HOST_W(nr, a), TC_HOST_B(nr),
				 __ATOMIC_SEQ_CST) & TC_HOST_B(nr);
}

static inline bool test_and_clear_bit(long nr, unsigned long *a)
{
	return __atomic_fetch_and(TC_HOST_W(nr, a), ~TC_HOST_B(nr),
				  __ATOMIC_SEQ_CST) & TC_HOST_B(nr);
}

/* ---- locks: no interrupts on the host ---- */
#define spinlock_t pthread_spinlock_t
#define spin_lock_init(l)	pthread_spin_init((l), PTHREAD_PROCESS_PRIVATE)
#define spin_lock_irqsave(l, f)	\
	do { (f) = 0; pthread_spin_lock(l); } while (0)
#define spin_unlock_irqrestore(l, f) \
	do { (void)(f); pthread_spin_unlock(l); } while (0)
#define spin_lock(l)		pthread_spin_lock(l)
#define spin_unlock(l)		pthread_spin_unlock(l)
#define local_irq_save(f)	((f) = 0)
#define local_irq_restore(f)	((void)(f))

/* ---- memory ---- */
static inline size_t array_size(size_t n, size_t size)
{
	size_t bytes;

	return __builtin_mul_overflow(n, size, &bytes) ? SIZE_MAX : bytes;
}

/* the tests make the next allocations fail by setting this */
extern unsigned int tc_host_fail_allocs;

static inline void *kvmalloc(size_t bytes, gfp_t gfp)
{
	void *p;

	if (tc_host_fail_allocs) {
		tc_host_fail_allocs--;
		return NULL;
	}
	p = malloc(bytes ? bytes : 1);

	if (p && (gfp & __GFP_ZERO))
		memset(p, 0, bytes);
	return p;
}

static inline void *kvmalloc_array(size_t n, size_t size, gfp_t gfp)
{
	size_t bytes = array_size(n, size);

	return bytes == SIZE_MAX ? NULL : kvmalloc(bytes, gfp);
}

#define __vmalloc(bytes, gfp)	kvmalloc((bytes), (gfp))
#define kvfree(p)		free(p)

/* ---- test seams ---- */
/* called between two buckets of a lookup: the threaded tests yield there */
extern void (*tc_host_race_hook)(void);
#define tc_hmap_race_window() \
	do { if (tc_host_race_hook) tc_host_race_hook(); } while (0)

/* ---- arithmetic and sorting ---- */
static inline u64 mul_u64_u64_shr(u64 a, u64 mul, unsigned int shift)
{
	return (u64)(((__uint128_t)a * mul) >> shift);
}

#define sort(base, num, size, cmp, swap) \
	qsort((base), (num), (size), (cmp))

/* the kernel's sort_r() on qsort(): the context in a thread variable */
struct tc_host_sort {
	int (*cmp)(const void *a, const void *b, const void *priv);
	const void *priv;
};
extern __thread struct tc_host_sort tc_host_sort;

static inline int tc_host_sort_cmp(const void *a, const void *b)
{
	return tc_host_sort.cmp(a, b, tc_host_sort.priv);
}

static inline void sort_r(void *base, size_t num, size_t size,
			  int (*cmp)(const void *, const void *, const void *),
			  void *swap, const void *priv)
{
	(void)swap;
	tc_host_sort.cmp = cmp;
	tc_host_sort.priv = priv;
	qsort(base, num, size, tc_host_sort_cmp);
}

/* ---- atomic_t ---- */
typedef struct { int counter; } atomic_t;
#define atomic_read(v)		__atomic_load_n(&(v)->counter, __ATOMIC_RELAXED)
#define atomic_set(v, i)	__atomic_store_n(&(v)->counter, (i), \
						 __ATOMIC_RELAXED)
#define atomic_inc(v)		__atomic_fetch_add(&(v)->counter, 1, \
						   __ATOMIC_RELAXED)
#define atomic_dec(v)		__atomic_fetch_sub(&(v)->counter, 1, \
						   __ATOMIC_RELAXED)
#define smp_mb__after_atomic()	smp_mb()

/* ---- scheduling ---- */
#define gfpflags_allow_blocking(gfp)	(((gfp) & GFP_KERNEL) != 0)
#define cond_resched()			do { } while (0)

#endif /* TC_HOST_H */
