// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: buffers of page chunks and bios over them.
 *
 * A writeback request gathers many cache slots into one buffer and writes
 * it to the origin as one bio.  The buffer is made of compound pages of up
 * to 64 KiB so that a bio of BIO_MAX_VECS vectors carries up to 16 MiB;
 * when memory is fragmented it falls back to single pages.  Chunks of the
 * largest size come from the engine's pool (tc_pool.c) when it has some.
 */
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/highmem.h>

#include "tiercache.h"

static void tc_buf_free_chunk(struct tc_pool *p, struct tc_buf *b,
			      struct page *pg)
{
	unsigned int order = get_order(b->chunk_bytes);

	if (order != TC_BUF_MAX_ORDER || !p || !tc_pool_put(p, pg))
		__free_pages(pg, order);
}

/* Free @b's chunks, or give them to @p (may be NULL) for reuse. */
void tc_buf_free(struct tc_pool *p, struct tc_buf *b)
{
	unsigned int i;

	if (!b->chunks)
		return;
	for (i = 0; i < b->nr_chunks; i++)
		if (b->chunks[i])
			tc_buf_free_chunk(p, b, b->chunks[i]);
	kfree(b->chunks);
	b->chunks = NULL;
	b->nr_chunks = 0;
}

static int tc_buf_alloc_order(struct tc_pool *p, struct tc_buf *b,
			      size_t bytes, unsigned int order)
{
	/* every user can do without (runs on the reclaim path): may fail */
	gfp_t gfp = GFP_NOIO | __GFP_NORETRY | __GFP_NOWARN;
	unsigned int i;

	if (order)
		gfp |= __GFP_COMP;
	b->chunk_bytes = PAGE_SIZE << order;
	b->nr_chunks = DIV_ROUND_UP(bytes, b->chunk_bytes);
	b->chunks = kcalloc(b->nr_chunks, sizeof(*b->chunks),
			    GFP_NOIO | __GFP_NORETRY | __GFP_NOWARN);
	if (!b->chunks)
		return -ENOMEM;
	for (i = 0; i < b->nr_chunks; i++) {
		if (order == TC_BUF_MAX_ORDER && p)
			b->chunks[i] = tc_pool_get(p);
		if (!b->chunks[i])
			b->chunks[i] = alloc_pages(gfp, order);
		if (!b->chunks[i]) {
			tc_buf_free(p, b);
			return -ENOMEM;
		}
	}
	return 0;
}

/*
 * A buffer of @bytes, in chunks of up to 1 << TC_BUF_MAX_ORDER pages taken
 * from @p (may be NULL) when it has them.
 */
int tc_buf_alloc(struct tc_pool *p, struct tc_buf *b, size_t bytes)
{
	unsigned int order = min_t(unsigned int, get_order(bytes),
				   TC_BUF_MAX_ORDER);

	if (order && !tc_buf_alloc_order(p, b, bytes, order))
		return 0;
	return tc_buf_alloc_order(p, b, bytes, 0);
}

/*
 * A bio over @len bytes of @b from offset @off.  When the bio runs out of
 * vectors it covers less; @len is updated to what it covers.
 */
struct bio *tc_buf_bio(struct tc_cache *c, struct tc_buf *b, size_t off,
		       size_t *len, struct block_device *bdev, sector_t sector,
		       blk_opf_t opf)
{
	unsigned int first = off / b->chunk_bytes;
	unsigned int last = (off + *len - 1) / b->chunk_bytes;
	unsigned short nr_vecs = min_t(unsigned int, last - first + 1,
				       BIO_MAX_VECS);
	size_t done = 0;
	struct bio *bio;

	bio = bio_alloc_bioset(bdev, nr_vecs, opf, GFP_NOIO, &c->bs);
	bio->bi_iter.bi_sector = sector;
	while (done < *len) {
		size_t pos = off + done;
		unsigned int in = pos % b->chunk_bytes;
		unsigned int piece = min_t(size_t, *len - done,
					   b->chunk_bytes - in);
		struct page *pg = nth_page(b->chunks[pos / b->chunk_bytes],
					   in >> PAGE_SHIFT);

		if (bio_add_page(bio, pg, piece, offset_in_page(in)) != piece)
			break;
		done += piece;
	}
	*len = done;
	return bio;
}

/* Copy between @b from offset @off and the data pages of @bio. */
static void tc_buf_copy(struct tc_buf *b, size_t off, struct bio *bio,
			bool to_bio)
{
	struct bvec_iter iter;
	struct bio_vec bv;

	bio_for_each_segment(bv, bio, iter) {
		unsigned int done = 0;

		while (done < bv.bv_len) {
			size_t pos = off + done;
			unsigned int in = pos % b->chunk_bytes;
			unsigned int piece = min_t(size_t, bv.bv_len - done,
						   b->chunk_bytes - in);
			u8 *p = (u8 *)page_address(b->chunks[pos / b->chunk_bytes]) +
				in;

			if (to_bio)
				memcpy_to_page(bv.bv_page, bv.bv_offset + done,
					       p, piece);
			else
				memcpy_from_page(p, bv.bv_page,
						 bv.bv_offset + done, piece);
			done += piece;
		}
		off += bv.bv_len;
	}
}

/* Copy the start of @b into the data pages of @bio. */
void tc_buf_copy_to_bio(struct tc_buf *b, struct bio *bio)
{
	tc_buf_copy(b, 0, bio, true);
}

/* Copy the data of @bio into @b at offset @off. */
void tc_buf_copy_from_bio(struct tc_buf *b, size_t off, struct bio *bio)
{
	tc_buf_copy(b, off, bio, false);
}
